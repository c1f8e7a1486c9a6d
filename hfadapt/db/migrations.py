"""Schema versions of runs.db, as an ordered list of migrations (simonw/llm style).

Opening a database (``hfadapt.db.engine.get_engine``) runs every migration it has not seen, in one
transaction, and records each by name in the ``_hfadapt_migrations`` table. The schema version
of a database is the number of migrations applied; ``SCHEMA_VERSION`` is the number this
hfadapt knows. A database that records a migration this hfadapt does not know was written by a
newer version and is refused (SchemaVersionError) without being touched.

How to change the schema (adapters, agent attempts, ...):

1. Declare or change the SQLModel table in ``hfadapt/db/tables.py`` (every table of runs.db
   lives there, so every table is known when a database is opened).
2. Append a function at the END of this file, named ``mNNN_what``::

       @migration
       def m002_adapters(conn: Connection) -> None:
           create_tables(conn, Adapter)               # a new table (and its indexes)
           add_columns(conn, Run, "adapter_ids")      # a new column on an existing table

   Both helpers are idempotent (a fresh database already has the columns migration 1
   created from the current tables), and ``conn`` is inside the migration transaction:
   ``conn.execute(...)`` for data fixes too.
3. Never edit, rename, reorder or delete a migration that has shipped: databases record
   them by name. ``tests/db/test_migrations.py`` checks that a migrated database matches the
   SQLModel tables, so a table change without its migration fails there.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import Column, MetaData, String, Table, inspect, select
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

from hfadapt.errors import MigrationImpossible, SchemaVersionError, option

DB_OPTION = option("db")  # the parameter, shown as its flag by the CLI

Migration = Callable[[Connection], None]

MIGRATIONS: list[Migration] = []
MIGRATIONS_TABLE = "_hfadapt_migrations"

_meta = MetaData()
_migrations_table = Table(
    MIGRATIONS_TABLE,
    _meta,
    Column("name", String, primary_key=True),
    Column("applied_at", String, nullable=False),
)


def migration(fn: Migration) -> Migration:
    """Register ``fn`` as the next migration (order of definition is order of application)."""
    MIGRATIONS.append(fn)
    return fn


def __getattr__(name: str) -> int:
    # Computed, so appending a migration is all it takes to bump the version.
    if name == "SCHEMA_VERSION":
        return len(MIGRATIONS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- helpers for migrations ------------------------------------------------------------------


def _table(model: type[SQLModel] | Table) -> Table:
    table = model if isinstance(model, Table) else model.__table__  # type: ignore[attr-defined]
    assert isinstance(table, Table)
    return table


def create_tables(conn: Connection, *models: type[SQLModel] | Table) -> None:
    """Create each table with its indexes; for a table that exists, add its missing columns."""
    existing = set(inspect(conn).get_table_names())
    for model in models:
        table = _table(model)
        if table.name in existing:
            add_columns(conn, table)
            for index in table.indexes:
                index.create(conn, checkfirst=True)
        else:
            table.create(conn)


def add_columns(conn: Connection, model: type[SQLModel] | Table, *names: str) -> list[str]:
    """Add the named columns (all declared ones by default) that the table lacks; returns those added.

    A NOT NULL column gets its scalar Python default as the SQL default for existing rows; one
    whose default is computed (a timestamp) is added as nullable, since SQLite cannot back-fill it.
    """
    table = _table(model)
    present = {col["name"] for col in inspect(conn).get_columns(table.name)}
    wanted = [table.c[name] for name in names] if names else list(table.columns)
    prep = conn.dialect.identifier_preparer
    added = []
    for col in wanted:
        if col.name in present:
            continue
        if col.primary_key:
            raise MigrationImpossible(
                f"table {table.name} has no column {col.name} (its primary key)"
            )
        ddl = f"ALTER TABLE {prep.quote(table.name)} ADD COLUMN {prep.quote(col.name)} {col.type.compile(dialect=conn.dialect)}"
        default = _sql_default(col, conn)
        if not col.nullable and default is not None:
            ddl += f" NOT NULL DEFAULT {default}"
        elif default is not None:
            ddl += f" DEFAULT {default}"
        conn.exec_driver_sql(ddl)
        added.append(col.name)
    return added


def _sql_default(col: Column[object], conn: Connection) -> str | None:
    default = col.default
    value = getattr(default, "arg", None)
    if default is None or callable(value) or value is None:
        return None
    processor = col.type.literal_processor(conn.dialect)
    if processor is None:
        return None
    return str(processor(value))


# ---- running them -------------------------------------------------------------------------


def applied_migrations(conn: Connection) -> list[str]:
    """Names of the migrations recorded in the database (empty for a fresh or pre-versioning one)."""
    if not inspect(conn).has_table(MIGRATIONS_TABLE):
        return []
    return list(
        conn.execute(
            select(_migrations_table.c.name).order_by(_migrations_table.c.applied_at)
        ).scalars()
    )


def db_version(engine: Engine) -> int:
    """How many of the known migrations the database has applied."""
    known = {fn.__name__ for fn in MIGRATIONS}
    with engine.connect() as conn:
        return sum(1 for name in applied_migrations(conn) if name in known)


def migrate(engine: Engine) -> list[str]:
    """Apply pending migrations in one transaction; returns the names applied (often none).

    On SQLite the transaction starts with BEGIN IMMEDIATE (see hfadapt.db.engine), so processes
    that open a fresh database together migrate it once, one after the other.
    """
    from hfadapt.db import tables  # noqa: F401  # every table must be declared before migrating
    from hfadapt.db.urls import describe

    where = describe(engine)
    known = [fn.__name__ for fn in MIGRATIONS]
    with engine.connect() as conn, conn.begin():
        applied = applied_migrations(conn)
        unknown = [name for name in applied if name not in known]
        if unknown:
            raise SchemaVersionError(
                f"database {where} was written by a newer hfadapt (schema version {len(applied)}, "
                f"this hfadapt knows {len(known)}; unknown migration {unknown[0]}): upgrade hfadapt "
                f"(pip install -U hfadapt) or pass {DB_OPTION} to use another database"
            )
        pending = [fn for fn in MIGRATIONS if fn.__name__ not in applied]
        if pending and conn.dialect.name == "postgresql":
            # What BEGIN IMMEDIATE does on SQLite: one migrating process at a time; then read
            # again what a process that held the lock before us applied.
            from hfadapt.db.postgres import lock_migrations

            lock_migrations(conn)
            applied = applied_migrations(conn)
            pending = [fn for fn in MIGRATIONS if fn.__name__ not in applied]
        if not pending:
            return []
        if not applied:
            _refuse_foreign(conn, where)
        _migrations_table.create(conn, checkfirst=True)
        for fn in pending:
            try:
                fn(conn)
            except Exception as exc:
                reason = " ".join(str(exc).split())
                raise SchemaVersionError(
                    f"database {where} cannot be migrated to schema version {len(known)} "
                    f"({fn.__name__}: {reason}); it was left unchanged: move it aside or pass {DB_OPTION} "
                    "to start a new database"
                ) from exc
            conn.execute(
                _migrations_table.insert().values(
                    name=fn.__name__, applied_at=datetime.now(UTC).isoformat()
                )
            )
        return [fn.__name__ for fn in pending]


def _refuse_foreign(conn: Connection, where: str) -> None:
    """A database with tables but none of ours is someone else's: do not write into it."""
    names = [n for n in inspect(conn).get_table_names() if not n.startswith("sqlite_")]
    ours = set(SQLModel.metadata.tables)
    if names and not ours.intersection(names):
        shown = ", ".join(sorted(names)[:5])
        raise SchemaVersionError(
            f"database {where} holds tables hfadapt did not write ({shown}); it was left unchanged: "
            f"pass {DB_OPTION} to use another database"
        )


