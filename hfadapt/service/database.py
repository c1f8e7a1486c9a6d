"""The results database as ``hfadapt serve`` opens it: read-only, so the server cannot write,
whatever a request does. SQLite: a ``mode=ro`` URI connection (SQLite itself refuses every
write; not ``immutable``, since a cycle may be writing the file meanwhile). PostgreSQL: every
transaction read-only (``SET TRANSACTION READ ONLY``, psycopg's ``postgresql_readonly``).

Before it answers, the file is checked as every command checks it (SQLite's header and
``quick_check``), and its schema must be this hfadapt's: a newer one is refused, and so is an
older one, which the server does not upgrade (it never writes): any writing command does."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from sqlalchemy import exc as sa_exc
from sqlalchemy import inspect
from sqlalchemy.engine import Engine, make_url
from sqlmodel import create_engine

from hfadapt.db.engine import (
    BUSY_TIMEOUT_S,
    describe,
    get_engine,
    require_schema,
    resolve_url,
    sqlite_path,
    translate_db_error,
)
from hfadapt.db.integrity import check_header, load_json, quick_check
from hfadapt.db.urls import ENV_VAR
from hfadapt.errors import (
    DatabaseUnavailableError,
    SchemaVersionError,
    UsageError,
    option,
)

__all__ = ["MAKER", "open_results"]

MAKER = "`hfadapt cycle`"  # the command that fills a database the server reads


def open_results(url: str | None = None) -> Engine:
    """A read-only engine over the results database at ``url`` (hfadapt.db.urls.resolve_url:
    ``--db``, ``$HFADAPT_DB``, ./runs.db). UsageError when there is none or it is empty;
    DatabaseUnavailableError for a directory, a damaged file or an unreachable server;
    SchemaVersionError for a schema other than this hfadapt's."""
    resolved = resolve_url(url)
    try:
        path = sqlite_path(make_url(resolved))
    except (sa_exc.ArgumentError, ValueError):  # not a URL: get_engine says so in one line
        path = None
    if path is None:
        require_schema(url, hint=MAKER)  # PostgreSQL: its tables, without creating them
        engine = get_engine(url, migrate=False)
        _check_schema(engine)
        return engine.execution_options(postgresql_readonly=True)
    if not path.exists():
        raise UsageError(
            f"no database at {path}: check {option('db')} / ${ENV_VAR}, or run {MAKER} first"
        )
    if path.is_dir():
        raise DatabaseUnavailableError(
            f"database {path} is a directory: pass {option('db')} with a file path"
        )
    check_header(path)
    engine = _read_only_sqlite(path)
    try:
        quick_check(engine, str(path))
        _check_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def _read_only_sqlite(path: Path) -> Engine:
    # An SQLite URI filename; hfadapt.db.urls.sqlite_path reads the path back for messages.
    location = quote(str(path.resolve()))
    return create_engine(
        f"sqlite:///file:{location}?mode=ro&uri=true",
        connect_args={"timeout": BUSY_TIMEOUT_S, "check_same_thread": False},
        json_deserializer=load_json,
    )


def _check_schema(engine: Engine) -> None:
    """SchemaVersionError unless the database has exactly the migrations this hfadapt knows;
    UsageError for an empty one."""
    from hfadapt.db.migrations import MIGRATIONS, applied_migrations

    where = describe(engine)
    try:
        with engine.connect() as conn:
            applied = applied_migrations(conn)
            tables = [n for n in inspect(conn).get_table_names() if not n.startswith("sqlite_")]
    except sa_exc.SQLAlchemyError as exc:
        raise (
            translate_db_error(exc, engine)
            or DatabaseUnavailableError(f"database {where} cannot be read: {exc}")
        ) from exc
    known = [fn.__name__ for fn in MIGRATIONS]
    if not tables:
        raise UsageError(f"database {where} is empty: run {MAKER} first")
    unknown = [name for name in applied if name not in known]
    if unknown:
        raise SchemaVersionError(
            f"database {where} was written by a newer hfadapt (unknown migration {unknown[0]}): "
            "upgrade hfadapt (pip install -U hfadapt)"
        )
    behind = [name for name in known if name not in applied]
    if behind:
        raise SchemaVersionError(
            f"database {where} was written by an older hfadapt ({len(behind)} schema change(s) "
            f"behind, from {behind[0]}); the server never writes: upgrade it once with any "
            f"writing command ({MAKER}), then serve it"
        )
