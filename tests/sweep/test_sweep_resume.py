"""Resume: a sweep driver killed with SIGKILL in the middle (a real subprocess), run again,
finishes the rest: no lost row, no duplicate, the same verdicts as an uninterrupted sweep."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.sweeps import store_crawl, sweep_records

from hfadapt.db.engine import get_engine
from hfadapt.sweep.options import SweepOptions
from hfadapt.sweep.run import run_sweep

TESTS = Path(__file__).resolve().parents[1]
DRIVER = """
import sys
from hfadapt.db.engine import get_engine
from hfadapt.sweep.run import SweepOptions, run_sweep

if __name__ == "__main__":
    options = SweepOptions(workers=2, timeout=60)
    result = run_sweep(get_engine(sys.argv[1]), options, worker="support.sweep_fakes:fake_judge")
    print(f"RESULT resumed={result.resumed} already={result.already_done} judged={result.judged} models={result.models}")
"""


def _rows(db: Path) -> list[tuple[str, str, int]]:
    with sqlite3.connect(db) as conn:
        return list(conn.execute("SELECT model_id, verdict, sweep_id FROM run ORDER BY model_id"))


def _count(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return int(conn.execute("SELECT count(*) FROM run").fetchone()[0])
    except sqlite3.OperationalError:
        return 0


@pytest.mark.slow
def test_sigkill_in_the_middle_then_resume(
    tmp_path: Path, fake_worker: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "killed.db"
    engine = get_engine(str(db))
    store_crawl(engine, sweep_records("many"))  # 92 models: 30 units of 3, custom_code, skipped
    engine.dispose()
    script = tmp_path / "drive.py"
    script.write_text(DRIVER)
    env = {
        **os.environ,
        "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "HFADAPT_FAKE_SLEEP": "0.3",
    }

    proc = subprocess.Popen(
        [sys.executable, str(script), str(db)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 90
    while _count(db) < 2 + 3 * 8 and time.monotonic() < deadline:  # direct rows + eight units
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    at_kill = _count(db)
    print(f"\nkilled with {at_kill} of 92 rows written")
    assert 2 + 3 * 8 <= at_kill < 92, at_kill
    assert at_kill % 3 == 2, (
        f"{at_kill} rows: a unit was half written"
    )  # whole units of 3 (+2 direct)

    # the pause per unit only lets the kill land mid-sweep: the resumed run goes at full speed
    env["HFADAPT_FAKE_SLEEP"] = "0"
    again = subprocess.run(
        [sys.executable, str(script), str(db)], env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr[-2000:]
    line = next(x for x in again.stdout.splitlines() if x.startswith("RESULT"))
    print(line)
    assert f"resumed=True already={at_kill}" in line and "models=92" in line, line
    judged_now = int(line.split("judged=")[1].split()[0])
    assert judged_now == (92 - at_kill) // 3, line

    resumed = _rows(db)
    models = [m for m, _, _ in resumed]
    assert len(models) == 92 and len(set(models)) == 92, "a row was lost or duplicated"
    assert {s for _, _, s in resumed} == {1}, "the resumed sweep is the same sweep"
    with sqlite3.connect(db) as conn:
        status, resumes, units = conn.execute(
            "SELECT status, resumes, judged FROM sweep"
        ).fetchone()
    assert (status, resumes, units) == ("done", 1, 30), (status, resumes, units)

    # The same verdicts as an uninterrupted sweep over the same crawl.
    clean = get_engine(str(tmp_path / "clean.db"))
    store_crawl(clean, sweep_records("many"))
    result = run_sweep(clean, SweepOptions(workers=2), worker=fake_worker)
    clean.dispose()
    uninterrupted = {m: v for m, v, _ in _rows(tmp_path / "clean.db")}
    assert result.models == 92
    differ = {m: (v, uninterrupted[m]) for m, v, _ in resumed if uninterrupted[m] != v}
    assert not differ, differ


def test_resume_copies_a_half_planned_unit(sweep_engine: Any, fake_worker: str) -> None:
    """A unit whose members were partly recorded (a crawl grew between sessions) is completed
    from the recorded verdict, without running it again."""
    from sqlalchemy import text

    first = run_sweep(
        sweep_engine, SweepOptions(workers=1, top=3, resume=False), worker=fake_worker
    )
    assert (first.models, first.units) == (3, 1)
    with sweep_engine.begin() as conn:  # make the sweep look unfinished, with top=None options
        conn.execute(text("UPDATE sweep SET status = 'running', key = :k"), {"k": "x"})
    from hfadapt.sweep.store import sweep_key

    options_key = None
    with sweep_engine.connect() as conn:
        options_key = conn.execute(text("SELECT options FROM sweep")).scalar()
    import json

    opts = json.loads(options_key)
    opts["top"] = None
    with sweep_engine.begin() as conn:
        conn.execute(text("UPDATE sweep SET key = :k"), {"k": sweep_key(opts)})
    second = run_sweep(sweep_engine, SweepOptions(workers=1), worker=fake_worker)
    assert second.resumed and second.sweep_id == first.sweep_id and second.already_done == 3
    assert (second.models, second.reused, second.judged) == (13, 1, 4), second
    with sweep_engine.connect() as conn:
        rows = dict(
            conn.execute(
                text("SELECT model_id, json_extract(evidence, '$.sweep.representative') FROM run")
            ).all()
        )
    assert rows["org/bert-a4"] == "org/bert-a0" and len(rows) == 13


def test_a_sweep_whose_driver_is_alive_is_not_resumed(sweep_engine: Any, fake_worker: str) -> None:
    from sqlalchemy import text

    from hfadapt.errors import UsageError

    first = run_sweep(
        sweep_engine, SweepOptions(workers=1, top=3, resume=False), worker=fake_worker
    )
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with sweep_engine.begin() as conn:  # as if another driver were running it now
            conn.execute(
                text("UPDATE sweep SET status = 'running', driver_pid = :p"), {"p": other.pid}
            )
        with pytest.raises(
            UsageError,
            match=f"sweep {first.sweep_id} is being run right now by process {other.pid}",
        ):
            run_sweep(sweep_engine, SweepOptions(workers=1, top=3), worker=fake_worker)
    finally:
        other.kill()
        other.wait()
    again = run_sweep(
        sweep_engine, SweepOptions(workers=1, top=3), worker=fake_worker
    )  # its driver is gone
    assert again.resumed and again.sweep_id == first.sweep_id and again.judged == 0
