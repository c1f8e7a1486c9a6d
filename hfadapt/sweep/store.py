"""The ``sweep`` table and how a sweep is stored: one ``Sweep`` row per batch run (options,
status, counts), one ``Run`` row per model with ``sweep_id`` set. Only the sweep driver calls
these; every unit of work is written in one transaction, so a driver killed at any moment
leaves whole units or nothing, and resuming never duplicates a row."""

from __future__ import annotations

import json
import os
import platform
from collections import Counter
from typing import Any

from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Session

from hfadapt.db.census import get_sweep, latest_sweep, list_sweeps
from hfadapt.db.engine import describe, session
from hfadapt.db.tables import DONE, FAILED, INTERRUPTED, RUNNING, Run, Sweep, utcnow
from hfadapt.judge.environment import distinct
from hfadapt.judge.evidence_types import read_evidence
from hfadapt.untrusted import hide_url_credentials, one_line

__all__ = [
    "DONE",
    "FAILED",
    "INTERRUPTED",
    "RUNNING",
    "Sweep",
    "done_rows",
    "finish_sweep",
    "get_sweep",
    "latest_sweep",
    "list_sweeps",
    "open_sweep",
    "release_sweep",
    "resumable_sweep",
    "sweep_environments",
    "write_rows",
]


def sweep_key(options: dict[str, object]) -> str:
    """The identity of a sweep's options: same key, same sweep to resume."""
    return json.dumps(options, sort_keys=True, default=str)


def open_sweep(
    engine: Engine, options: dict[str, object], *, resume: bool | int, **columns: object
) -> tuple[Sweep, bool]:
    """(the sweep to write into, whether it was resumed).

    ``resume``: True resumes the newest unfinished sweep with the same options; an int resumes
    that sweep id; False always starts a new one. A sweep another driver is running is
    refused (UsageError); on PostgreSQL this process holds the sweep's lock until
    ``finish_sweep``.
    """
    key = sweep_key(options)
    claimed: list[int] = []
    try:
        return _open(engine, options, key, resume, columns, claimed)
    except BaseException:
        for sweep_id in claimed:  # the sweep was not opened after all
            release_sweep(engine, sweep_id)
        raise


def _open(
    engine: Engine,
    options: dict[str, Any],
    key: str,
    resume: bool | int,
    columns: dict[str, Any],
    claimed: list[int],
) -> tuple[Sweep, bool]:
    with session(engine) as sess:
        found = _resumable(sess, key, resume)
        if found is not None:
            _claim(engine, found, claimed)
            found.resumes += 1
            found.status = RUNNING
            found.error = None
            found.host, found.driver_pid = platform.node(), os.getpid()
            for name, value in columns.items():
                setattr(found, name, value)
            sess.add(found)
            sess.flush()
            return found, True
        sweep = Sweep(
            key=key, options=options, host=platform.node(), driver_pid=os.getpid(), **columns
        )
        sess.add(sweep)
        sess.flush()
        _claim(engine, sweep, claimed)
        return sweep, False


def _resumable(sess: Session, key: str, resume: bool | int) -> Sweep | None:
    """The sweep ``resume`` names (see ``open_sweep``), or None for a new one."""
    from hfadapt.errors import UsageError

    if resume is not False and not isinstance(resume, bool):
        found = sess.get(Sweep, int(resume))
        if found is None:
            raise UsageError(f"no sweep {resume} to resume")
        if found.key != key:
            raise UsageError(
                f"sweep {resume} was run with other options ({found.key}); pass the same options to resume it"
            )
        return found
    if not resume:
        return None
    stmt = (
        select(Sweep)
        .where(Sweep.key == key, Sweep.status != DONE)  # type: ignore[arg-type]
        .order_by(Sweep.id.desc())  # type: ignore[union-attr]
        .limit(1)
    )
    return sess.execute(stmt).scalars().first()


def resumable_sweep(
    engine: Engine, options: dict[str, object], *, resume: bool | int
) -> Sweep | None:
    """The sweep ``open_sweep`` with these arguments would resume (None: it would start a new
    one), read without claiming or changing anything; UsageError as ``open_sweep``'s."""
    with session(engine, write=False) as sess:
        return _resumable(sess, sweep_key(options), resume)


def sweep_environments(engine: Engine, sweep_id: int) -> list[dict[str, str]]:
    """The distinct environments (``versions`` of hfadapt.judge.environment) the sweep's runs
    recorded, oldest first; rows that recorded none (skipped, custom code, a crashed worker)
    are left out."""
    run: Table = Run.__table__  # type: ignore[attr-defined]
    stmt = select(run.c.versions).where(run.c.sweep_id == sweep_id).order_by(run.c.id)
    with session(engine, write=False) as sess:
        return distinct(sess.execute(stmt).scalars())


# (database, sweep id) -> the PostgreSQL connection holding the lock of driving that sweep
_claims: dict[tuple[str, int], Connection] = {}


def _claim(engine: Engine, sweep: Sweep, claimed: list[int]) -> None:
    """Refuse a sweep another driver is running; on PostgreSQL, hold its lock from now on.

    SQLite (one machine): the driver's process id and host, recorded on the sweep, say
    whether it runs. PostgreSQL (drivers on several machines): an advisory lock, held by this
    process until ``finish_sweep`` (or its death), says it; the pid cannot."""
    from hfadapt.db.postgres import SWEEP_LOCK, is_postgres, try_lock
    from hfadapt.errors import UsageError

    assert sweep.id is not None
    if not is_postgres(engine.url):
        _refuse_live(sweep)
        return
    key = (describe(engine), sweep.id)
    if key in _claims:  # this process drives it already
        return
    held = try_lock(engine, SWEEP_LOCK, sweep.id)
    if held is None:
        raise UsageError(
            f"sweep {sweep.id} is being run right now by process {sweep.driver_pid} on "
            f"{sweep.host}; wait for it, or start a new sweep instead of resuming (resume=False)"
        )
    _claims[key] = held
    claimed.append(sweep.id)


