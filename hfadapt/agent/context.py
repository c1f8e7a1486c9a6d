"""What the prompts are made of: the device rules rendered from the profile, the adapter API,
bundled adapters as examples, and for one failure its fingerprint, evidence and source."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from hfadapt.agent.cases import FailureCase, target_source
from hfadapt.agent.policy import describe_policy
from hfadapt.agent.prompts import render
from hfadapt.options import Execution
from hfadapt.spyre.profile import Profile, load_profile

EXAMPLE_FILES = ("activations.py", "rms_norm.py", "layer_norm.py")
EXAMPLES_MAX_CHARS = 9000


def device_rules(profile: Profile) -> str:
    """Every rule of the profile as one line: id, outcome, modes, ops, note."""
    lines = [
        "Op outcomes (native = runs on the device; fallback = runs on the host, allowed but "
        "slow; unsupported = the model does not lower). Ops are ATen overloads:"
    ]
    for rule in profile.rules.values():
        modes = (
            "" if set(rule.modes) == set(Execution.choices()) else f", {'/'.join(rule.modes)} only"
        )
        ops = ", ".join(o.removeprefix("aten::") for o in rule.ops)
        note = f" ({rule.note})" if rule.note else ""
        lines.append(f"- `{rule.id}` {rule.outcome}{modes}: {ops}{note}")
    lines.append("- `op.unsupported`: every op not listed above.")
    lines.append(
        f"- `{profile.fp32_rule}`: only these ops may take float32 inputs: "
        + ", ".join(o.removeprefix("aten::") for o in sorted(profile.fp32_ops))
        + ". Any other op on float32 fails."
    )
    casts = ", ".join(f"{a}->{b}" for a, b in sorted(profile.allowed_casts))
    lines.append(
        f"- `{profile.cast_rule}`: on-device casts allowed only for {casts}; do other casts on the host (`.cpu()`, cast, `.to(device)`)."
    )
    for key, spec in profile.dtypes.items():
        if spec.get("storage") is None:
            lines.append(f"- `{spec['rule']}`: {key} is not supported on the device.")
    lines.append("Layout:")
    for key, spec in profile.layout.items():
        text = spec.get("text", "")
        value = f" = {spec['value']}" if "value" in spec else ""
        lines.append(f"- `{spec.get('rule', key)}` {key}{value}" + (f": {text}" if text else ""))
    lines.append("Numerics:")
    for key, spec in profile.numerics.items():
        lines.append(f"- `{spec.get('rule', key)}` {key}: {spec.get('note', '')}")
    return "\n".join(lines)


def adapter_api() -> str:
    from hfadapt.adapters import api

    signature = inspect.signature(api.adapter)
    doc = inspect.getdoc(api.Adapter) or ""
    return (
        "```python\nfrom hfadapt.adapters.api import adapter\n\n"
        f"@adapter{signature}\n```\n\n{doc}\n\n"
        'Write `target` as `"package.module:Class.method"`. `rule` is the device rule id the '
        "adapter works around. hfadapt applies the adapter to matching module instances only "
        "when the model runs on the device, so CPU runs stay stock. You need not give "
        "`example=` or `provenance=`: hfadapt builds the proof inputs and records provenance."
    )


def examples(folder: Path | None = None, names: tuple[str, ...] = EXAMPLE_FILES) -> str:
    from hfadapt.adapters.registry import bundled_dir

    root = folder or bundled_dir()
    parts: list[str] = []
    used = 0
    for name in names:
        path = root / name
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8").strip()
        if used + len(text) > EXAMPLES_MAX_CHARS:
            break
        used += len(text)
        parts.append(f"`{name}`:\n\n```python\n{text}\n```")
    return "\n\n".join(parts) or "(no bundled adapters found)"


def system_prompt(profile: str | None = None, prompts: Path | None = None) -> str:
    prof = load_profile(profile)
    return render(
        "system",
        prompts,
        profile_name=prof.describe(),
        device_rules=device_rules(prof),
        adapter_api=adapter_api(),
        policy=describe_policy(),
        examples=examples(),
    )


def task_prompt(case: FailureCase, prompts: Path | None = None) -> str:
    prof = load_profile(case.profile)
    if case.target:
        instructions = (
            f'Replace `{case.target}`: use `target="{case.target}"` and `rule="{case.rule_id}"`.'
        )
    else:
        instructions = (
            "The failing line is in a module-level function, which cannot be patched by itself: "
            "target the method of the model class that calls it (`package.module:Class.method`)."
        )
    source = target_source(case.target)
    shown = (
        f"The method to replace, `{case.target}`:\n\n```python\n{source.rstrip()}\n```"
        if source and source.strip() != case.enclosing_source.strip()
        else "(The enclosing function above is the method to replace.)"
    )
    return render(
        "task",
        prompts,
        fingerprint=case.fingerprint,
        rule_id=case.rule_id,
        rule_source=prof.rule_source(case.rule_id) or "hfadapt",
        op=case.op,
        dtype=case.dtype or "n/a",
        location=case.location or "unknown",
        device_error=case.message,
        evidence=json.dumps(case.evidence, indent=2, sort_keys=True, default=str),
        target_instructions=instructions,
        enclosing_source=(
            case.enclosing_source or case.code_line or "(source not available)"
        ).rstrip(),
        target_source=shown,
    )


def repair_prompt(
    *,
    attempt: int,
    max_attempts: int,
    previous_draft: str,
    failed_step: str,
    failure: str,
    prompts: Path | None = None,
) -> str:
    return render(
        "repair",
        prompts,
        attempt=attempt,
        max_attempts=max_attempts,
        previous_draft=previous_draft.rstrip() or "(the answer held no code)",
        failed_step=failed_step,
        failure=failure,
    )
