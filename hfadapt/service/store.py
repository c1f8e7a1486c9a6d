"""The ``cycle`` table and its lock: one row per cycle; a running row, with the host and pid
of the process that drives it and a heartbeat, keeps a second cycle from starting on the same
database. The claim is one write transaction (SQLite: BEGIN IMMEDIATE), so two cycles started
together cannot both take it; on PostgreSQL an advisory lock, held until ``finish_cycle`` (or
the process's death), is what decides, as for sweeps (hfadapt.sweep.store)."""

from __future__ import annotations

import json
import os
import platform
from datetime import UTC, datetime, timedelta

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Session, col

from hfadapt.db.engine import describe, session
from hfadapt.db.tables import DONE, FAILED, INTERRUPTED, RUNNING, Cycle, utcnow
from hfadapt.errors import UsageError
from hfadapt.untrusted import hide_url_credentials, one_line

__all__ = [
    "LEASE",
    "claim_cycle",
    "finish_cycle",
    "heartbeat",
    "last_done_cycle",
]

# A running cycle of another host whose heartbeat is older than this is taken as dead (its
# machine went away); on this host the pid says it, at once.
LEASE = timedelta(minutes=30)

# database -> the PostgreSQL connection holding the cycle lock
_held: dict[str, Connection] = {}


def cycle_key(options: dict[str, object]) -> str:
    """The identity of a cycle's options: same key, same cycle to resume."""
    return json.dumps(options, sort_keys=True, default=str)


def _aware(moment: datetime | None) -> datetime | None:
    # SQLite gives back naive datetimes; every one hfadapt writes is UTC
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def _alive(row: Cycle, now: datetime) -> bool:
    """Whether the running cycle ``row`` is driven by a live process."""
    if row.status != RUNNING:
        return False
    if row.host != platform.node():
        beat = _aware(row.heartbeat_at or row.started_at)
        return beat is not None and now - beat < LEASE
    pid = row.driver_pid
    if not pid or pid == os.getpid():
        return False  # none recorded, or this process's own (a reused pid): not another cycle
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False  # killed (kill -9, a crash): its cycle can be resumed
    except PermissionError:
        pass  # alive, another user's
    return True


def _refuse(row: Cycle) -> UsageError:
    return UsageError(
        f"cycle {row.id} is running right now (process {row.driver_pid} on {row.host}, started "
        f"{row.started_at:%Y-%m-%d %H:%M} UTC): two cycles never run at once on one database; "
        "wait for it to end"
    )


def claim_cycle(engine: Engine, options: dict[str, object], *, resume: bool) -> tuple[Cycle, bool]:
    """(the cycle this process now drives, whether it resumes an unfinished one). A cycle
    another live process runs is refused (UsageError); ``resume``: continue the newest
    unfinished cycle with the same options, else start a new one."""
    from hfadapt.db.postgres import CYCLE_LOCK, is_postgres, try_lock

    where = describe(engine)
    if is_postgres(engine.url) and where not in _held:
        held = try_lock(engine, CYCLE_LOCK, 0)
        if held is None:
            with session(engine, write=False) as sess:
                row = _newest_running(sess)
            raise (
                _refuse(row)
                if row is not None
                else UsageError(
                    "another cycle is running right now on this database; wait for it to end"
                )
            )
        _held[where] = held
    try:
        with session(engine) as sess:
            return _claim(sess, cycle_key(options), options, resume)
    except BaseException:
        release(engine)
        raise


def _newest_running(sess: Session) -> Cycle | None:
    stmt = select(Cycle).where(col(Cycle.status) == RUNNING).order_by(col(Cycle.id).desc())
    return sess.execute(stmt.limit(1)).scalars().first()


def _claim(sess: Session, key: str, options: dict[str, object], resume: bool) -> tuple[Cycle, bool]:
    now = utcnow()
    running = sess.execute(select(Cycle).where(col(Cycle.status) == RUNNING)).scalars().all()
    for row in running:
        if _alive(row, now):
            raise _refuse(row)
        row.status, row.error = INTERRUPTED, "its driver stopped (found dead by a later cycle)"
        sess.add(row)
    found = None
    if resume:
        stmt = (
            select(Cycle)
            .where(col(Cycle.key) == key, col(Cycle.status).in_((FAILED, INTERRUPTED)))
            .order_by(col(Cycle.id).desc())
        )
        found = sess.execute(stmt.limit(1)).scalars().first()
        newest = (
            sess.execute(select(Cycle).order_by(col(Cycle.id).desc()).limit(1)).scalars().first()
        )
        if found is not None and newest is not None and newest.id != found.id:
            found = None  # a later cycle ran since: this one's ranking is not current any more
    row = found or Cycle(key=key, options=options)
    row.status, row.error = RUNNING, None
    row.host, row.driver_pid, row.heartbeat_at = platform.node(), os.getpid(), now
    row.resumes += 1 if found is not None else 0
    sess.add(row)
    sess.flush()
    return row, found is not None


def heartbeat(engine: Engine, cycle_id: int, **columns: object) -> None:
    """Renew the cycle's lease, and record ``columns`` (its crawl, its sweep) as they come."""
    with session(engine) as sess:
        row = sess.get(Cycle, cycle_id)
        assert row is not None
        row.heartbeat_at = utcnow()
        for name, value in columns.items():
            setattr(row, name, value)
        sess.add(row)


def finish_cycle(
    engine: Engine,
    cycle_id: int,
    *,
    seconds: float,
    status: str = DONE,
    error: str | None = None,
    **columns: object,
) -> Cycle:
    """Record how the cycle ended, then let the next one start."""
    try:
        with session(engine) as sess:
            row = sess.get(Cycle, cycle_id)
            assert row is not None
            row.status = status
            row.error = hide_url_credentials(one_line(error, 500)) if error else None
            row.seconds = round(row.seconds + seconds, 3)
            for name, value in columns.items():
                setattr(row, name, value)
            if status == DONE:
                row.finished_at = utcnow()
            sess.add(row)
            sess.flush()
            return row
    finally:
        release(engine)


def release(engine: Engine) -> None:
    """Drop the PostgreSQL cycle lock this process holds (SQLite: nothing to do)."""
    from hfadapt.db.postgres import CYCLE_LOCK, unlock

    held = _held.pop(describe(engine), None)
    if held is not None:
        unlock(held, CYCLE_LOCK, 0)


def last_done_cycle(engine: Engine, *, before: int) -> Cycle | None:
    """The newest completed cycle older than cycle ``before`` that recorded a sweep."""
    stmt = (
        select(Cycle)
        .where(col(Cycle.status) == DONE, col(Cycle.id) < before, col(Cycle.sweep_id).is_not(None))
        .order_by(col(Cycle.id).desc())
        .limit(1)
    )
    with session(engine, write=False) as sess:
        return sess.execute(stmt).scalars().first()
