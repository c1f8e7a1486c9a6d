"""``hfadapt cycle``: two real cycles on one database, the second with an adapter left out,
exit 0 then 4 with the flipped models named; a cycle another live process holds is refused in
one line; an interrupted cycle resumes its crawl and its sweep; the ``cycle`` table's
migration keeps an older database's rows."""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.db.engine import get_engine, session
from hfadapt.db.tables import DONE, INTERRUPTED, RUNNING, Cycle, utcnow
from hfadapt.service.cycle import CycleOptions, run_cycle
from hfadapt.service.store import LEASE
from hfadapt.sweep.options import SweepOptions


def _verdicts(db: Path, sweep_id: int) -> dict[str, str]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT model_id, verdict FROM run WHERE sweep_id = ?", (sweep_id,))
        return dict(rows.fetchall())


def _cycles(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        sql = "SELECT id, status, sweep_id, baseline_sweep_id, regressions FROM cycle ORDER BY id"
        return conn.execute(sql).fetchall()


# the first of the two tests sharing them also runs the two cycles (~9 min on a busy machine)
@pytest.mark.timeout(1800)
@pytest.mark.slow
def test_two_cycles_exit_0_then_4_naming_the_regressions(two_real_cycles: Any) -> None:
    """The two cycles of ``two_real_cycles`` (tests/service/conftest.py)."""
    db, first, second = two_real_cycles.db, two_real_cycles.first, two_real_cycles.second
    assert first.code == 0, f"first cycle exit {first.code}: {first.err}"
    data = json.loads(first.out)
    print(
        f"\nfirst cycle: {first.seconds:.1f} s; seconds {data['seconds']}, counts {data['counts']}"
    )
    assert data["cycle"] == 1 and data["crawled"] and data["comparison"] is None, data
    assert data["regressions_found"] == 0 and sum(data["counts"].values()) == 30, data

    code, out, err = second.code, second.out, second.err
    print(
        f"second cycle (without {two_real_cycles.left_out}): {second.seconds:.1f} s; {err.strip()}"
    )
    assert code == 4, f"second cycle exit {code} (4: regressions found): {err}"
    cycles = _cycles(db)
    assert [c[1] for c in cycles] == [DONE, DONE], cycles
    (_, _, one, _, _), (_, _, two, baseline, regressed) = cycles
    assert baseline == one and two != one, cycles
    before, after = _verdicts(db, one), _verdicts(db, two)
    flipped = {m for m, v in after.items() if before.get(m) == "pass" and v != "pass"}
    printed = [line.split("\t") for line in out.splitlines()]
    named = {p[0]: p[1] for p in printed}
    print(f"flipped {len(flipped)} of {len(after)}; printed {len(printed)} lines")
    assert len(flipped) >= 10 and regressed == len(flipped), (len(flipped), regressed)
    assert set(named) == flipped, f"printed but not flipped {set(named) - flipped}, " \
        f"flipped but not printed {flipped - set(named)}"  # fmt: skip
    for model, (_, arrow, reason) in zip(named, printed, strict=True):
        assert arrow == f"pass -> {after[model]}", (model, arrow)
        assert reason.strip(), f"{model}: no reason printed"
    assert two_real_cycles.html.stat().st_size > 10_000
    assert f"regressions {len(flipped)}," in err, err


def _running_row(db: Path, *, host: str, pid: int, beat_ago: timedelta) -> int:
    engine = get_engine(str(db))
    try:
        with session(engine) as sess:
            row = Cycle(key="{}", status=RUNNING, host=host, driver_pid=pid,
                        heartbeat_at=utcnow() - beat_ago)  # fmt: skip
            sess.add(row)
            sess.flush()
            assert row.id is not None
            return row.id
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("host", "beat_ago"),
    [("this", timedelta(0)), ("elsewhere.example", timedelta(minutes=5))],
)
def test_a_second_cycle_is_refused_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    host: str,
    beat_ago: timedelta,
) -> None:
    db = tmp_path / "runs.db"
    # a live process of this machine (the test's parent), or another host within its lease
    name = platform.node() if host == "this" else host
    held = _running_row(db, host=name, pid=os.getppid(), beat_ago=beat_ago)
    started = time.perf_counter()
    code, out, err = run_cli(
        ["cycle", "--offline", "--top", "3", "--db", str(db)], monkeypatch, capsys
    )
    seconds = time.perf_counter() - started
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, f"exit {code}, {len(lines)} lines: {err}"
    assert lines[0].startswith(f"error: cycle {held} is running right now"), lines[0]
    assert out == "" and seconds < 10, (out, seconds)
    assert _cycles(db) == [(held, RUNNING, None, None, 0)], "the refused cycle wrote something"
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM crawl").fetchone() == (0,), "it crawled"


def test_a_dead_or_expired_holder_is_taken_over(tmp_path: Path, fake_worker: str) -> None:
    db = tmp_path / "runs.db"
    stale = _running_row(db, host="elsewhere.example", pid=1, beat_ago=LEASE + timedelta(minutes=1))
    engine = get_engine(str(db))
    options = CycleOptions(sweep=SweepOptions(top=6, workers=1), offline=True, limit=50)
    result = run_cycle(engine, options, worker=fake_worker)
    cycles = _cycles(db)
    assert [(c[0], c[1]) for c in cycles] == [(stale, INTERRUPTED), (result.cycle_id, DONE)], cycles
    engine.dispose()


def test_an_interrupted_cycle_resumes_its_crawl_and_sweep(tmp_path: Path, fake_worker: str) -> None:
    engine = get_engine(str(tmp_path / "runs.db"))
    options = CycleOptions(sweep=SweepOptions(top=12, workers=1), offline=True, limit=50)
    seen: list[int] = []

    def stop_after_one(p: object) -> None:
        done = p.done  # type: ignore[attr-defined]
        if done > 0:  # the first unit recorded (the first call reports none)
            seen.append(done)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_cycle(engine, options, progress=stop_after_one, worker=fake_worker)
    first = _cycles(tmp_path / "runs.db")
    assert [c[1] for c in first] == [INTERRUPTED], first
    result = run_cycle(engine, options, worker=fake_worker)
    print(f"\nstopped after {seen[0]} models; resumed: {result.sweep.already_done} done before, "
          f"{result.sweep.models} in all")  # fmt: skip
    assert result.resumed and not result.crawled and result.cycle_id == first[0][0], result
    assert result.sweep.resumed and result.sweep.already_done == seen[0] > 0, result.sweep
    assert result.sweep.models == 12 and result.comparison is None
    # the next cycle compares with this one: the same fake verdicts, nothing regressed
    again = run_cycle(engine, options, worker=fake_worker)
    assert again.baseline_cycle == result.cycle_id and again.crawled, again
    assert again.comparison is not None and again.regressions == 0, again.comparison
    assert again.comparison.counts["FAIL"] == 0 and sum(again.comparison.counts.values()) == 12
    data = json.dumps(again.comparison.to_dict())
    assert '"regressions": []' in data, data
    engine.dispose()


def test_a_misspelt_adapter_is_refused_before_any_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "runs.db"
    args = ["cycle", "--offline", "--top", "3", "--without-adapter", "no-such-adapter"]
    code, out, err = run_cli([*args, "--db", str(db)], monkeypatch, capsys)
    assert out == "", out
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "no-such-adapter" in lines[0], (code, err)
    with sqlite3.connect(db) as conn:
        counts = [
            conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("cycle", "crawl")
        ]
    assert counts == [0, 0], f"cycle and crawl rows written: {counts}"
