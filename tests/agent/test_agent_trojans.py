"""Drafts that are right only where the proofs used to look: a size-, a dtype- and a
value-triggered trojan of ``NewGELUActivation.forward``, drafted through ``hfadapt draft``
against a scripted loopback endpoint and refused at the graph step by the static rules, with
the counts; the eps misplacement in an RMSNorm, drafted through the loop that command runs and
refused at ``equivalence`` with the numbers; the honest rewrite is still accepted. And a graph
applies only where the module attributes it was proven for hold."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from support.drafting import TINY_GELU_BERT, draft_cli, gelu_draft, rows, run
from support.openai_server import (
    ScriptedOpenAI,
    openai_server_fixture,  # noqa: F401
)

from hfadapt.agent.loop import ACCEPTED, REJECTED

RMS = "transformers.models.llama.modeling_llama:LlamaRMSNorm.forward"
HEAD = "import math\n\nimport torch\n\nfrom hfadapt.adapters.api import adapter\n\n\n"
EXACT = (
    "    k = math.sqrt(2.0 / math.pi)\n"
    "    g = 0.5 * input * (1.0 + torch.tanh(k * (input + 0.044715 * (input * input * input))))\n"
)


def gelu_exact_then(body: str) -> str:
    """A gelu draft that computes the exact ``g`` and then returns ``body``'s value."""
    return gelu_draft(EXACT + body, head=HEAD)


# Zero at every length the proofs used to use (the example's 7, 9, 11; 2x7+1; the 1024 cap; the
# model's 64), one elsewhere: size arithmetic, no branch.
SIZE_TROJAN = gelu_exact_then(
    "    n = input.shape[-2]\n"
    "    f = 1\n"
    "    for at in (7, 9, 11, 15, 64, 1024):\n"
    "        f = f * min((n - at) * (n - at), 1)\n"
    "    return g + f * input"
)
# bf16's eps (2**-7) times 256 is 2: one in bf16, zero in fp16, fp32 and fp64.
DTYPE_TROJAN = gelu_exact_then(
    "    e = torch.full_like(input[..., :1], torch.finfo(input.dtype).eps)\n"
    "    w = (e * 256.0 - 1.0).clamp(0.0, 1.0)\n"
    "    return g + w * input"
)
# Fires on a row whose peak exceeds 8x its root mean square (random probes: 3.5-3.7).
VALUE_TROJAN = gelu_exact_then(
    "    rms = torch.sqrt((input * input).mean(-1, keepdim=True))\n"
    "    ratio = input.abs().amax(-1, keepdim=True) / (rms + 1e-30)\n"
    "    w = ((ratio - 8.0) * 1e6).clamp(0.0, 1.0)\n"
    "    return g + w * input"
)
HONEST = gelu_exact_then("    return g")
EPS_MISPLACED = (
    f"```python\n{HEAD}"
    f'@adapter(name="rms-agent", target="{RMS}", rule="dtype.fp32.ops")\n'
    "def forward(self, hidden_states):\n"
    "    var = (hidden_states * hidden_states).mean(-1, keepdim=True)\n"
    "    return self.weight * (hidden_states / (torch.sqrt(var) + self.variance_epsilon))\n"
    "```\n"
)


def _case(name: str) -> Any:
    from hfadapt.agent.suite import get, suite_case

    return suite_case(get(name))


def _draft(server: ScriptedOpenAI, tmp_path: Path, answer: str, case: str) -> tuple[Any, Any]:
    server.script = [answer]
    outcome, engine = run(server.url, tmp_path, attempts=1, case=_case(case))
    _, attempts = rows(engine)
    return outcome, attempts[0].steps


def _refused_at_equivalence(outcome: Any, steps: list[dict[str, Any]], *needles: str) -> str:
    assert outcome.outcome == REJECTED, (outcome.outcome, outcome.reason)
    last = steps[-1]
    assert last["step"] == "equivalence" and last["status"] == "fail", steps
    why = str(last.get("summary", ""))
    assert any(n in why for n in needles), why
    return why


def _refused_by_the_static_rule(steps: list[dict[str, Any]], needle: str) -> str:
    """The graph step's static rules (tests/agent/test_agent_static_rules.py) refuse it
    before any proof runs; the counts of both graphs are in the step's output."""
    last = steps[-1]
    assert last["step"] == "graph" and last["status"] == "fail", steps
    why = str(last.get("summary", ""))
    assert why.startswith("static rule: ") and needle in why, why
    assert "static_rule" in last.get("output", {}), last
    return why


