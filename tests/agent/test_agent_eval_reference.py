"""agent-eval's scores: per case accepted, attempts, tokens and a score for an agent run; for
``--reference``, each reference answer through the whole pipeline with the step that refused
and the numbers; pending cases reported with their reason, never scored."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli
from support.drafting import ReferenceEval
from support.openai_server import (
    ScriptedOpenAI,
    openai_server_fixture,  # noqa: F401
)

from hfadapt.agent.evaluate import EvalReport, score
from hfadapt.agent.suite import PENDING, SUITE, get


def fenced(code: str) -> str:
    return f"```python\n{code}```\n"


def test_score_counts_attempts() -> None:
    assert [score("accepted", n, 4) for n in (1, 2, 4)] == [1.0, 0.75, 0.25]
    assert score("rejected", 1, 4) == 0.0 and score("accepted", 0, 4) == 0.0
    report = EvalReport("e", "m")
    report.rows = [
        {"case": "a", "outcome": "accepted", "score": 0.5, "attempts": 2, "tokens_in": 10,
         "tokens_out": 4, "pending": None},
        {"case": "b", "outcome": "pending", "score": 0.0, "attempts": 0, "tokens_in": 0,
         "tokens_out": 0, "pending": "not yet"},
    ]  # fmt: skip
    data = report.to_dict()
    assert (data["accepted"], data["total"], data["score"], data["pending"]) == (1, 1, 0.5, ["b"])


def test_every_kind_of_case_is_in_the_scored_suite(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No case is pending: the staticmethod, the module-level function and the silent defect
    are scored, and so are gelu_new and RMSNorm (their examples are left out of their own
    prompts); --list-cases lists every one."""
    assert PENDING == ()
    kinds = {c.kind for c in SUITE} | {c.match for c in SUITE}
    assert {"staticmethod", "function", "defect"} <= kinds, kinds
    code, out, err = run_cli(["agent-eval", "--list-cases", "--json"], monkeypatch, capsys)
    assert code == 0, err
    listed = {c["case"] for c in json.loads(out)}
    want = {c.name for c in SUITE}
    assert listed == want and {"gelu-new-cube", "minilm-post-ln-handoff"} <= listed, listed


@pytest.mark.slow
@pytest.mark.usefixtures("proofs_in_process")
def test_an_agent_run_is_scored_per_case(
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """Accepted at the second of two attempts: score 0.5, both attempts' tokens counted."""
    softsign = get("softsign-pow-reciprocal")
    openai_server.script = ["No code from me.", fenced(softsign.reference)]
    args = ["agent-eval", "--base-url", openai_server.url, "--model", "m", "--api-key", "k"]
    args += ["--max-attempts", "2", "--case", softsign.name, "--json"]
    code, out, err = run_cli([*args, "--db", str(tmp_path / "e.db")], monkeypatch, capsys)
    assert code == 0, err
    data = json.loads(out)
    (row,) = data["cases"]
    got = (row["outcome"], row["attempts"], row["score"], row["tokens_in"], row["tokens_out"])
    assert got == ("accepted", 2, 0.5, 2 * 1200, 2 * 300), row
    assert row["solution_in_prompt"] is None and row["refused_at"] is None, row
    assert data["score"] == 0.5 and data["pending"] == [], data
    assert row["numbers"]["equivalence_max_rel_err"] <= 1e-6, row["numbers"]


@pytest.mark.slow
def test_reference_answers_of_the_held_out_cases(reference_eval: ReferenceEval) -> None:
    """The correct draft on a model the device already gets wrong, and the exact rewrite through
    a compile-only op (judged compiled): accepted, with their numbers (in the session's one
    reference run, tests/agent/conftest.py)."""
    names = ["softsign-corrupted-baseline", "erf-gelu-compiled"]
    rows = {n: reference_eval.row(n) for n in names}
    assert all(r["outcome"] == "accepted" for r in rows.values()), {
        n: (r["outcome"], r["refused_at"], r["reason"]) for n, r in rows.items()
    }
    broken = rows["softsign-corrupted-baseline"]["numbers"]
    # the model without the draft is wrong on the device; the draft adds nothing to that
    assert broken["baseline_min_token_cosine"] < 0.99, broken
    assert broken["device_min_token_cosine"] >= broken["baseline_min_token_cosine"] - 0.01, broken
    compiled = rows["erf-gelu-compiled"]
    assert compiled["execution"] == "compile" and compiled["score"] == 1.0, compiled
    for name, row in rows.items():
        n = row["numbers"]
        assert n["equivalence_max_rel_err"] <= 1e-6 and n["module_min_cosine"] >= 0.99, (name, n)


def _attention_error(fn: object, profile: object, seed: int = 0) -> tuple[float, float, list[str]]:
    """(min row cosine, relative error, violations) of ``fn(None, q, k, v)`` on the eager
    device in fp16 against float64 SDPA, at the head-dim-padding case's module example."""
    import torch
    import torch.nn.functional as F

    from hfadapt.agent.evalcases import small_head_example
    from hfadapt.spyre.rules.tracking import tracking

    _, qkv, _ = small_head_example(seed)
    ref = F.scaled_dot_product_attention(*qkv)
    with tracking(profile, mode="eager", collect=True) as report, torch.no_grad():
        out = fn(None, *(t.half().to("spyre") for t in qkv)).cpu().double()  # type: ignore[operator]
    a, b = ref.reshape(-1, ref.shape[-1]), out.reshape(-1, out.shape[-1])
    cos = float(((a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))).min())
    rel = float((b - a).norm() / a.norm())
    return cos, rel, [f"{v.rule_id} {v.message}" for v in report.violations]


