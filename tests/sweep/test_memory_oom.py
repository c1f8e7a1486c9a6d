"""A unit that runs out of memory is reported in words, with what to do, never as the
allocator's raw text; and the local pool and Ray give it the same verdict and reason (both
executors run ``run_task`` with the sweep's per-worker limit as configured)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.memory_fakes import ALLOCATOR_TEXT
from support.ray_lock import local_ray as start_local_ray
from support.sweep_fakes import fake_verdict
from support.sweeps import small_bert

from hfadapt import verdicts
from hfadapt.sweep.local_pool import LocalExecutor
from hfadapt.sweep.worker import Outcome, Task, judge_unit, run_task

TESTS = Path(__file__).resolve().parents[1]
LIMIT_MB = 6000  # far above what a fake unit takes, far below the 64 GB the hog asks for


def _assert_in_words(out: Outcome, model_id: str) -> None:
    got = (out.verdict, out.reason)
    assert out.verdict == verdicts.WORKER_CRASHED, got
    assert out.reason.startswith(f"out of memory: judging {model_id} needed more than"), got
    assert f"the worker's {LIMIT_MB} MB limit" in out.reason, got
    assert "--memory-limit" in out.reason and "fewer --workers" in out.reason, got
    for raw in ("DefaultCPUAllocator", "enforce fail", "MemoryError", "Error code 12"):
        assert raw not in out.reason, (raw, got)
    evidence = out.row["evidence"]
    assert evidence["out_of_memory"] is True and evidence["memory_limit_mb"] == LIMIT_MB, evidence
    assert out.restart is True, got


def test_an_allocator_error_in_the_real_judge_is_out_of_memory_in_words() -> None:
    # the real worker on a tiny BERT whose device run fails to allocate, as torch says it
    task = Task(
        "k",
        "org/tiny",
        config=small_bert(num_hidden_layers=2),
        runner="support.memory_fakes:oom_runner",
    )
    out = run_task(judge_unit, task, limit_mb=LIMIT_MB, set_limit=False)
    print(f"\n{out.verdict}: {out.reason}\n{out.row['evidence']}")
    _assert_in_words(out, "org/tiny")
    assert "DefaultCPUAllocator" in out.row["evidence"]["allocator"], out.row["evidence"]


def test_an_allocation_past_the_limit_is_out_of_memory_in_words(fake_worker: str) -> None:
    import support.memory_fakes as fakes

    os.environ["HFADAPT_FAKE_OOM"] = "org/hog"
    try:
        out = run_task(fakes.hog_oom_judge, Task("k", "org/hog"), limit_mb=LIMIT_MB)
    finally:
        del os.environ["HFADAPT_FAKE_OOM"]
    print(f"\n{out.verdict}: {out.reason}")
    _assert_in_words(out, "org/hog")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """A local Ray instance (1 CPU, no dashboard) whose workers import tests/support."""
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install '.[ray]'")
    with start_local_ray(ray, 1, TESTS) as started:
        yield started


@pytest.mark.parametrize("worker", ["allocator_oom_judge", "hog_oom_judge"])
def test_local_and_ray_give_an_out_of_memory_unit_the_same_verdict(
    local_ray: Any, fake_worker: str, worker: str
) -> None:
    from hfadapt.sweep.ray_pool import RayExecutor

    ref = f"support.memory_fakes:{worker}"
    env = {"HFADAPT_FAKE_OOM": "org/oom"}
    tasks = [Task("a", "org/oom"), Task("b", "org/fine")]
    got: dict[str, dict[str, Outcome]] = {}
    for name, pool in (
        ("local", LocalExecutor(1, timeout=120, memory_limit_mb=LIMIT_MB, worker=ref, env=env)),
        ("ray", RayExecutor(1, timeout=120, memory_limit_mb=LIMIT_MB, worker=ref, env=env)),
    ):
        got[name] = {o.model_id: o for o in pool.run(tasks)}
    seen = {n: {m: (o.verdict, o.reason) for m, o in outs.items()} for n, outs in got.items()}
    print(f"\n{seen}")
    for name in ("local", "ray"):
        _assert_in_words(got[name]["org/oom"], "org/oom")
        assert got[name]["org/fine"].verdict == fake_verdict("b"), seen
    assert seen["local"] == seen["ray"], seen


def test_the_allocator_text_is_what_torch_raises() -> None:
    # the fake's text is torch's own: an allocation no machine holds (16 TB) says the same
    import torch

    with pytest.raises(RuntimeError) as caught:
        torch.empty(2**44, dtype=torch.uint8)
    text = str(caught.value)
    assert "DefaultCPUAllocator: can't allocate memory" in text, text
    assert "DefaultCPUAllocator: can't allocate memory" in ALLOCATOR_TEXT


def test_a_unit_and_its_full_width_rejudge_are_sized_from_the_worker_limit() -> None:
    # judge_unit's narrowed try and its full-width confirmation both build inside run_task:
    # whatever the executor (local: the process is capped; Ray: capped on top of its store)
    from hfadapt.loading import sizing

    seen: list[int] = []

    def probe(task: Task) -> Outcome:
        seen.append(sizing.current_budget_mb())
        return Outcome(task.key, task.model_id, "pass", "ok")

    run_task(probe, Task("k", "m"), limit_mb=LIMIT_MB, set_limit=False)  # the local pool's call
    run_task(probe, Task("k", "m"), limit_mb=2000, extra_mb=100_000)  # a Ray task
    expected = [min(sizing.DEFAULT_BUDGET_MB, LIMIT_MB - sizing.PROCESS_BASE_MB), 800]
    assert seen == expected, (seen, expected)
