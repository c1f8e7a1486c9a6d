"""The parent's proofs are bounded: a graph whose sizes exceed what the case
needs is refused before anything is allocated; the steps that run the graph run in a child
process under memory, CPU-time and wall-clock limits; a graph that reaches one is refused with
the limit, and the draft loop goes on to its next attempt. Good graphs prove exactly as before."""

from __future__ import annotations

import os
import re
import resource
import time
from pathlib import Path

import pytest
from support.drafting import GOOD, WRONG, run, softsign_case
from support.hostile_graphs import files_of, good_graph, slow_graph, with_full
from support.openai_server import ScriptedOpenAI, openai_server_fixture  # noqa: F401

from hfadapt.agent import graph_proof
from hfadapt.agent.graph_proof import PARENT_STEPS, ProofLimits
from hfadapt.agent.loop import ACCEPTED
from hfadapt.agent.sandbox import SandboxRun, StepReport
from hfadapt.agent.validate import Validation, _parent_steps


def prove(files: dict[str, bytes], limits: ProofLimits) -> tuple[list[StepReport], float]:
    result = Validation([], False)
    result.files = files
    start = time.monotonic()
    _parent_steps(result, softsign_case(), [], limits)
    return result.steps, time.monotonic() - start


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_good_graph_proves_the_same_in_the_child_and_the_spawn_cost_is_bounded() -> None:
    files = files_of(good_graph())
    here, t_here = prove(files, ProofLimits(in_child=False))
    child, t_child = prove(files, ProofLimits())
    assert [s.status for s in here] == ["pass"] * 4, [(s.step, s.summary) for s in here]
    # the same but for what each proof draws at random (lengths, outlier channels)
    assert [(s.step, s.status, _undrawn(s.summary)) for s in child] == [
        (s.step, s.status, _undrawn(s.summary)) for s in here
    ]
    numbers = ("max_abs_err", "max_rel_err", "controls_rejected", "inputs")
    assert [{k: s.output.get(k) for k in numbers} for s in child[1:2]] == [
        {k: s.output.get(k) for k in numbers} for s in here[1:2]
    ]  # equivalence numbers
    spawn = t_child - t_here
    print(f"proof in process {t_here:.2f} s, in the child {t_child:.2f} s: spawn +{spawn:.2f} s")
    assert spawn < 30, f"the child added {spawn:.1f} s"


def test_a_declared_size_beyond_the_case_is_refused_in_the_graph_step() -> None:
    g = good_graph()
    g["symbols"]["s1"] = [2, 2**40]
    steps, seconds = prove(files_of(g), ProofLimits())
    assert [s.status for s in steps] == ["fail"], steps
    assert "bounded at 1099511627776, more than" in steps[0].summary, steps[0].summary
    assert seconds < 5, f"{seconds:.1f} s"


def test_a_huge_tensor_is_refused_before_it_is_allocated_in_process() -> None:
    """In this process (no child): the fake run refuses a 512 MB tensor before it exists; the
    peak RSS does not move by anything like it."""
    before = _peak_rss_mb()
    steps, _ = prove(files_of(with_full([8192, 8192])), ProofLimits(in_child=False))
    grew = _peak_rss_mb() - before
    eq = steps[1]
    assert (eq.step, eq.status) == ("equivalence", "fail"), steps
    assert "aten::full.default" in eq.summary and "refused before it ran" in eq.summary, eq.summary
    assert grew < 200, f"peak RSS grew by {grew:.0f} MB"


def test_a_32_gb_tensor_is_refused_in_the_child_and_the_parent_stays_small() -> None:
    before = _peak_rss_mb()
    steps, seconds = prove(files_of(with_full([65536, 65536])), ProofLimits(wall_seconds=120))
    grew = _peak_rss_mb() - before
    assert [(s.step, s.status) for s in steps] == [("graph", "pass"), ("equivalence", "fail")]
    assert "65536, 65536" in steps[1].summary and "refused before it ran" in steps[1].summary
    assert grew < 200, f"the parent's peak RSS grew by {grew:.0f} MB"
    assert seconds < 60, f"{seconds:.1f} s"


def test_the_memory_limit_fails_the_step_with_the_limit() -> None:
    steps, seconds = prove(files_of(good_graph()), ProofLimits(memory_mb=1, wall_seconds=120))
    last = steps[-1]
    assert last.status == "fail" and "the proof exceeded 1 MB" in last.summary, steps
    assert seconds < 60, f"{seconds:.1f} s"