@pytest.mark.slow
def test_the_proof_childrens_library_messages_are_held_and_counted_like_the_parents(
    reference_eval: ReferenceEval,
) -> None:
    """The proofs run in child processes that write to the command's standard error. The
    device's warnings there (fallbacks, int64 downcasts, graph breaks of the end-to-end runs)
    are held back as the command's own are: the quiet run's standard error is the one summary
    line (before, 46 warning lines of the children reached it). That the line counts what a
    child held: tests/package/test_library_quiet.py."""
    lines = reference_eval.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: "), (len(lines), lines[:12])
    print("held back:", lines[0])
    counts = dict(re.findall(r"(the simulated device \w+Warning) (\d+)", lines[0]))
    assert int(counts.get("the simulated device SpyreFallbackWarning", 0)) > 0, lines[0]


def test_head_dim_padding_reference_pads_the_keys_too(spyre: object, tmp_path: Path) -> None:
    """SDPA over a key length off the stick is wrong on the card (torch-spyre#3113, profile
    numerics.sdpa_unaligned_keys): the case's module example has 7 keys. Padding head_dim alone
    is a scale error there (cosine 1, relative error ~0.85) that goes away with the rule off;
    the reference, which also pads the keys to a stick and masks them, is right either way."""
    import math

    import torch.nn.functional as F

    from hfadapt.adapters.registry import load_file
    from hfadapt.agent.suite import REFERENCES
    from hfadapt.spyre.rules.profile import load_profile

    def head_only(self: object, q: Any, k: Any, v: Any) -> Any:  # the previous reference
        d = q.shape[-1]
        padded = (F.pad(t, (0, (-d) % 64)) for t in (q, k, v))
        return F.scaled_dot_product_attention(*padded, scale=1.0 / math.sqrt(d))[..., :d]

    (reference,) = load_file(REFERENCES / "head-dim-padding.txt", source="inline")
    data = json.loads(Path(load_profile(None).path).read_text())
    data["numerics"]["sdpa_unaligned_keys"]["enabled"] = False
    (tmp_path / "no-3113.json").write_text(json.dumps(data))
    without = load_profile(str(tmp_path / "no-3113.json"))
    got = {
        (name, label): _attention_error(fn, profile)
        for name, fn in (("head only", head_only), ("reference", reference.fn))
        for label, profile in (("default", None), ("no #3113", without))
    }
    print({k: (round(c, 5), round(r, 4), v[:1]) for k, (c, r, v) in got.items()})
    cos, rel, met = got[("head only", "default")]
    assert cos > 0.99 and rel > 0.5, got  # a scale error, not noise
    assert any("K=7" in m for m in met), met  # and 2026.07 says why: the P @ V contraction
    assert got[("head only", "no #3113")][1] < 0.01, got
    for label in ("default", "no #3113"):
        cos, rel, met = got[("reference", label)]
        assert cos > 0.999 and rel < 0.01 and not met, (label, got)


def test_the_size_bound_counts_whole_sticks() -> None:
    """Stick padding of a small call (7 keys and head_dim 32 to 64 each) is 1x of the stock
    call laid out on the device, not an 18x blow-up; a real blow-up is still counted."""
    import torch

    from hfadapt.agent.graph_proof import SIZE_FACTOR, laid_out

    q = torch.empty(2, 3, 7, 32)
    assert laid_out(q) == laid_out(torch.empty(2, 3, 64, 64)) == 2 * 3 * 64 * 64, laid_out(q)
    assert laid_out(torch.empty(5)) == 64 and laid_out(torch.empty(())) == 1
    huge = torch.empty(2, 3, 64 * SIZE_FACTOR + 64, 64)
    assert laid_out(huge) > SIZE_FACTOR * laid_out(q), (laid_out(huge), laid_out(q))


@pytest.mark.slow
@pytest.mark.usefixtures("proofs_in_process")
def test_the_mask_reference_holds_at_short_drawn_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proof draws fresh lengths at random; drawn short (2, 5), a padded attention mask cut
    at its front lost its padding, the original mask utility answered None (no mask needed)
    and the right draft, a graph, could not: the reference was refused about one run in a few.
    A shortened integer tensor now keeps its last position, so the row keeps its padding."""
    from hfadapt.agent import graph_proof
    from hfadapt.agent.client import AgentSettings
    from hfadapt.agent.evaluate import run_eval

    monkeypatch.setattr(graph_proof, "drawn_lengths", lambda _top, _taken: [2, 5, 40])
    settings = AgentSettings(model="reference", max_attempts=1)
    report = run_eval(settings, names=["masking-utility-function"], reference=True).to_dict()
    (row,) = report["cases"]
    print(row["outcome"], row["reason"][:300])
    assert row["outcome"] == "accepted", row["reason"]
