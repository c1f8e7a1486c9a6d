"""Prompt templates (strict placeholders), the prompts built from the profile and a failure,
and getting the code out of an answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.drafting import softsign_case

from hfadapt.agent.context import repair_prompt, system_prompt, task_prompt
from hfadapt.agent.extract import extract_code
from hfadapt.agent.prompts import placeholders, prompts_dir, render, render_text
from hfadapt.errors import DraftError, PromptError


def test_missing_unused_and_empty_values_are_errors() -> None:
    with pytest.raises(PromptError, match=r"no value .* for b"):
        render_text("{{ a }} and {{b}}", {"a": 1}, name="t")
    with pytest.raises(PromptError, match="c match no placeholder"):
        render_text("{{ a }}", {"a": 1, "c": 2}, name="t")
    with pytest.raises(PromptError, match="empty"):
        render_text("{{ a }}", {"a": "  "}, name="t")


def test_values_are_inserted_verbatim_once() -> None:
    assert render_text("x={{ a }}", {"a": "{{ b }} {x}"}) == "x={{ b }} {x}"


def test_the_template_files_and_their_placeholders() -> None:
    folder = prompts_dir()
    assert folder == Path(__file__).resolve().parents[2] / "prompts"
    names = {p.stem: placeholders(p.read_text()) for p in folder.glob("*.md")}
    assert set(names) >= {"system", "task", "repair"}
    assert set(names["system"]) == {
        "profile_name",
        "device_rules",
        "adapter_api",
        "policy",
        "host_rule",
        "examples",
    }
    assert {"fingerprint", "device_error", "enclosing_source", "evidence"} <= set(names["task"])
    assert set(names["repair"]) == {
        "attempt",
        "max_attempts",
        "previous_draft",
        "failed_step",
        "failure",
        "history",
    }
    with pytest.raises(PromptError, match="cannot be read"):
        render("nonexistent", folder)


def test_system_prompt_holds_the_device_rules_api_policy_and_examples() -> None:
    text = system_prompt()
    for needle in (
        "op.pow.square",
        "dtype.fp32.ops",
        "layout.stick_slice",
        "@adapter(",
        "try/except",
        "gelu-new-cube",
    ):
        assert needle in text, needle
    assert "{{" not in text


def test_task_and_repair_prompts() -> None:
    case = softsign_case()
    case.enclosing_source = "def forward(self, x):\n    return x * torch.pow(1.0 + x.abs(), -1.0)"
    text = task_prompt(case)
    assert (
        case.fingerprint in text
        and case.message in text
        and "torch.pow(1.0 + x.abs(), -1.0)" in text
    )
    assert f'target="{case.target}"' in text
    rep = repair_prompt(
        attempt=1, max_attempts=3, previous_draft="", failed_step="extract", failure="no code"
    )
    assert "(the answer held no code)" in rep and "attempt 1 of 3" in rep


def test_extract_code() -> None:
    block = "```python\nfrom hfadapt.adapters.api import adapter\n@adapter(name='a')\ndef f(self, x):\n    return x\n```"
    assert extract_code("Here it is:\n" + block + "\nDone.").startswith("from hfadapt.adapters.api")
    # the same draft twice (a comment apart) is one draft: the first copy, as written
    again = block.replace("return x", "return x  # same")
    first = extract_code(block + "\nsame again:\n" + again)
    assert first.endswith("    return x\n") and "# same" not in first, first
    usage = "\nUse it like:\n```python\nmodel(x)\n```"
    assert "@adapter" in extract_code(block + usage)  # a usage snippet is not a second draft
    with pytest.raises(DraftError, match="no ```python code block"):
        extract_code("I would use x*x*x.")
    with pytest.raises(DraftError, match="2 different code blocks"):
        extract_code(block + "\n" + block.replace("return x", "return -x"))


def test_the_task_prompt_tells_the_execution_helpers_attributes_and_taken_names() -> None:
    """For real cases: RoPE's apply calls a module-level helper (its source is shown), an
    RMSNorm reads ``self.variance_epsilon`` and ``self.weight`` (their values are shown)."""
    import dataclasses

    base = softsign_case()
    rotary = dataclasses.replace(
        base,
        target="hfadapt.agent.evalcases:RotaryApply.forward",
        example="hfadapt.agent.evalcases:rotary_example",
        execution="compile",
    )
    text = task_prompt(rotary, taken={"gelu-new-cube": "bundled", "rms-norm-square-llama": "b"})
    assert "judged, compiled (torch.compile" in text, text[:400]
    assert "`rotate_half`:" in text and "torch.cat((-x[..., half:]" in text, text[-2500:]
    assert "Adapter names already taken (choose another)\n\n`gelu-new-cube`, `rms-norm" in text
    rms = dataclasses.replace(
        base,
        target="transformers.models.llama.modeling_llama:LlamaRMSNorm.forward",
        example="hfadapt.agent.evalcases:rms_norm_example",
        execution="eager",
    )
    text = task_prompt(rms)
    assert "judged, eager" in text and "`self.variance_epsilon` = 1e-06" in text, text[-1500:]
    assert "`self.weight` = Parameter containing: tensor([" in text, text[-1500:]
    assert "(none)" in text  # no taken names given


def test_the_system_prompt_states_the_host_rule_and_its_examples_obey_the_policy() -> None:
    import re

    from hfadapt.agent.policy import check_policy

    text = system_prompt()
    assert "at least one arithmetic op of your graph must run on the device" in text
    blocks = []
    for path in sorted(prompts_dir().glob("*.md")):
        found = re.findall(r"```python\n(.*?)```", path.read_text(), re.S)
        blocks += [b for b in found if "{{" not in b]  # a template's slot for a draft
    assert len(blocks) >= 3, len(blocks)
    for block in blocks:
        assert block.strip() in text, block[:200]
        result = check_policy(block)
        assert result.ok, (block[:300], result.problems)


def test_the_repair_prompt_carries_the_whole_history_within_a_budget() -> None:
    history = [(n, "equivalence", f"refusal number {n}", f"draft_{n} = {n}") for n in (1, 2, 3)]
    rep = repair_prompt(
        attempt=4,
        max_attempts=5,
        previous_draft="draft_4 = 4",
        failed_step="graph",
        failure="static rule: ...",
        history=history,
    )
    for n in (1, 2, 3):
        assert f"Attempt {n} failed at `equivalence`" in rep and f"draft_{n} = {n}" in rep, rep
    assert "elided" not in rep and "draft_4 = 4" in rep
    short = repair_prompt(
        attempt=4,
        max_attempts=5,
        previous_draft="draft_4 = 4",
        failed_step="graph",
        failure="x",
        history=history,
        budget=120,
    )
    assert "(2 older attempt(s) elided: over 120 characters of history)" in short, short
    assert "draft_3 = 3" in short and "draft_1 = 1" not in short, short
