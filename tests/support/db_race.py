"""Processes racing on one SQLite database, forked from a small process of their own.

A test worker that has loaded torch and judged models holds gigabytes: forking it 320 times
copied its page tables each time and took 62 s of a core, where the same rounds forked from
a process holding only hfadapt.db take 8 s (measured on the project's machine). The test starts
one fresh interpreter (multiprocessing's spawn) that runs the rounds and reports the exit codes;
the racing processes themselves are forks, as a sweep's writers are.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from sqlalchemy import func
from sqlmodel import select

from hfadapt.db.engine import get_engine, session
from hfadapt.db.tables import Run

__all__ = ["race_from_a_small_process"]

Codes = list[int | None]


def _open_and_write(url: str, worker: int) -> None:
    engine = get_engine(url)
    with session(engine) as sess:
        sess.add(Run(model_id=f"w{worker}", verdict="pass"))
    engine.dispose()


def _write_rows(url: str, worker: int, rows: int) -> None:
    engine = get_engine(url)
    for i in range(rows):
        # read, then write, in one transaction: the pattern that loses rows under WAL with
        # BEGIN DEFERRED
        with session(engine) as sess:
            sess.exec(select(func.count()).select_from(Run)).one()
            sess.add(Run(model_id=f"w{worker}-{i}", verdict="pass"))
    engine.dispose()


def _round(url: str, processes: int, rows: int) -> Codes:
    """``processes`` forks open ``url`` at once; each writes one row, or ``rows`` rows each
    read first when ``rows`` is set. Their exit codes."""
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=_write_rows, args=(url, w, rows))
        if rows
        else ctx.Process(target=_open_and_write, args=(url, w))
        for w in range(processes)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    return [p.exitcode for p in procs]


def _rounds(urls: list[str], processes: int, rows: int, out: str) -> None:
    Path(out).write_text(json.dumps([_round(url, processes, rows) for url in urls]))


def race_from_a_small_process(urls: list[Path], processes: int, rows: int = 0) -> list[Codes]:
    """For each of ``urls`` (new databases), one round of ``processes`` racing writers (see
    ``_round``), run from a fresh interpreter that imports only this module; the exit codes of
    each round's writers."""
    out = urls[0].with_name("race-codes.json")
    args = ([str(u) for u in urls], processes, rows, str(out))
    launcher = multiprocessing.get_context("spawn").Process(target=_rounds, args=args)
    launcher.start()
    launcher.join(timeout=600)
    if launcher.is_alive():
        launcher.kill()
    assert launcher.exitcode == 0, f"the launcher exited {launcher.exitcode}"
    codes: list[Codes] = json.loads(out.read_text())
    return codes
