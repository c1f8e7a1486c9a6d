"""The real sweep worker (``hfadapt.sweep.worker.judge_unit``: check.diagnose without recording) on small
crawled configs, in spawned workers and on the simulated device; narrowed instances and their
confirmation at full width; the memory limit; and ``hfadapt sweep`` on the command line."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.cli_runner import run_cli
from support.sweeps import small_bert

from hfadapt import verdicts
from hfadapt.judge.environment import KEYS as ENVIRONMENT_KEYS
from hfadapt.sweep.local_pool import LocalExecutor
from hfadapt.sweep.options import SweepOptions
from hfadapt.sweep.run import run_sweep
from hfadapt.sweep.store import done_rows
from hfadapt.sweep.worker import Task, judge_unit


@pytest.mark.slow
def test_real_worker_judges_each_signature_once_on_the_device(sweep_engine: Any) -> None:
    result = run_sweep(sweep_engine, SweepOptions(workers=2, timeout=300))
    rows = done_rows(sweep_engine, result.sweep_id)
    print(f"\n{result.seconds:.1f} s: {result.counts}")
    for model, row in sorted(rows.items()):
        print(f"  {model}: {row['verdict']} {row['min_token_cosine']} {row['reason'][:100]}")
    assert (result.models, result.units, result.judged) == (13, 5, 5), result
    rep = rows["org/bert-a0"]
    assert rep["verdict"] == verdicts.PASS, rep["reason"]
    assert rep["min_token_cosine"] is not None and rep["min_token_cosine"] >= 0.99, rep[
        "min_token_cosine"
    ]
    assert rep["reason"].startswith("[structural]") and rep["mode"] == "structural"
    assert rep["evidence"]["config_source"] == "structural:crawl" and "path" not in rep["evidence"]
    assert rep["evidence"]["probes"].startswith("4 probes x 256 tokens"), rep["evidence"]["probes"]
    assert list(rep["versions"]) == list(ENVIRONMENT_KEYS), rep["versions"]
    assert rep["timings"]["device"] > 0 and rep["evidence"]["sweep"]["worker_pid"] > 0
    member = rows["org/bert-a3"]
    assert (member["verdict"], member["min_token_cosine"]) == (
        rep["verdict"],
        rep["min_token_cosine"],
    )
    assert member["evidence"]["sweep"]["representative_run"] == rep["id"]
    missing = rows["org/no-config"]
    assert missing["verdict"] == verdicts.LOAD_FAILED and "org/no-config" in missing["reason"], (
        missing["reason"]
    )
    assert (
        rows["org/xlmr-1"]["verdict"]
        == rows["org/xlmr-0"]["verdict"]
        in (verdicts.PASS, verdicts.LOWERING_FAILED)
    )


def _task(**over: Any) -> Task:
    base: dict[str, Any] = {
        "key": "k",
        "model_id": "org/wide",
        "config": small_bert(
            hidden_size=256, num_attention_heads=4, intermediate_size=512, num_hidden_layers=2
        ),
        "narrow": small_bert(num_hidden_layers=2),
        "narrow_changes": {"hidden_size": [256, 128]},
        "runner": "support.sweep_fakes:cpu_runner",
    }
    base.update(over)
    return Task(**base)


def test_a_narrowed_pass_decides_the_signature(fake_worker: str) -> None:
    out = judge_unit(_task())
    assert out.verdict == verdicts.PASS, out.reason
    assert out.row["evidence"]["narrowed"] == {
        "changes": {"hidden_size": [256, 128]},
        "verdict": "pass",
    }
    assert out.row["model_id"] == "org/wide" and out.row["min_token_cosine"] >= 0.999


def test_a_narrowed_numeric_failure_is_confirmed_at_full_width(fake_worker: str) -> None:
    out = judge_unit(_task(runner="support.sweep_fakes:narrow_fails_runner"))
    narrowed = out.row["evidence"]["narrowed"]
    print(f"\n{out.verdict}: {narrowed}")
    assert (
        narrowed["verdict"] == verdicts.VERIFICATION_FAILED
        and narrowed["confirmed_at_full_width"] is True
    )
    assert out.verdict == verdicts.PASS and out.row["min_token_cosine"] >= 0.999, out.reason


def test_memory_limit_turns_a_hog_into_worker_crashed(
    sweep_engine: Any, fake_worker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HFADAPT_FAKE_HOG", "org/minilm")
    result = run_sweep(
        sweep_engine,
        SweepOptions(workers=1, memory_limit=1536),
        worker="support.sweep_fakes:hog_judge",
    )
    rows = done_rows(sweep_engine, result.sweep_id)
    hog = rows["org/minilm"]
    assert hog["verdict"] == verdicts.WORKER_CRASHED and "out of memory" in hog["reason"], hog[
        "reason"
    ]
    assert "1536 MB" in hog["reason"] and result.worker_restarts == 1, (hog["reason"], result)
    assert rows["org/bert-a0"]["verdict"] != verdicts.WORKER_CRASHED and len(rows) == 13


@pytest.mark.slow
def test_cli_sweep_shows_progress_and_counts(
    sweep_engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.db.engine import sqlite_path

    db = str(sqlite_path(sweep_engine.url))
    code, out, err = run_cli(
        ["sweep", "--top", "6", "--db", db, "--workers", "1"], monkeypatch, capsys
    )
    assert (code, out) == (0, ""), err  # what a sweep did is a summary: stderr
    assert "sweep 1: 6 models" in err and "2 units of work" in err, err
    # the tally once in the closing summary (a progress line, printed at least every 30 s
    # without a terminal, may carry the running tally too)
    summary_tallies = [ln for ln in err.splitlines() if ln.strip().startswith("pass ")]
    assert "dedupe factor 3.0" in err and summary_tallies == ["  pass 6"], err
    code, out, err = run_cli(["sweeps", "--db", db, "--json"], monkeypatch, capsys)
    (sweep,) = json.loads(out)
    assert (sweep["status"], sweep["models"], sweep["units"], sweep["top"]) == ("done", 6, 2, 6)
    code, out, err = run_cli(
        ["sweep", "--top", "6", "--db", db, "--mode", "fast"], monkeypatch, capsys
    )
    assert code == 2 and err.count("\n") == 1 and "'--mode'" in err and "fast" in err, (code, err)


def test_a_worker_collects_less_often_frees_each_units_cycles_and_freezes_after_the_first(
    fake_worker: str,
) -> None:
    """A sweep worker's collector is the command's (hfadapt.own_process): young collections
    every 200,000 allocations, a full collection after each unit (so a unit's reference cycles
    never outlive it, however rarely the collector would run), and what is alive once the first
    unit is done frozen. Each unit of the probe leaves one cycle behind."""
    tasks = [Task(f"k{i}", f"org/m{i}") for i in range(3)]
    with LocalExecutor(1, timeout=120, worker="support.sweep_fakes:gc_probe_judge") as pool:
        seen = [out.row["evidence"]["gc"] for out in pool.run(tasks)]
    print("per unit:", seen)
    assert [s["units_before"] for s in seen] == [0, 1, 2], seen  # one process, in order
    assert all(s["threshold"] == [200_000, 30, 30] for s in seen), seen
    assert [s["earlier_cycles_alive"] for s in seen] == [0, 0, 0], seen
    assert seen[0]["frozen"] == 0 and seen[1]["frozen"] > 1_000, seen
    # frozen once: later units add nothing (a frozen object freed by its count leaves the count)
    assert seen[2]["frozen"] <= seen[1]["frozen"], seen
