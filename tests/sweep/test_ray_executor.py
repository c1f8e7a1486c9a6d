"""``--executor ray``: the same worker function as Ray tasks on a local Ray instance gives the
same verdicts as the local pool; a crash and a hang in a Ray task are recorded and the sweep
goes on; the driver alone writes runs.db. Skipped when Ray is not installed (pip install ".[ray]")."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hfadapt import verdicts
from hfadapt.sweep.options import SweepOptions
from hfadapt.sweep.run import run_sweep
from hfadapt.sweep.store import done_rows

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install '.[ray]'")

TESTS = Path(__file__).resolve().parents[1]

from support.ray_lock import local_ray as start_local_ray  # noqa: E402
from support.sweep_fakes import fake_verdict  # noqa: E402  # tests/ is on sys.path (conftest)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """A local Ray instance (2 CPUs, no dashboard) whose workers import tests/support/sweep_fakes.py;
    its session files and auth token stay in a temporary folder."""
    with start_local_ray(ray, 2, TESTS) as started:
        yield started


def _verdicts(engine: Any, sweep_id: int) -> dict[str, str]:
    return {m: r["verdict"] for m, r in done_rows(engine, sweep_id).items()}


@pytest.mark.slow
def test_ray_gives_the_same_verdicts_as_the_local_pool(local_ray: Any, sweep_engine: Any) -> None:
    on_ray = run_sweep(sweep_engine, SweepOptions(executor="ray", top=8, workers=2, resume=False))
    local = run_sweep(sweep_engine, SweepOptions(executor="local", top=8, workers=2, resume=False))
    print(
        f"\nray {on_ray.seconds:.1f} s {on_ray.counts}; local {local.seconds:.1f} s {local.counts}"
    )
    assert (on_ray.executor, local.executor) == ("ray", "local")
    assert (on_ray.models, on_ray.units, on_ray.judged) == (8, 3, 3), on_ray  # custom_code: no task
    ray_rows = done_rows(sweep_engine, on_ray.sweep_id)
    assert _verdicts(sweep_engine, on_ray.sweep_id) == _verdicts(sweep_engine, local.sweep_id)
    rep = ray_rows["org/bert-a0"]
    assert rep["verdict"] == verdicts.PASS and rep["min_token_cosine"] >= 0.99, rep["reason"]
    local_rep = done_rows(sweep_engine, local.sweep_id)["org/bert-a0"]
    assert rep["min_token_cosine"] == pytest.approx(local_rep["min_token_cosine"], abs=1e-6)
    assert rep["evidence"]["sweep"]["worker_pid"] != os.getpid()  # judged in a Ray worker


def test_ray_records_a_crash_and_a_hang_and_goes_on(local_ray: Any, fake_worker: str) -> None:
    # Ray workers have the environment Ray started with: the executor hands them ``env``.
    from hfadapt.sweep.ray_pool import RayExecutor
    from hfadapt.sweep.worker import Task

    env = {"HFADAPT_FAKE_CRASH": "org/bert-relu", "HFADAPT_FAKE_HANG": "org/minilm"}
    # 20 s: a crashing worker must crash (not time out) even while the machine is loaded
    pool = RayExecutor(2, timeout=20.0, worker=fake_worker, env=env)
    tasks = [
        Task("a", "org/bert-a0"),
        Task("b", "org/bert-relu"),
        Task("c", "org/minilm"),
        Task("d", "org/xlmr-0"),
    ]
    outcomes = {o.model_id: o for o in pool.run(tasks)}
    print({m: (o.verdict, o.reason[:80]) for m, o in outcomes.items()})
    assert outcomes["org/bert-relu"].verdict == verdicts.WORKER_CRASHED, outcomes[
        "org/bert-relu"
    ].reason
    assert (
        outcomes["org/minilm"].verdict == verdicts.WORKER_TIMEOUT
        and "20 s" in outcomes["org/minilm"].reason
    )
    for task in (tasks[0], tasks[3]):  # the fake's verdict is a function of the unit key
        got = outcomes[task.model_id].verdict
        assert got == fake_verdict(task.key), (task, got, outcomes[task.model_id].reason)
    assert len(outcomes) == 4


@pytest.mark.slow  # fixed sleeps against a fixed limit: out of the quick subset
def test_ray_timeout_counts_from_the_start_of_a_task_not_its_submission(
    local_ray: Any, fake_worker: str
) -> None:
    # Four slots on two CPUs: tasks c and d wait in Ray's queue for 8 s or more behind a and b,
    # then run 8 s. Counted from submission they pass the 15 s limit (16 s or more); counted
    # from their start they keep 7 s of margin for a loaded machine.
    from hfadapt.sweep.ray_pool import RayExecutor
    from hfadapt.sweep.worker import Task

    pool = RayExecutor(4, timeout=15.0, worker=fake_worker, env={"HFADAPT_FAKE_SLEEP": "8"})
    tasks = [Task(k, f"org/m-{k}") for k in "abcd"]
    outcomes = {o.model_id: o for o in pool.run(tasks)}
    got = {m: (o.verdict, o.seconds) for m, o in outcomes.items()}
    assert len(outcomes) == 4, got
    for task in tasks:
        out = outcomes[task.model_id]
        assert out.verdict == fake_verdict(task.key), (task.key, got, out.reason)
    assert pool.restarts == 0, got