def release_sweep(engine: Engine, sweep_id: int) -> None:
    """Let other drivers resume the sweep (PostgreSQL: drop its lock; SQLite: nothing to do)."""
    from hfadapt.db.postgres import SWEEP_LOCK, unlock

    held = _claims.pop((describe(engine), sweep_id), None)
    if held is not None:
        unlock(held, SWEEP_LOCK, sweep_id)


def _refuse_live(sweep: Sweep) -> None:
    """A running sweep whose driver is alive on this machine is not resumed by another."""
    from hfadapt.errors import UsageError

    pid = sweep.driver_pid
    if sweep.status != RUNNING or not pid or pid == os.getpid() or sweep.host != platform.node():
        return
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return  # killed (kill -9, a crash): resume it
    except PermissionError:
        pass  # alive, another user's
    raise UsageError(
        f"sweep {sweep.id} is being run right now by process {pid}; wait for it, or start a new sweep instead of resuming (resume=False)"
    )


def done_rows(engine: Engine, sweep_id: int) -> dict[str, dict[str, Any]]:
    """model_id -> the stored row (as a dict) of every model this sweep has judged already."""
    run: Table = Run.__table__  # type: ignore[attr-defined]
    with session(engine, write=False) as sess:
        result = sess.execute(select(run).where(run.c.sweep_id == sweep_id).order_by(run.c.id))
        return {row["model_id"]: dict(row) for row in result.mappings()}


def write_rows(
    engine: Engine, sweep_id: int, rows: list[dict[str, object]], *, judged: int = 0
) -> list[int]:
    """Insert ``rows`` (Run columns) in one transaction; returns the representative's id
    (empty when no row is marked ``"representative": True``). The other rows then point at
    that id in ``evidence["sweep"]["representative_run"]``.
    """
    run: Table = Run.__table__  # type: ignore[attr-defined]
    sweeps: Table = Sweep.__table__  # type: ignore[attr-defined]
    names = [c.name for c in run.columns if c.name != "id"]
    # Columns that may not be NULL take the table's default (execution "eager", dtype "fp16"...).
    defaults: dict[str, Any] = {}
    for column in run.columns:
        arg = getattr(column.default, "arg", None)
        if not column.nullable and arg is not None and not callable(arg):
            defaults[column.name] = arg
    now = utcnow()

    def values(row: dict[str, object]) -> dict[str, Any]:
        out = {name: row.get(name) for name in names}
        for name, default in defaults.items():
            if out[name] is None:
                out[name] = default
        out["sweep_id"] = sweep_id
        out["started_at"] = out["started_at"] or now
        out["finished_at"] = out["finished_at"] or now
        return out

    ids: list[int] = []
    with engine.begin() as conn:
        first = [r for r in rows if r.get("representative")][:1]
        rep_id: int | None = None
        if first:
            key = conn.execute(insert(run).values(**values(first[0]))).inserted_primary_key
            assert key is not None
            rep_id = int(key[0])
            ids.append(rep_id)
        others = [values(r) for r in rows if r is not (first[0] if first else None)]
        for row in others:
            evidence = read_evidence(row.get("evidence"))
            sweep_ev = evidence.get("sweep")
            if rep_id is not None and isinstance(sweep_ev, dict):
                evidence["sweep"] = {**sweep_ev, "representative_run": rep_id}
                row["evidence"] = evidence
        if others:
            # executemany: one statement for every member of a unit (thousands for BERT).
            conn.execute(insert(run), others)
        if judged:
            conn.execute(
                update(sweeps)
                .where(sweeps.c.id == sweep_id)
                .values(judged=sweeps.c.judged + judged)
            )
    return ids


def verdict_counts(engine: Engine, sweep_id: int) -> dict[str, int]:
    run: Table = Run.__table__  # type: ignore[attr-defined]
    stmt = (
        select(run.c.verdict, func.count())
        .where(run.c.sweep_id == sweep_id)
        .group_by(run.c.verdict)
    )
    with session(engine, write=False) as sess:
        counts = Counter({str(v): int(n) for v, n in sess.execute(stmt)})
    return dict(counts.most_common())


def finish_sweep(
    engine: Engine, sweep_id: int, *, seconds: float, status: str = DONE, error: str | None = None
) -> Sweep:
    """Mark the sweep finished (or failed), add this session's wall time, store the counts;
    then other drivers may resume it."""
    try:
        counts = verdict_counts(engine, sweep_id)
        with session(engine) as sess:
            sweep = sess.get(Sweep, sweep_id)
            assert sweep is not None
            sweep.status = status
            # the exception's text: stored without control characters or a URL's password
            sweep.error = hide_url_credentials(one_line(error, 500)) if error else None
            sweep.seconds = round(sweep.seconds + seconds, 3)
            sweep.counts = counts
            if status == DONE:
                sweep.finished_at = utcnow()
            sess.add(sweep)
            sess.flush()
            return sweep
    finally:
        release_sweep(engine, sweep_id)
