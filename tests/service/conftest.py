"""hfadapt as a service: ``hfadapt cycle`` (crawl, sweep, compare, report; its lock and resume)
and ``hfadapt serve`` (the read-only API and dashboard). The shared fixtures this part's tests
use: the stand-in sweep worker; ``history_db``, three completed cycles (tests/support); and
``two_real_cycles``, the issue's two real ``hfadapt cycle --offline --top 30`` on one database,
run once per session for the slow tests that check them (test_cycle.py, test_serve.py), once
under pytest-xdist too (the first worker to need them runs them, a later one reads what they
returned)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from support.cycle_history import write_history
from support.once import once_per_run
from support.sweeps import fake_worker

__all__ = ["fake_worker", "history_db", "two_real_cycles"]

# leaving it out flips the BERT-family models of the top 30 that it makes pass (measured: 18)
LEFT_OUT = "attention-mask-host-helper"
CYCLE_WORKERS = 2  # the machine's cores; the verdicts do not depend on it


@dataclass(frozen=True)
class CycleRun:
    """One ``hfadapt cycle`` process: its exit code, stdout, stderr and wall seconds."""

    code: int
    out: str
    err: str
    seconds: float


@dataclass(frozen=True)
class TwoCycles:
    """The database after ``first`` (``--json``) and ``second`` (``--without-adapter
    LEFT_OUT --html html``), both ``hfadapt cycle --offline --top 30``."""

    db: Path
    html: Path
    left_out: str
    first: CycleRun
    second: CycleRun


@pytest.fixture
def history_db(tmp_path: Path) -> Path:
    """runs.db with three completed cycles (support.cycle_history.HISTORY says what they hold)."""
    return write_history(tmp_path / "history.db")


def _cycle(args: list[str], env: dict[str, str]) -> CycleRun:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "hfadapt", "cycle", *args],
                          capture_output=True, text=True, env=env, timeout=3000)  # fmt: skip
    return CycleRun(done.returncode, done.stdout, done.stderr, time.perf_counter() - started)


def _two_cycles(root: Path) -> TwoCycles:
    """The two cycles, as real processes, on one new database in ``root``: the first with
    ``--json``, the second with an adapter left out (exit 4 expected, the tests check it). They
    run with CYCLE_WORKERS workers and the compile cache on (in a folder of their own): the
    second cycle reuses the first's graphs wherever leaving the adapter out changes nothing, as
    a weekly cycle does (a sweep never reads the CPU reference cache: each model is judged once
    per sweep). The environment is the tests' (tests/conftest.py): HF folders of its own, no HF
    token, $HFADAPT_HOME in the session folder."""
    hf_home = root / "hf_home"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(
        HF_HOME=str(hf_home), HF_HUB_CACHE=str(hf_home / "hub"),
        HF_ASSETS_CACHE=str(hf_home / "assets"), HF_XET_CACHE=str(hf_home / "xet"),
        HF_TOKEN_PATH=str(hf_home / "token"), HF_STORED_TOKENS_PATH=str(hf_home / "stored_tokens"),
        HFADAPT_HOME=str(root / "hfadapt_home"), HFADAPT_DB=str(root / "unused.db"),
        HFADAPT_CACHE_DIR=str(root / "cache"), HFADAPT_COMPILE_CACHE="1",
        HFADAPT_REFERENCE_CACHE="1", COLUMNS="220", OMP_NUM_THREADS="1",
    )  # fmt: skip
    env.pop("HFADAPT_ADAPTERS_PATH", None)
    db, html = root / "runs.db", root / "two.html"
    base = ["--offline", "--top", "30", "--workers", str(CYCLE_WORKERS), "--db", str(db)]
    first = _cycle([*base, "--json"], env)
    second = _cycle([*base, "--without-adapter", LEFT_OUT, "--html", str(html)], env)
    return TwoCycles(db, html, LEFT_OUT, first, second)


def _record(folder: Path, cycles: TwoCycles) -> None:
    data = {**asdict(cycles), "db": str(cycles.db), "html": str(cycles.html)}
    (folder / "cycles.json").write_text(json.dumps(data))


def _read(folder: Path) -> TwoCycles:
    data: dict[str, Any] = json.loads((folder / "cycles.json").read_text())
    return TwoCycles(Path(data["db"]), Path(data["html"]), data["left_out"],
                     CycleRun(**data["first"]), CycleRun(**data["second"]))  # fmt: skip


@pytest.fixture(scope="session")
def two_real_cycles(tmp_path_factory: pytest.TempPathFactory) -> TwoCycles:
    """The two cycles of ``_two_cycles``, once per test session. Under pytest-xdist each worker
    has its own session, and worksteal may hand test_cycle.py and test_serve.py to different
    workers: the first worker to need the cycles runs them in the session's shared temp folder
    under a lock and writes what they returned beside them; a worker that needs them later
    waits for that lock and reads the record (pytest-xdist's recipe for a session fixture run
    once), instead of running two more cycles (~3 minutes of both cores)."""
    return once_per_run(tmp_path_factory, "two-cycles", _two_cycles, _record, _read)
