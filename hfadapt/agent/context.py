"""What the prompts are made of: the device rules rendered from the profile, the adapter API,
bundled adapters as examples, and for one failure its fingerprint, evidence and source."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from hfadapt.agent.cases import FailureCase, target_source
from hfadapt.agent.defect_cases import DEFECT_MATCH
from hfadapt.agent.policy import describe_policy
from hfadapt.agent.prompts import render
from hfadapt.options import Execution
from hfadapt.spyre.rules.profile import Profile, load_profile

EXAMPLE_FILES = ("activations.py", "rms_norm.py", "layer_norm.py")
EXAMPLES_MAX_CHARS = 9000
HELPERS_MAX_CHARS = 6000
ATTRIBUTES_MAX_CHARS = 2500
ATTRIBUTE_REPR_CHARS = 160
HISTORY_MAX_CHARS = 12000


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


def host_rule() -> str:
    """What the device step demands of where a graph's arithmetic runs (graph_proof)."""
    return (
        "Work on the host (tensors made without `device=`, `.cpu()`, a cast before the upload) "
        "is allowed and runs between device graphs, but at least one arithmetic op of your "
        "graph must run on the device: a graph whose every arithmetic op runs on the host is a "
        "CPU fallback and is refused. Build masks, tables and permutations on the host, send "
        "them over with `.to(x.device)`, and compute on the call's tensors on the device."
    )


def helpers_source(target: str | None, budget: int = HELPERS_MAX_CHARS) -> str:
    """The source of the functions and methods the target calls (global names it reads,
    ``self.name(...)`` calls), bounded by ``budget`` characters, the rest named."""
    import ast
    import pkgutil
    import textwrap

    from hfadapt.adapters.rebind import globals_read

    if not target:
        return "(no target)"
    try:
        fn = pkgutil.resolve_name(target)
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (ImportError, AttributeError, OSError, TypeError, SyntaxError):
        return "(the target's source is not available)"
    found: dict[str, object] = {}
    space = getattr(fn, "__globals__", {})
    for name in sorted(globals_read(fn)):
        value = space.get(name)
        if inspect.isfunction(value) and not value.__module__.startswith("torch"):
            found[name] = value
    owner = pkgutil.resolve_name(target.rpartition(".")[0]) if "." in target.split(":")[1] else None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
            and owner is not None
        ):
            method = inspect.getattr_static(owner, node.func.attr, None)
            if inspect.isfunction(method):
                found[f"self.{node.func.attr}"] = method
    return _bounded_sources(found, budget)


def _bounded_sources(found: dict[str, object], budget: int) -> str:
    parts: list[str] = []
    left_out: list[str] = []
    used = 0
    for name, obj in found.items():
        try:
            text = inspect.getsource(obj).rstrip()  # type: ignore[arg-type]
        except (OSError, TypeError):
            continue
        if used + len(text) > budget:
            left_out.append(name)
            continue
        used += len(text)
        parts.append(f"`{name}`:\n\n```python\n{text}\n```")
    if left_out:
        parts.append(f"(not shown, over {budget} characters: {', '.join(left_out)})")
    return "\n\n".join(parts) or "(the method calls no helper of its own module)"


def attribute_values(case: FailureCase, budget: int = ATTRIBUTES_MAX_CHARS) -> str:
    """``self.<name>`` reads of the target's source with their values on the case's module
    (reprs truncated), one line each."""
    import ast
    import pkgutil
    import textwrap

    from hfadapt.agent.cases import captured_example

    source = target_source(case.target)
    try:
        tree = ast.parse(textwrap.dedent(source)) if source else None
        if case.example:
            module = pkgutil.resolve_name(case.example)(0)[0]
        elif case.example_file:
            module = captured_example(case.example_file)(0)[0]
        else:
            module = None
    except Exception as exc:  # the prompt says why rather than failing the session
        return f"(the module's attributes are not available: {type(exc).__name__})"
    if tree is None or module is None:
        return "(the module's attributes are not available)"
    names = sorted(
        {
            n.attr
            for n in ast.walk(tree)
            if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name)
            and n.value.id == "self"
        }
    )
    lines: list[str] = []
    for name in names:
        value = getattr(module, name, None)
        if inspect.ismethod(value):
            continue
        text = " ".join(repr(value).split())
        lines.append(f"- `self.{name}` = {text[:ATTRIBUTE_REPR_CHARS]}")
    text = "\n".join(lines) or "(the method reads no attribute of self)"
    return text if len(text) <= budget else text[: budget - 3] + "..."


def taken_names_text(taken: dict[str, str] | None) -> str:
    names = sorted(taken or {})
    return ", ".join(f"`{n}`" for n in names) if names else "(none)"


def examples(
    folder: Path | None = None, names: tuple[str, ...] = EXAMPLE_FILES, *, leave_out: str = ""
) -> str:
    """The policy-abiding example drafts of ``prompts/examples.md`` but those whose target is
    ``leave_out`` (the case's own: an example for it would be its solution); with ``folder``,
    the named bundled adapter files there."""
    if folder is None:
        from hfadapt.agent.prompts import load_template

        return without_examples_for(load_template("examples"), leave_out).strip()
    root = folder
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