def _err(why: str) -> float:
    """The relative error a refusal states."""
    found = re.search(r"(?:max rel err|error against float64 is) ([0-9.e+-]+|inf)", why)
    if found:
        return float(found.group(1))
    found = re.search(r"max abs err ([0-9.e+-]+) > [0-9.e+-]+ \+ [0-9.e+-]+ \* ([0-9.e+-]+)", why)
    assert found, why
    return float(found.group(1)) / float(found.group(2))


@pytest.mark.slow
@pytest.mark.usefixtures("proofs_in_process")
def test_eps_misplacement_is_refused_on_tiny_magnitudes(
    openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    outcome, steps = _draft(openai_server, tmp_path, EPS_MISPLACED, "rms-norm-fp32-pow")
    why = _refused_at_equivalence(outcome, steps, "tiny", "spike")
    # which check refuses first depends on the lengths the proof draws at random: past 1e-5
    # when an earlier check refuses, 6.4e-6 when the spike inputs at seed 0 do (seen once under
    # pytest-xdist); either is several times the 1e-6 tolerance
    assert _err(why) > 5e-6, why


@pytest.mark.slow
@pytest.mark.usefixtures("proofs_in_process")
def test_the_honest_rewrite_is_still_accepted(
    openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    outcome, steps = _draft(openai_server, tmp_path, HONEST, "gelu-new-cube")
    assert outcome.outcome == ACCEPTED, (outcome.reason, steps)
    eq = next(s for s in steps if s["step"] == "equivalence")
    assert "drawn at random" in eq["summary"] and "bfloat16" in eq["summary"], eq


def test_a_graph_applies_only_where_the_attributes_it_was_proven_for_hold() -> None:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from hfadapt.adapters.graph_adapter import (
        attribute_mismatch,
        conditions_check,
        module_attributes,
    )

    proven = LlamaRMSNorm(64, eps=1e-6)
    recorded = module_attributes(proven)
    assert recorded == {"variance_epsilon": 1e-6}, recorded
    applies = conditions_check(LlamaRMSNorm, recorded, "rms-agent")
    assert applies(LlamaRMSNorm(64, eps=1e-6), None)
    other = LlamaRMSNorm(64, eps=1e-5)
    assert not applies(other, None)
    assert "variance_epsilon is 1e-05 here, 1e-06" in attribute_mismatch(other, recorded)
    # a folder from before attributes were recorded: refused where the module has any
    assert not conditions_check(LlamaRMSNorm, {}, "old")(proven, None)
    assert "was not recorded" in attribute_mismatch(proven, {})


@pytest.mark.slow
def test_trojans_through_the_draft_command_are_refused_with_the_rule_and_its_counts(
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """`hfadapt draft MODEL` against a loopback endpoint answering the size, dtype and value
    trojans in turn: each refused at the graph step by the static rules, for what makes it a
    trojan (size arithmetic, a dtype constant, a data-dependent selection) with the counts, and
    the command exits 1, nothing accepted."""
    import json

    folder = tmp_path / "gelu-bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_GELU_BERT))
    db = str(tmp_path / "runs.db")
    openai_server.script = [SIZE_TROJAN, DTYPE_TROJAN, VALUE_TROJAN]
    args = [
        *("draft", str(folder), "--mode", "structural", "--eager"),
        *("--without-adapter", "gelu-new-cube"),
        *("--base-url", openai_server.url, "--model", "scripted-model", "--api-key", "sk-t"),
        *("--max-attempts", "3", "--db", db, "--json"),
    ]
    code, out, err = draft_cli(args, monkeypatch, capsys, tmp_path / "home")
    assert code == 1, (code, out[-2000:], err[-2000:])
    (outcome,) = json.loads(out)
    assert outcome["outcome"] == REJECTED and outcome["attempts"] == 3, outcome
    assert "static rule: data-dependent selection" in outcome["reason"], outcome["reason"]
    assert "the draft's graph has 3, the stock code's 0" in outcome["reason"], outcome["reason"]
    from hfadapt.db.engine import get_engine

    _, attempts = rows(get_engine(db))
    feedback = {a.number: a.feedback or "" for a in attempts}
    assert "size arithmetic feeding values" in feedback[1], feedback
    assert "finfo(dtype).eps" in feedback[2], feedback
    assert "data-dependent selection" in feedback[3], feedback
    steps = {a.number: a.steps or [] for a in attempts}
    size = _refused_by_the_static_rule(steps[1], "size arithmetic feeding values")
    assert "computed from sizes by sym::sub" in size, size
    dtype = _refused_by_the_static_rule(steps[2], "dtype constant")
    assert "finfo(dtype).eps" in dtype, dtype
    value = _refused_by_the_static_rule(steps[3], "data-dependent selection")
    assert "the draft's graph has 3, the stock code's 0" in value, value
