"""Opening a database to read only (``hfadapt models``, ``show``, ``report``, ...): nothing is
created, written or left behind, a damaged file is named as damaged, and a read-only or
archived runs.db can still be read.

SQLite, by what the file and its folder allow:

* both writable: an ordinary connection with ``PRAGMA query_only`` (SQLite refuses any write
  through it), so the last connection to close still tidies the ``-wal``/``-shm`` files away; a
  ``mode=ro`` connection would leave them behind;
* the file or its folder read-only: ``mode=ro``, and ``immutable=1`` unless a ``-wal`` file is
  there to be read (nothing can be written beside the file, and nothing writes it meanwhile).

Then SQLite's ``quick_check``, then the schema: a database written by a newer hfadapt is refused
as the writers refuse it; one written by an older hfadapt is brought up to date first when it
is writable (as any command would), and refused when it is not. Other databases (PostgreSQL)
open as ``get_engine`` opens them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import event, inspect
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine, make_url
from sqlmodel import SQLModel, create_engine

from hfadapt.db.engine import BUSY_TIMEOUT_S, get_engine, require_schema, translate_db_error
from hfadapt.db.integrity import check_header, load_json, quick_check
from hfadapt.db.urls import ENV_VAR, resolve_url, sqlite_path
from hfadapt.errors import DatabaseUnavailableError, SchemaVersionError, UsageError, option

__all__ = ["open_readonly", "writable"]


def writable(path: Path) -> bool:
    """Whether SQLite may write ``path`` and create its journal beside it. A file whose write
    bits are all off counts as read-only even for root: its owner said so."""
    folder = path.parent if str(path.parent) else Path(".")
    return (
        os.access(path, os.W_OK)
        and bool(path.stat().st_mode & 0o222)
        and os.access(folder, os.W_OK | os.X_OK)
    )


def open_readonly(url: str | None = None, *, hint: str = "`hfadapt crawl`") -> Engine:
    """An engine that only reads the database at ``url`` (see module doc). UsageError when
    there is no database there (``hint`` names the command that makes one);
    DatabaseUnavailableError for a directory, a non-SQLite or damaged file;
    SchemaVersionError for a newer schema, or an older one that cannot be upgraded here."""
    resolved = resolve_url(url)
    try:
        path = sqlite_path(make_url(resolved))
    except (sa_exc.ArgumentError, ValueError):  # ValueError: a port that is no number
        path = None  # not a URL at all: get_engine says so in one line
    if path is None:  # a server's database (PostgreSQL): it must hold hfadapt's tables already
        require_schema(url, hint=hint)
        return get_engine(url)
    if not path.exists():
        raise UsageError(
            f"no database at {path}: check {option('db')} / ${ENV_VAR}, or run {hint} first"
        )
    if path.is_dir():
        raise DatabaseUnavailableError(
            f"database {path} is a directory: pass {option('db')} with a file path"
        )
    check_header(path)
    engine = _reader(path)
    try:
        quick_check(engine, str(path))
        pending = _pending_migrations(engine, path, hint)
    except BaseException:
        engine.dispose()
        raise
    if not pending:
        return engine
    engine.dispose()
    if not writable(path):
        raise SchemaVersionError(
            f"database {path} was written by an older hfadapt ({pending} schema change(s) behind) "
            "and is read-only here: open it once where it can be written (any hfadapt command "
            "upgrades it), or read it with the hfadapt that wrote it"
        )
    get_engine(url).dispose()  # the writer's path: quick_check, then the migrations
    return _reader(path)


def _reader(path: Path) -> Engine:
    if writable(path):
        engine = create_engine(
            f"sqlite:///{path}",
            connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
            json_deserializer=load_json,
        )

        @event.listens_for(engine, "connect")
        def _query_only(dbapi_conn: Any, record: Any) -> None:
            cursor = dbapi_conn.cursor()
            try:
                cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
                cursor.execute("PRAGMA query_only = 1")
            finally:
                cursor.close()

        return engine
    wal = Path(f"{path}-wal")
    flags = "mode=ro" if wal.exists() and wal.stat().st_size else "mode=ro&immutable=1"
    # An SQLite URI filename (SQLAlchemy hands ``uri=true`` to sqlite3); messages still show
    # the path (hfadapt.db.urls.sqlite_path reads it back).
    location = quote(str(path.resolve()))
    return create_engine(
        f"sqlite:///file:{location}?{flags}&uri=true",
        connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
        json_deserializer=load_json,
    )


def _pending_migrations(engine: Engine, path: Path, hint: str) -> int:
    """How many known migrations the database lacks; SchemaVersionError for a newer schema
    or one that holds nothing of hfadapt's, UsageError for an empty one."""
    from hfadapt.db import tables  # noqa: F401  # every table declared
    from hfadapt.db.migrations import MIGRATIONS, MIGRATIONS_TABLE, applied_migrations

    known = [fn.__name__ for fn in MIGRATIONS]
    try:
        with engine.connect() as conn:
            applied = applied_migrations(conn)
            names = [n for n in inspect(conn).get_table_names() if not n.startswith("sqlite_")]
    except sa_exc.SQLAlchemyError as exc:
        raise (
            translate_db_error(exc, f"sqlite:///{path}")
            or DatabaseUnavailableError(
                f"database {path} cannot be read: {getattr(exc, 'orig', None) or exc}"
            )
        ) from exc
    unknown = [name for name in applied if name not in known]
    if unknown:
        raise SchemaVersionError(
            f"database {path} was written by a newer hfadapt (schema version {len(applied)}, this "
            f"hfadapt knows {len(known)}; unknown migration {unknown[0]}): upgrade hfadapt "
            f"(pip install -U hfadapt) or pass {option('db')} to use another database"
        )
    ours = set(SQLModel.metadata.tables) | {MIGRATIONS_TABLE}
    if not names:
        raise UsageError(f"database {path} is empty: run {hint} first")
    if not applied and not ours.intersection(names):
        shown = ", ".join(sorted(names)[:5])
        raise SchemaVersionError(
            f"database {path} holds tables hfadapt did not write ({shown}): pass {option('db')} "
            "to use another database"
        )
    return sum(1 for name in known if name not in applied)