def without_examples_for(text: str, target: str) -> str:
    """``text`` (examples.md) without the examples whose ``target="..."`` is ``target``: each
    example is the paragraph before its fenced block, and the block."""
    if not target:
        return text
    import re

    out, kept_from = [], 0
    for block in re.finditer(r"```python\n.*?```\n?", text, re.S):
        if f'target="{target}"' not in block.group(0):
            continue
        start = text.rfind("\n\n", kept_from, block.start() - 2)
        start = kept_from if start < 0 else start + 2
        out.append(text[kept_from:start])
        kept_from = block.end()
    out.append(text[kept_from:])
    return re.sub(r"\n{3,}", "\n\n", "".join(out))


def system_prompt(
    profile: str | None = None, prompts: Path | None = None, *, target: str | None = None
) -> str:
    """The system prompt; ``target``: the case's, whose examples are left out."""
    prof = load_profile(profile)
    return render(
        "system",
        prompts,
        profile_name=prof.describe(),
        device_rules=device_rules(prof),
        adapter_api=adapter_api(),
        policy=describe_policy(),
        host_rule=host_rule(),
        examples=examples(leave_out=target or ""),
    )


def task_prompt(
    case: FailureCase, prompts: Path | None = None, taken: dict[str, str] | None = None
) -> str:
    """The failure, the code to replace, what it calls and reads, how it will be judged
    (``case.execution``) and the adapter names ``taken``."""
    prof = load_profile(case.profile)
    rule_source = prof.rule_source(case.rule_id) or "hfadapt"
    if case.target:
        instructions = (
            f'Replace `{case.target}`: use `target="{case.target}"` and `rule="{case.rule_id}"`.'
            f" {SIGNATURE_TEXT.get(case.kind, SIGNATURE_TEXT['method'])}"
        )
        if case.match == DEFECT_MATCH:
            defect = case.evidence.get("defect") or {}
            rule_source = str(defect.get("source") or rule_source)
            instructions += " " + defect_instructions(case)
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
        rule_source=rule_source,
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
        execution=EXECUTION_TEXT.get(case.execution, case.execution),
        helpers=helpers_source(case.target),
        attributes=attribute_values(case),
        taken_names=taken_names_text(taken),
    )


SIGNATURE_TEXT = {
    "method": "Keep its signature: `self` first, then the method's own parameters.",
    "staticmethod": "It is a staticmethod: keep its own signature, with no `self` (do not add "
    "one), and do not decorate your function with @staticmethod.",
    "classmethod": "It is a classmethod: keep its signature, `cls` first (the class), and do "
    "not decorate your function with @classmethod.",
    "function": "It is a module-level function: keep its own signature (the same parameters, "
    "no `self`); hfadapt applies your graph where the model's code calls it.",
}


def defect_instructions(case: FailureCase) -> str:
    """What a silent device defect's draft is judged on: no error to remove, a defect that must
    stop firing where the case found it, and a model that must get better."""
    where = (
        ", ".join(sorted({str(f.get("module")) for f in case.evidence.get("firings") or []}))
        or "the model"
    )
    module = case.evidence.get("module") or "the module"
    misread = case.evidence.get("output_misread")
    what = f"reading the output of `{misread}`, in `{module}`" if misread else f"in `{module}`"
    return (
        f"Nothing raised: the defect `{case.rule_id}` fired silently in {where}, {what}, whose "
        "`forward` you rewrite. Your draft is accepted when, with it, the "
        "compiled model on the device no longer fires the defect there (nothing new fires or "
        "fails) and its outputs get closer to the CPU reference; the same function in real "
        "arithmetic, as always."
    )


EXECUTION_TEXT = {
    "compile": "compiled (torch.compile with the spyre backend): compile-only native ops "
    "lower, and a graph break is a handoff between device graphs",
    "eager": "eager: every ATen op is judged one by one; compile-only ops are refused",
}


def repair_prompt(
    *,
    attempt: int,
    max_attempts: int,
    previous_draft: str,
    failed_step: str,
    failure: str,
    history: list[tuple[int, str, str, str]] | None = None,
    prompts: Path | None = None,
    budget: int = HISTORY_MAX_CHARS,
) -> str:
    """The last draft and its refusal, and every earlier one (``history``: attempt, step,
    failure, draft, oldest first) within ``budget`` characters, the oldest elided first."""
    return render(
        "repair",
        prompts,
        attempt=attempt,
        max_attempts=max_attempts,
        previous_draft=previous_draft.rstrip() or "(the answer held no code)",
        failed_step=failed_step,
        failure=failure,
        history=repair_history(history or [], budget),
    )


def repair_history(history: list[tuple[int, str, str, str]], budget: int) -> str:
    blocks = [
        f"Attempt {n} failed at `{step}`:\n\n```\n{why}\n```\n\n```python\n"
        f"{(draft.rstrip() or '(the answer held no code)')}\n```"
        for n, step, why, draft in history
    ]
    kept: list[str] = []
    used = 0
    for block in reversed(blocks):
        if used + len(block) > budget:
            break
        kept.insert(0, block)
        used += len(block)
    if not blocks:
        return "(this was the first attempt)"
    elided = len(blocks) - len(kept)
    note = (
        [f"({elided} older attempt(s) elided: over {budget} characters of history)"]
        if elided
        else []
    )
    return "\n\n".join(note + kept)
