"""The drafting loop against a scripted loopback endpoint: accept, repair with feedback, policy
rejections that never run, runaway drafts killed, malformed answers, 429s, a dead endpoint."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.drafting import (
    GOOD,
    WORSE_ON_DEVICE,
    WRONG,
    client_for,
    corrupted_softsign_case,
    draft,
    rows,
    run,
    softsign_case,
)
from support.openai_server import (
    ScriptedOpenAI,
    busy,
    dead_url,
    openai_server_fixture,  # noqa: F401
)

from hfadapt.adapters.graph_adapter import load_graph_adapter, read_manifest
from hfadapt.agent.loop import (
    ACCEPTED,
    ENDPOINT_ERROR,
    NO_TARGET,
    REJECTED,
    REPEATED,
    draft_adapter,
)
from hfadapt.agent.records import Recorder
from hfadapt.agent.sandbox import SandboxLimits
from hfadapt.db.engine import get_engine

ALL_STEPS = ["policy", "load", "capture", "graph", "equivalence", "device", "end_to_end"]
# Drafts the policy refuses before any process starts: where a test is about the loop (retries,
# repeats, budgets, malformed answers), not about a draft's proof, its drafts are these. A
# refused draft is an attempt like any other; accepting and refusing after a sandbox and a
# proof are the tests above and below that use GOOD and WRONG.
REFUSED = GOOD.replace("import torch\n", "import os\nimport torch\n")
WRONG_REFUSED = WRONG.replace("import torch\n", "import os\nimport torch\n")


@pytest.mark.usefixtures("proofs_in_process")
def test_correct_draft_is_accepted_as_a_graph_with_provenance_and_recorded(
    openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    openai_server.script = [GOOD]
    outcome, engine = run(openai_server.url, tmp_path)
    assert outcome.outcome == ACCEPTED, outcome.reason
    assert len(outcome.attempts) == 1 and len(openai_server.requests) == 1
    path = outcome.adapter_path
    assert path is not None and path.parent == tmp_path / "adapters" and path.is_dir()
    files = sorted(p.name for p in path.iterdir())
    assert files == ["adapter.json", "constants.safetensors", "draft-source.txt", "graph.json"], (
        files
    )
    assert not list(path.rglob("*.py")), "an accepted draft must not be written as Python"
    manifest = read_manifest(path)
    assert manifest["target"] == "hfadapt.agent.evalcases:Softsign.forward"
    loaded = load_graph_adapter(path)
    assert loaded.form == "graph" and loaded.provenance.origin == "agent"
    assert loaded.provenance.endpoint_model == "scripted-model"
    assert loaded.provenance.attempt_id == outcome.attempts[0].attempt_id
    eq = loaded.provenance.evidence["equivalence"]
    assert eq["max_rel_err"] < 1e-12 and eq["controls_rejected"], eq
    sessions, attempts = rows(engine)
    assert [s.outcome for s in sessions] == [ACCEPTED]
    assert sessions[0].tokens_in == 1200 and sessions[0].tokens_out == 300
    assert [a.accepted for a in attempts] == [True]
    assert [st["step"] for st in attempts[0].steps] == ALL_STEPS
    assert all(st["status"] == "pass" for st in attempts[0].steps), attempts[0].steps


def test_a_case_without_a_method_is_not_drafted_at_all(
    openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    case = softsign_case()
    case.target = None
    case.location = "modeling_x.py:40 in rotate_half"
    openai_server.script = [GOOD]
    outcome, engine = run(openai_server.url, tmp_path, case=case)
    assert outcome.outcome == NO_TARGET, outcome.reason
    assert "not a method of a model class" in outcome.reason and "rotate_half" in outcome.reason
    assert openai_server.requests == [], "the endpoint was asked about a case nothing can fix"
    sessions, attempts = rows(engine)
    assert [s.outcome for s in sessions] == [NO_TARGET] and attempts == []


@pytest.mark.usefixtures("proofs_in_process")
def test_wrong_draft_is_rejected_at_equivalence_and_the_feedback_reaches_the_next_request(
    openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    openai_server.script = [WRONG, GOOD]
    outcome, engine = run(openai_server.url, tmp_path)
    assert outcome.outcome == ACCEPTED, outcome.reason
    first, second = outcome.attempts
    assert first.failed_step == "equivalence", first.feedback
    eq = next(s for s in first.validation.steps if s.step == "equivalence")  # type: ignore[union-attr]
    assert eq.output["max_rel_err"] > 0.1, eq.output["max_rel_err"]
    repair = openai_server.user_messages(1)[-1]
    assert "Step `equivalence` fail" in repair and "NOT equivalent" in repair, repair[:600]
    assert "torch.reciprocal(1.0 + x * x)" in repair  # the previous draft, verbatim
    assert second.accepted
    _, attempts = rows(engine)
    assert [a.failed_step for a in attempts] == ["equivalence", None]


@pytest.mark.usefixtures("proofs_in_process")
def test_a_baseline_already_wrong_on_the_device_judges_the_draft_against_it(
    openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    """Another defect makes the model wrong on the device without any draft (exp over 96
    channels): a right softsign is accepted (no worse than that baseline), one that adds error
    of its own on the device is refused, and the feedback gives both runs' numbers."""
    openai_server.script = [WORSE_ON_DEVICE, GOOD]
    outcome, engine = run(openai_server.url, tmp_path, case=corrupted_softsign_case())
    assert outcome.outcome == ACCEPTED, outcome.reason
    worse, right = outcome.attempts
    # The worse draft (exact in real arithmetic, within the static rules) adds error of its own
    # on the device: refused where the device first shows it, with the numbers in the feedback.
    assert worse.failed_step in ("device", "end_to_end"), (worse.failed_step, worse.feedback[:800])
    step = next(s for s in worse.validation.steps if s.step == worse.failed_step)  # type: ignore[union-attr]
    print(f"worse draft refused at {worse.failed_step}: {step.summary[:300]}")
    assert re.search(r"min cosine 0\.\d+", worse.feedback), worse.feedback[:800]
    assert re.search(r"relative error 0\.\d+", worse.feedback), worse.feedback[:800]
    repair = openai_server.user_messages(1)[-1]
    assert worse.feedback.splitlines()[0][:120] in repair, repair[:800]
    e2e = next(s for s in right.validation.steps if s.step == "end_to_end")  # type: ignore[union-attr]
    out = e2e.output
    assert out["device_vs_cpu_min_token_cosine"] < 0.99, out  # refused before this harness
    assert out["baseline_ok"] is False and e2e.status == "pass", (e2e.status, e2e.summary)
    for n in (
        f"{out['device_vs_cpu_min_token_cosine']:.6f}",
        f"{out['baseline_device_vs_cpu_min_token_cosine']:.6f}",
    ):
        assert n in e2e.summary, (n, e2e.summary)
    _, attempts = rows(engine)
    assert [a.failed_step for a in attempts] == [worse.failed_step, None]
    assert attempts[0].feedback is not None and worse.feedback[:200] in attempts[0].feedback


