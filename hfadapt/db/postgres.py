"""PostgreSQL as the database (``--db postgresql://user:password@host:5432/hfadapt``): a results
database a team shares, written by sweeps from several drivers. SQLite (runs.db) stays the
default; docs/database.md says when to move.

The driver is psycopg 3 (the optional extra ``postgres``: ``pip install '.[postgres]'``):
``postgresql://`` and ``postgres://`` URLs use it; a URL naming another driver (``postgresql+pg8000://``) is taken as
written. Every session runs in UTC (the time zone hfadapt's timestamps are written in) and asks
the server to probe an idle client with TCP keepalives, so the locks of a driver whose machine
died are released within about two minutes.

Where SQLite serialises writers with ``BEGIN IMMEDIATE``, PostgreSQL gets advisory locks:
``lock_migrations`` (one migrating process at a time, for the migration transaction) and
``try_lock``/``unlock`` (a lock held on a connection of its own for as long as a process
drives a sweep; the server drops it when that process dies, kill -9 included). This module
imports no other part of hfadapt.db, so the engine and the migrations may both call it."""

from __future__ import annotations

import os
import weakref
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.engine import URL, Connection, Engine, make_url
from sqlmodel import create_engine

from hfadapt.db.integrity import load_json
from hfadapt.errors import DatabaseUnavailableError, StoreError

DRIVER = "postgresql+psycopg"
# Advisory lock keys are (namespace, key) pairs of int4: hfadapt's namespaces.
MIGRATIONS_LOCK = 0x68666D67  # "hfmg": migrating the schema
SWEEP_LOCK = 0x68667377  # "hfsw": driving sweep <key>
CYCLE_LOCK = 0x68666379  # "hfcy": running a cycle (key 0: one at a time per database)
CONNECT_TIMEOUT_S = 10
# Server settings for every session: UTC, and a dead client noticed after 60 + 6 * 10 s.
_SESSION_OPTIONS = (
    "-c timezone=UTC -c tcp_keepalives_idle=60 -c tcp_keepalives_interval=10 "
    "-c tcp_keepalives_count=6"
)

__all__ = [
    "CYCLE_LOCK",
    "DRIVER",
    "MIGRATIONS_LOCK",
    "SWEEP_LOCK",
    "is_postgres",
    "lock_migrations",
    "postgres_engine",
    "translate_postgres_error",
    "try_lock",
    "unlock",
]


def is_postgres(url: str | URL) -> bool:
    """Whether ``url`` names a PostgreSQL database (any driver, ``postgres://`` included)."""
    parsed = make_url(url) if isinstance(url, str) else url
    return parsed.drivername.split("+", 1)[0] in ("postgresql", "postgres")


def driver_url(url: URL) -> URL:
    """``url`` with psycopg as its driver unless it names one."""
    driver = url.drivername.partition("+")[2]
    return url.set(drivername=f"postgresql+{driver}" if driver else DRIVER)


def postgres_engine(url: URL) -> Engine:
    """An engine for the PostgreSQL database at ``url`` (nothing is connected yet)."""
    url = driver_url(url)
    shown = url.render_as_string(hide_password=True)
    if url.get_driver_name() == "psycopg":
        try:
            import psycopg  # noqa: F401
        except ImportError as exc:
            raise DatabaseUnavailableError(
                f"database {shown} is PostgreSQL, whose driver is not installed: "
                "pip install '.[postgres]' in the hfadapt checkout (the driver: psycopg[binary] 3)"
            ) from exc
    connect_args: dict[str, Any] = {}
    if url.get_driver_name() == "psycopg":
        # Settings the URL gives (?options=..., ?connect_timeout=...) win over these defaults.
        defaults = {
            "options": _SESSION_OPTIONS,
            "connect_timeout": CONNECT_TIMEOUT_S,
            "application_name": "hfadapt",
        }
        connect_args = {k: v for k, v in defaults.items() if k not in url.query}
    try:
        engine = create_engine(
            url, pool_pre_ping=True, connect_args=connect_args, json_deserializer=load_json
        )
    except (ImportError, sa_exc.ArgumentError, sa_exc.NoSuchModuleError) as exc:
        raise DatabaseUnavailableError(f"cannot use database {shown}: {exc}") from exc
    _forget_connections_after_fork(engine)
    return engine


def _forget_connections_after_fork(engine: Engine) -> None:
    """A child made by fork() must not talk on its parent's connections (they would both
    speak on one socket): it drops the pool it inherited, unclosed (SQLAlchemy's recipe)."""
    ref = weakref.ref(engine)

    def in_child() -> None:
        inherited = ref()
        if inherited is not None:
            inherited.dispose(close=False)

    os.register_at_fork(after_in_child=in_child)


def lock_migrations(conn: Connection) -> None:
    """Wait for, then hold until ``conn``'s transaction ends, the lock of migrating."""
    conn.execute(text("SELECT pg_advisory_xact_lock(:ns, 0)"), {"ns": MIGRATIONS_LOCK})


def try_lock(engine: Engine, namespace: int, key: int) -> Connection | None:
    """A connection of its own holding the advisory lock (namespace, key), or None when
    another session holds it. The lock lasts until ``unlock`` or the end of this process.
    The connection is in autocommit: it never sits idle inside a transaction."""
    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    try:
        got = conn.execute(
            text("SELECT pg_try_advisory_lock(:ns, :key)"), {"ns": namespace, "key": key}
        ).scalar()
    except BaseException:
        conn.close()
        raise
    if not got:
        conn.close()
        return None
    return conn


def unlock(conn: Connection, namespace: int, key: int) -> None:
    """Release a lock ``try_lock`` took and give its connection back (or drop the connection
    when the release fails: closing the session releases the lock all the same)."""
    try:
        conn.execute(text("SELECT pg_advisory_unlock(:ns, :key)"), {"ns": namespace, "key": key})
    except sa_exc.SQLAlchemyError:
        conn.invalidate()
    finally:
        conn.close()


def translate_postgres_error(exc: BaseException, where: str) -> StoreError | None:
    """The one-line StoreError for a PostgreSQL failure a user can act on, or None for a bug."""
    orig = getattr(exc, "orig", None) or exc
    reason = " ".join(str(orig).split())
    text_ = reason.lower()
    sqlstate = str(getattr(orig, "sqlstate", "") or "")
    if sqlstate == "42501" or "permission denied" in text_:  # insufficient_privilege
        return DatabaseUnavailableError(
            f"database {where}: {reason}: this role may not write here (read-only commands "
            "still work); use a role that may"
        )
    if (
        sqlstate == "25006"
    ):  # read_only_sql_transaction: a standby, or default_transaction_read_only
        return DatabaseUnavailableError(
            f"database {where} is read-only ({reason}): point --db at the primary server"
        )
    if sqlstate in ("23505", "40001", "40P01"):  # unique violation, serialization, deadlock
        return DatabaseUnavailableError(
            f"database {where}: another process wrote the same rows at the same time ({reason}); "
            "run the command again"
        )
    if isinstance(exc, sa_exc.OperationalError) or sqlstate.startswith("08"):
        return DatabaseUnavailableError(f"cannot use database {where}: {reason}")
    return None