@pytest.mark.parametrize(
    ("limits", "said", "within"),
    [
        (ProofLimits(cpu_seconds=1, wall_seconds=120), "the proof exceeded 1 s of CPU time", 40),
        (ProofLimits(wall_seconds=5), "the proof exceeded 5 s (wall clock)", 20),
    ],
    ids=["cpu", "wall"],
)
def test_a_proof_that_does_not_finish_is_stopped_at_the_limit(
    limits: ProofLimits, said: str, within: float
) -> None:
    steps, seconds = prove(files_of(slow_graph()), limits)
    assert steps[0].status == "pass", steps[0]
    last = steps[-1]
    assert last.status == "fail" and said in last.summary, (last.step, last.summary)
    assert seconds < within, f"stopped after {seconds:.1f} s (limit {limits})"


def test_the_draft_loop_goes_on_after_a_proof_hits_its_limit(
    openai_server: ScriptedOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two drafts: the first's graph never finishes its proof (stopped at the wall limit), the
    second's is softsign and is accepted."""
    handed = [files_of(slow_graph()), files_of(good_graph())]

    def sandbox(*a: object, **k: object) -> SandboxRun:
        steps = [
            StepReport("load", "pass", "ok"),
            StepReport("capture", "pass", "ok", {"reads": []}),
        ]
        return SandboxRun(steps, 0, files=handed.pop(0))

    monkeypatch.setattr("hfadapt.agent.validate.run_sandbox", sandbox)
    monkeypatch.setattr(graph_proof, "DEFAULT_LIMITS", ProofLimits(wall_seconds=5))
    openai_server.script = [WRONG, GOOD]
    start = time.monotonic()
    outcome, _ = run(openai_server.url, tmp_path, attempts=3)
    seconds = time.monotonic() - start
    assert outcome.outcome == ACCEPTED, outcome.reason
    first = outcome.attempts[0]
    assert first.failed_step in PARENT_STEPS, first.failed_step
    assert "the proof exceeded 5 s (wall clock)" in first.feedback, first.feedback
    assert len(outcome.attempts) == 2
    assert seconds < 60, f"the loop took {seconds:.1f} s"


def _undrawn(summary: str) -> str:
    return re.sub(r"lengths \[[^]]*\] \(drawn at random: \[[^]]*\]\)", "lengths (drawn)", summary)


def test_proof_children_fork_from_one_preloaded_server_with_the_callers_environment() -> None:
    """Each proof child is a fork of one server per process that has imported the proofs'
    code (torch, Dynamo, the device) before any proof: the child does not import them again.
    It leads a session of its own (the parent's kill takes anything it ran) and has the
    environment the caller had at that proof, not the one the server started with."""
    from support.proof_child import HEAVY, start_probe

    first = start_probe("first")
    second = start_probe("second")
    print(f"first {first}\nsecond {second}")
    for seen, variable in ((first, "first"), (second, "second")):
        assert seen["preloaded"] == list(HEAVY), seen
        assert seen["variable"] == variable and seen["own_session"] is True, seen
        assert seen["parent"] != os.getpid(), seen  # forked by the server, not by this process
    assert first["parent"] == second["parent"], (first, second)  # one server for both
    # a fresh interpreter importing the proofs' code takes about 3 s of a core on this machine
    assert float(second["seconds"]) < 1.5, second  # type: ignore[arg-type]


def test_a_fork_of_a_process_whose_server_runs_proves_in_a_fresh_interpreter() -> None:
    """The forkserver is the child of the process that started it. A process forked from that
    one cannot reach it (multiprocessing raises ChildProcessError there): its proofs start a
    fresh interpreter instead, with the same session and environment."""
    import multiprocessing

    from support.proof_child import from_a_fork, start_probe

    start_probe("the server runs")  # this process's forkserver, started if it was not
    ours, theirs = multiprocessing.Pipe()
    fork = multiprocessing.get_context("fork").Process(target=from_a_fork, args=(theirs,))
    fork.start()
    theirs.close()
    assert ours.poll(180), "the fork sent nothing in 180 s"
    seen = ours.recv()
    fork.join(30)
    print(seen)
    assert "error" not in seen, seen
    assert seen["preloaded"] == [] and seen["parent"] == seen["by"], seen  # its own child, fresh
    assert seen["variable"] == "from a fork" and seen["own_session"] is True, seen