def test_repeated_identical_draft_stops_the_loop(
    openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    script = [WRONG_REFUSED, WRONG_REFUSED.replace("def forward", "# same code\ndef forward")]
    openai_server.script = [*script, GOOD]
    outcome, _ = run(openai_server.url, tmp_path, attempts=4)
    assert outcome.outcome == REPEATED, outcome.reason
    assert len(openai_server.requests) == 2, "the loop went on after an identical draft"
    assert [a.failed_step for a in outcome.attempts] == ["policy", "repeat"], outcome.attempts
    assert outcome.attempts[1].feedback == "identical to the draft of attempt 1"


SENTINEL_DRAFTS = {
    "os": "import os\n\nos.system('touch {s}')\n",
    "subprocess": "import subprocess\n\nsubprocess.run(['touch', '{s}'])\n",
    "open": "_F = open('{s}', 'w')\n",
}


def test_policy_rejects_os_subprocess_and_open_without_running_them(
    openai_server: ScriptedOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sentinel = tmp_path / "sentinel"

    def never(*a: object, **k: object) -> None:
        raise AssertionError("a draft that fails the policy reached the sandbox")

    monkeypatch.setattr("hfadapt.agent.validate.run_sandbox", never)
    openai_server.script = [
        GOOD.replace("import torch\n", "import torch\n" + code.format(s=sentinel))
        for code in SENTINEL_DRAFTS.values()
    ]
    outcome, _ = run(openai_server.url, tmp_path)
    assert outcome.outcome == REJECTED, outcome.reason
    assert [a.failed_step for a in outcome.attempts] == ["policy"] * 3
    feedback = [a.feedback for a in outcome.attempts]
    assert "import of 'os' is not allowed" in feedback[0]
    assert "import of 'subprocess' is not allowed" in feedback[1]
    assert "use of 'open' is not allowed" in feedback[2]
    assert not sentinel.exists(), "a rejected draft was executed"
    assert "import of 'os' is not allowed" in openai_server.user_messages(1)[-1]


def test_no_code_then_conflicting_blocks_then_a_draft_is_judged(
    openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    openai_server.script = [
        "I would rewrite pow(x, -1) as a reciprocal.",
        WRONG + "\nor\n" + GOOD,
        REFUSED,
    ]
    outcome, _ = run(openai_server.url, tmp_path)
    assert outcome.outcome == REJECTED, outcome.reason
    assert [a.failed_step for a in outcome.attempts] == ["extract", "extract", "policy"]
    assert "import os" in (outcome.attempts[2].code or ""), outcome.attempts[2].code
    assert "no ```python code block" in openai_server.user_messages(1)[-1]
    assert "2 different code blocks" in openai_server.user_messages(2)[-1]


def test_429_then_success(openai_server: ScriptedOpenAI, tmp_path: Path) -> None:
    """The request is retried after a 429 and its answer is the attempt's draft, judged."""
    openai_server.script = [busy(429, "slow down"), REFUSED]
    outcome, engine = run(openai_server.url, tmp_path, attempts=1)
    assert outcome.outcome == REJECTED, outcome.reason
    assert len(openai_server.requests) == 2
    _, attempts = rows(engine)
    assert [a.retries for a in attempts] == [1]
    assert [a.failed_step for a in attempts] == ["policy"] and "import os" in attempts[0].code


def test_endpoint_down_is_a_clear_outcome_and_nothing_is_lost(tmp_path: Path) -> None:
    url = dead_url()
    outcome, engine = run(url, tmp_path)
    assert outcome.outcome == ENDPOINT_ERROR
    assert url.removesuffix("/v1") in outcome.reason and "connection refused" in outcome.reason, (
        outcome.reason
    )
    assert "not retried" in outcome.reason, outcome.reason
    sessions, attempts = rows(engine)
    assert [(s.outcome, s.attempts) for s in sessions] == [(ENDPOINT_ERROR, 1)]
    assert attempts[0].error and "connection refused" in attempts[0].error
    assert attempts[0].retries == 0
    assert attempts[0].prompt and attempts[0].prompt[0]["role"] == "system"  # the prompt is kept


def test_server_errors_after_a_rejected_draft_keep_the_first_attempt(
    openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    openai_server.script = [WRONG_REFUSED] + [busy(503, "overloaded")] * 4
    outcome, engine = run(openai_server.url, tmp_path)
    assert outcome.outcome == ENDPOINT_ERROR, outcome.reason
    assert "server error (503); gave up after 3 tries" in outcome.reason, outcome.reason
    assert len(openai_server.requests) == 4, len(
        openai_server.requests
    )  # the draft, then 1 try + 2 retries
    _, attempts = rows(engine)
    assert [(a.number, a.failed_step) for a in attempts] == [(1, "policy"), (2, None)]
    # The failed request's retries (max_retries=2, all spent) are on its attempt row.
    assert [a.retries for a in attempts] == [0, 2], [a.retries for a in attempts]
    assert attempts[0].code and "x * x" in attempts[0].code


@pytest.mark.slow
@pytest.mark.usefixtures("proofs_in_process")
def test_runaway_drafts_are_killed_and_the_loop_goes_on(
    openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    forever = draft("    while True:\n        pass", name="forever")
    # real memory (a capture traces tensors without allocating them): Python lists
    hog = draft(
        "    junk = []\n    while True:\n        junk.append([0.0] * (1 << 22))", name="hog"
    )
    openai_server.script = [forever, hog, GOOD]
    outcome, _ = run(openai_server.url, tmp_path, limits=SandboxLimits(timeout_s=20, memory_mb=400))
    assert outcome.outcome == ACCEPTED, outcome.reason
    first, second, third = outcome.attempts
    killed = first.validation.steps[-1]  # type: ignore[union-attr]
    assert (killed.step, killed.status) == ("capture", "killed"), killed
    assert "time limit of 20 s" in killed.summary, killed.summary
    hogged = second.validation.steps[-1]  # type: ignore[union-attr]
    assert hogged.step == "capture" and hogged.status in ("fail", "killed"), hogged
    assert "memory" in hogged.summary.lower() or "MemoryError" in hogged.summary, hogged.summary
    assert third.accepted


def test_token_and_wall_time_limits_end_the_session(
    openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    from hfadapt.agent.loop import TIME_BUDGET, TOKEN_BUDGET

    openai_server.script = [WRONG_REFUSED, GOOD]
    engine = get_engine(str(tmp_path / "runs.db"))
    client = client_for(openai_server.url, attempts=3, max_tokens=1000)  # one answer costs 1500
    outcome = draft_adapter(softsign_case(), client, recorder=Recorder(engine), taken_names={})
    assert outcome.outcome == TOKEN_BUDGET, outcome.reason
    assert "token limit 1000 reached (1500 used) after 1 attempt(s)" in outcome.reason
    assert len(openai_server.requests) == 1
    client = client_for(openai_server.url, attempts=3, max_seconds=0.0)
    outcome = draft_adapter(softsign_case(), client, recorder=Recorder(engine), taken_names={})
    assert outcome.outcome == TIME_BUDGET and len(openai_server.requests) == 1, outcome.reason
    sessions, _ = rows(engine)
    assert [s.outcome for s in sessions] == [TOKEN_BUDGET, TIME_BUDGET]
