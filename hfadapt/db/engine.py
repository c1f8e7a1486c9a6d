"""Where runs.db lives and how it is opened: one engine factory, a session helper, and the
one-line errors a user sees when the database cannot be used.

SQLite is the default (``sqlite:///runs.db`` in the working directory; ``$HFADAPT_DB`` or an
explicit URL or path overrides it). It runs in WAL mode with a busy timeout, and every
transaction hfadapt opens starts with ``BEGIN IMMEDIATE``, so several processes (sweep workers)
can write at once without losing rows: writers queue for the lock instead of failing (with
BEGIN DEFERRED, a transaction that reads before it writes fails under contention). Sessions that
only read pass ``write=False`` and never wait. Create engines per process; an engine inherited
through fork() opens fresh connections. A ``postgresql://`` URL opens a shared PostgreSQL
database instead (hfadapt.db.postgres).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, inspect
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.pool import StaticPool
from sqlmodel import Session, create_engine

from hfadapt.db.integrity import check_header, load_json, quick_check
from hfadapt.db.postgres import is_postgres, postgres_engine, translate_postgres_error
from hfadapt.db.urls import DEFAULT_URL, ENV_VAR, describe, resolve_url, sqlite_path
from hfadapt.errors import DatabaseUnavailableError, StoreError, UsageError, option
from hfadapt.untrusted import hide_url_credentials

DB_OPTION = option("db")  # the parameter, shown as its flag by the CLI

# A sweep worker may wait this long for another process's write to finish before giving up.
BUSY_TIMEOUT_S = 60.0
# Execution option read by the "begin" hook below: IMMEDIATE (default) or DEFERRED (readers).
BEGIN_OPTION = "hfadapt_sqlite_begin"

__all__ = [
    "BUSY_TIMEOUT_S",
    "DEFAULT_URL",
    "ENV_VAR",
    "describe",
    "get_engine",
    "require_schema",
    "resolve_url",
    "session",
    "sqlite_path",
    "translate_db_error",
]


def get_engine(url: str | None = None, *, migrate: bool = True) -> Engine:
    """Open (and by default migrate) the database at ``url`` (see ``resolve_url``).

    Raises DatabaseUnavailableError for a corrupt (SQLite's quick_check), read-only or
    unreachable database, or one whose folder does not exist, and SchemaVersionError for one
    written by a newer hfadapt or one that cannot be migrated; in every case the file is left
    exactly as it was and nothing is created.
    """
    resolved = resolve_url(url)
    try:
        parsed = make_url(resolved)
    except (sa_exc.ArgumentError, ValueError) as exc:  # ValueError: a port that is no number
        shown = hide_url_credentials(resolved)
        raise DatabaseUnavailableError(
            f"{shown!r} is not a database URL or path ({hide_url_credentials(str(exc))})"
        ) from exc

    if parsed.drivername.startswith("sqlite"):
        engine = _sqlite_engine(parsed)
    elif is_postgres(parsed):
        engine = postgres_engine(parsed)
    else:
        try:
            engine = create_engine(parsed, pool_pre_ping=True, json_deserializer=load_json)
        except (ImportError, sa_exc.ArgumentError, sa_exc.NoSuchModuleError) as exc:
            raise DatabaseUnavailableError(
                f"cannot use database {describe(resolved)}: {exc}"
            ) from exc

    if migrate:
        from hfadapt.db.migrations import migrate as run_migrations

        try:
            run_migrations(engine)
        except StoreError:
            engine.dispose()
            raise
        except sa_exc.SQLAlchemyError as exc:
            engine.dispose()
            raise (translate_db_error(exc, engine) or _generic(exc, engine)) from exc
    if sqlite_path(engine.url) is not None:
        _enable_wal(engine)
    return engine


def _enable_wal(engine: Engine) -> None:
    # After migrating, not on connect: switching to WAL rewrites the file header, and a database
    # we refuse (newer, unmigratable) must stay byte-identical. The mode is stored in the file.
    # The switch takes an exclusive lock, and where two connections both hold the shared lock
    # and ask for it, SQLite answers "database is locked" at once instead of calling its busy
    # handler (it would deadlock: https://www.sqlite.org/c3ref/busy_handler.html). Processes
    # opening one new database together meet exactly that, so the switch is tried again until
    # the busy timeout has passed, as every other lock is waited for.
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    delay = 0.01
    while True:
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.close()
            return
        except Exception as exc:  # a raw sqlite3 error: SQLAlchemy does not wrap cursor calls here
            if not _locked(exc) or time.monotonic() >= deadline:
                raise (translate_db_error(exc, engine) or _generic(exc, engine)) from exc
        finally:
            raw.close()
        time.sleep(delay)
        delay = min(2 * delay, 0.5)


def _locked(exc: BaseException) -> bool:
    """Whether SQLite said the database (or a table) is locked by another connection."""
    text = str(getattr(exc, "orig", None) or exc).lower()
    return "database is locked" in text or "database table is locked" in text


def _sqlite_engine(url: URL) -> Engine:
    path = sqlite_path(url)
    if path is not None:
        _check_sqlite_file(path)
    connect_args: dict[str, Any] = {"timeout": BUSY_TIMEOUT_S, "check_same_thread": False}
    kwargs: dict[str, Any] = {"connect_args": connect_args, "json_deserializer": load_json}
    if path is None:
        # One shared connection, or every session would see its own empty in-memory database.
        kwargs["poolclass"] = StaticPool
    engine = create_engine(url, **kwargs)
    _install_sqlite_hooks(engine)
    if path is not None and path.exists() and path.stat().st_size:
        quick_check(engine)  # before anything writes: a damaged file is refused untouched
    return engine


def _check_sqlite_file(path: Path) -> None:
    """Refuse, before SQLite touches it, a file we could only damage or fail on half-way."""
    where = str(path)
    if path.is_dir():
        raise DatabaseUnavailableError(
            f"database {where} is a directory: pass {DB_OPTION} with a file path"
        )
    if path.exists():
        # Root may write to a file with no write bits; we still treat it as read-only: its owner said so.
        if not os.access(path, os.W_OK) or not path.stat().st_mode & 0o222:
            raise DatabaseUnavailableError(
                f"database {where} is read-only: make it writable (chmod u+w) or pass {DB_OPTION} / set {ENV_VAR} to another file"
            )
        check_header(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        # Never made: a mistyped --db must not leave folders behind.
        raise DatabaseUnavailableError(
            f"the folder of database {where} does not exist: create it first, or pass {DB_OPTION} / "
            f"set {ENV_VAR} to a file in an existing folder"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DatabaseUnavailableError(
            f"the folder of database {where} is read-only (SQLite needs to write its journal beside the file): "
            f"pass {DB_OPTION} / set {ENV_VAR} to a writable place"
        )


def _install_sqlite_hooks(engine: Engine) -> None:
    busy_ms = int(BUSY_TIMEOUT_S * 1000)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, record: Any) -> None:
        # The driver must not open transactions on its own: _on_begin issues BEGIN IMMEDIATE so a
        # transaction that reads before it writes cannot fail with SQLITE_BUSY under WAL.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()
        record.info["pid"] = os.getpid()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        # A connection inherited through fork() must not be shared with the parent (SQLAlchemy recipe).
        if record.info.get("pid") != os.getpid():
            record.dbapi_connection = proxy.dbapi_connection = None
            raise sa_exc.DisconnectionError("connection was opened in another process")

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        mode = conn.get_execution_options().get(BEGIN_OPTION, "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")


@contextmanager
def session(engine: Engine, *, write: bool = True) -> Iterator[Session]:
    """A SQLModel session that commits on success and rolls back on error.

    ``write=False`` starts a plain (deferred) transaction: readers then never wait for writers.
    Objects stay usable after the block (``expire_on_commit=False``).
    """
    bind = engine if write else engine.execution_options(**{BEGIN_OPTION: "DEFERRED"})
    with Session(bind, expire_on_commit=False) as sess:
        try:
            yield sess
            sess.commit()
        except sa_exc.DBAPIError as exc:  # the database refused: translated when a user can act
            sess.rollback()
            translated = translate_db_error(exc, engine)
            if translated is None:
                raise
            raise translated from exc
        except BaseException:
            sess.rollback()
            raise


def translate_db_error(exc: BaseException, engine: Engine | str) -> StoreError | None:
    """The one-line StoreError for a database failure a user can act on, or None for a bug."""
    where = describe(engine)
    if is_postgres(engine.url if isinstance(engine, Engine) else engine):
        return translate_postgres_error(exc, where)
    text = " ".join(str(getattr(exc, "orig", None) or exc).split()).lower()
    hint = f"pass {DB_OPTION} / set {ENV_VAR} to another file"
    if "file is not a database" in text or "malformed" in text or "not a database" in text:
        return DatabaseUnavailableError(
            f"{where} is not a usable SQLite database ({text}); it was left untouched: move it aside or {hint}"
        )
    if "readonly" in text or "read-only" in text:
        return DatabaseUnavailableError(
            f"database {where} is read-only: make it writable or {hint}"
        )
    if _locked(exc):
        return DatabaseUnavailableError(
            f"database {where} stayed locked by another process for over {BUSY_TIMEOUT_S:.0f} s; try again"
        )
    if "unable to open database" in text:
        return DatabaseUnavailableError(f"cannot open database {where}: check the path or {hint}")
    if "disk i/o error" in text or "database or disk is full" in text:
        return DatabaseUnavailableError(f"database {where}: {text}")
    url = engine.url if isinstance(engine, Engine) else make_url(engine)
    if isinstance(exc, sa_exc.OperationalError) and not url.drivername.startswith("sqlite"):
        return DatabaseUnavailableError(f"database {where} is unreachable: {text}")
    return None


def _generic(exc: BaseException, engine: Engine) -> DatabaseUnavailableError:
    first = " ".join(str(getattr(exc, "orig", None) or exc).split())
    return DatabaseUnavailableError(f"database {describe(engine)} cannot be used: {first}")


def require_schema(url: str | None, *, hint: str) -> None:
    """UsageError unless the database at ``url`` holds hfadapt's tables: a read-only command
    must not create them in a database that merely exists (a PostgreSQL server's). ``hint``
    says which command creates them."""
    from hfadapt.db.migrations import MIGRATIONS_TABLE

    engine = get_engine(url, migrate=False)
    try:
        with engine.connect() as conn:
            found = inspect(conn).has_table(MIGRATIONS_TABLE)
    except sa_exc.SQLAlchemyError as exc:
        raise (translate_db_error(exc, engine) or _generic(exc, engine)) from exc
    finally:
        engine.dispose()
    if not found:
        raise UsageError(
            f"no hfadapt tables in database {describe(engine)}: check {DB_OPTION} / {ENV_VAR}, "
            f"or run {hint} first"
        )