# ---- the migrations, in order: append only --------------------------------------------------


@migration
def m001_hub_and_runs(conn: Connection) -> None:
    """Crawled Hub models, crawls, crawl entries and runs (also upgrades pre-versioning databases)."""
    from hfadapt.db.tables import Crawl, CrawlEntry, HubModel, Run

    create_tables(conn, Crawl, HubModel, CrawlEntry, Run)


@migration
def m002_agent_attempts(conn: Connection) -> None:
    """The adapter-drafting agent: draft sessions and every attempt (prompt, response, steps)."""
    from hfadapt.db.tables import AgentAttempt, DraftSession

    create_tables(conn, DraftSession, AgentAttempt)


@migration
def m003_sweeps(conn: Connection) -> None:
    """Batch sweeps: one row per sweep (options, status, counts); runs point at it by sweep_id."""
    from hfadapt.db.tables import Sweep

    create_tables(conn, Sweep)


@migration
def m004_sweep_driver(conn: Connection) -> None:
    """Which process drives a running sweep, so a second driver does not resume it meanwhile."""
    from hfadapt.db.tables import Sweep

    add_columns(conn, Sweep, "driver_pid")


@migration
def m005_run_evidence_level(conn: Connection) -> None:
    """What each run's verdict rests on (weights, config or architecture); older rows stay NULL,
    which every report reads as unknown."""
    from hfadapt.db.tables import Run

    add_columns(conn, Run, "evidence_level")
    for index in Run.__table__.indexes:  # type: ignore[attr-defined]
        if "evidence_level" in index.columns:
            index.create(conn, checkfirst=True)


@migration
def m006_agent_isolation(conn: Connection) -> None:
    """Whether each drafting attempt ran its draft without OS isolation (--unsafe-no-isolation)."""
    from hfadapt.db.tables import AgentAttempt

    add_columns(conn, AgentAttempt, "unsafe_no_isolation")


@migration
def m007_big_counts(conn: Connection) -> None:
    """Parameter and download counts past 2**31 (a 7B-parameter model): BIGINT on PostgreSQL.
    SQLite's INTEGER already holds 64 bits: nothing changes there."""
    if conn.dialect.name != "postgresql":
        return
    for table, column in (
        ("hub_model", "num_parameters"),
        ("hub_model", "downloads"),
        ("crawl_entry", "downloads"),
    ):
        conn.exec_driver_sql(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE BIGINT")


@migration
def m008_cycles(conn: Connection) -> None:
    """``hfadapt cycle``: one row per cycle (its crawl, sweep, baseline, comparison, and the
    host and pid that hold it while it runs)."""
    from hfadapt.db.tables import Cycle

    create_tables(conn, Cycle)


@migration
def m009_cycle_drafts(conn: Connection) -> None:
    """``hfadapt cycle --draft``: one row per failure fingerprint new in a cycle, with what its
    drafting came to and cost."""
    from hfadapt.db.tables import CycleDraft

    create_tables(conn, CycleDraft)
