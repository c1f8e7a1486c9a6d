"""hfadapt.db.migrations: fresh databases match the tables, older ones are migrated with their
data, newer or unmigratable ones are refused in one line and left untouched."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, String, Table, inspect
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel, select

from hfadapt.db import migrations
from hfadapt.db.engine import get_engine, session
from hfadapt.db.migrations import (
    MIGRATIONS,
    MIGRATIONS_TABLE,
    add_columns,
    create_tables,
    db_version,
    migrate,
)
from hfadapt.db.tables import HubModel
from hfadapt.errors import SchemaVersionError


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _applied(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        return [r[0] for r in conn.execute(f"SELECT name FROM {MIGRATIONS_TABLE} ORDER BY name")]


@pytest.fixture
def extra_migrations() -> Iterator[list[migrations.Migration]]:
    """Migrations a test appends, as a later hfadapt would; removed afterwards."""
    added: list[migrations.Migration] = []
    yield added
    for fn in added:
        MIGRATIONS.remove(fn)


def test_fresh_database_matches_the_tables(tmp_path: Path) -> None:
    engine = get_engine(str(tmp_path / "runs.db"))
    assert db_version(engine) == migrations.SCHEMA_VERSION == len(MIGRATIONS) >= 1
    with engine.connect() as conn:
        insp = inspect(conn)
        for name, table in SQLModel.metadata.tables.items():
            assert insp.has_table(name), f"table {name} declared but not created by any migration"
            have = {c["name"] for c in insp.get_columns(name)}
            want = {c.name for c in table.columns}
            assert have == want, (
                f"{name}: database has {sorted(have ^ want)} differing; add a migration"
            )
    assert migrate(engine) == [], "re-opening applied migrations again"


def test_pre_versioning_database_with_hub_model_only_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with sqlite3.connect(path) as conn:  # the shape of a database written before versioning
        conn.execute(
            "CREATE TABLE hub_model (id VARCHAR PRIMARY KEY, rank INTEGER, downloads INTEGER NOT NULL, model_type VARCHAR)"
        )
        conn.executemany(
            "INSERT INTO hub_model (id, rank, downloads, model_type) VALUES (?, ?, ?, ?)",
            [("a/one", 1, 100, "bert"), ("b/two", 2, 50, None)],
        )
    engine = get_engine(str(path))
    assert _applied(path) == [fn.__name__ for fn in MIGRATIONS]
    with engine.connect() as conn:
        tables = set(inspect(conn).get_table_names())
    assert {"hub_model", "crawl", "crawl_entry", "run"} <= tables, (
        f"tables after migrating: {sorted(tables)}"
    )
    with session(engine, write=False) as sess:
        rows = sess.exec(select(HubModel).order_by(HubModel.rank)).all()
    assert [(r.id, r.downloads, r.model_type, r.likes, r.is_gated, r.source) for r in rows] == [
        ("a/one", 100, "bert", 0, False, "snapshot"),
        ("b/two", 50, None, 0, False, "snapshot"),
    ], "old rows lost or added columns lack their defaults"


def test_database_of_an_older_version_gets_the_newer_migration(
    tmp_path: Path, extra_migrations: list
) -> None:
    path = tmp_path / "runs.db"
    engine = get_engine(str(path))  # written by "this" version: migration 1 only
    with session(engine) as sess:
        sess.add(HubModel(id="kept/model", downloads=7))
    engine.dispose()

    later = Table(
        "adapter_test",
        SQLModel.metadata,
        Column("id", Integer, primary_key=True),
        Column("name", String),
    )
    try:

        def m900_adapters(conn: Connection) -> None:
            create_tables(conn, later)
            add_columns(conn, later)  # idempotent: the column is already there

        extra_migrations.append(migrations.migration(m900_adapters))
        engine = get_engine(str(path))
        assert _applied(path)[-1] == "m900_adapters"
        assert db_version(engine) == len(MIGRATIONS)
        with engine.connect() as conn:
            assert inspect(conn).has_table("adapter_test")
        with session(engine, write=False) as sess:
            assert sess.get(HubModel, "kept/model").downloads == 7  # type: ignore[union-attr]
    finally:
        SQLModel.metadata.remove(later)


def test_database_of_a_newer_version_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    get_engine(str(path)).dispose()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES ('m042_from_the_future', '2099-01-01')")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = _digest(path)
    with pytest.raises(SchemaVersionError) as exc:
        get_engine(str(path))
    message = str(exc.value)
    assert "\n" not in message
    assert "written by a newer hfadapt" in message and "m042_from_the_future" in message, message
    assert "upgrade hfadapt" in message, message
    assert _digest(path) == before, "a newer database was modified"


def test_table_that_cannot_be_migrated_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE hub_model (model_id VARCHAR PRIMARY KEY, downloads INTEGER)")
        conn.execute("INSERT INTO hub_model VALUES ('x/y', 3)")
    before = _digest(path)
    with pytest.raises(SchemaVersionError) as exc:
        get_engine(str(path))
    message = str(exc.value)
    assert "\n" not in message
    assert "cannot be migrated" in message and "hub_model has no column id" in message, message
    assert "left unchanged" in message, message
    assert _digest(path) == before
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT * FROM hub_model").fetchall() == [("x/y", 3)]
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert names == {"hub_model"}, f"a failed migration left tables behind: {sorted(names)}"


def test_failing_migration_rolls_back_everything(tmp_path: Path, extra_migrations: list) -> None:
    path = tmp_path / "runs.db"
    get_engine(str(path)).dispose()

    def m901_broken(conn: Connection) -> None:
        conn.exec_driver_sql("CREATE TABLE half_done (id INTEGER)")
        raise ValueError("bug in migration")

    extra_migrations.append(migrations.migration(m901_broken))
    with pytest.raises(SchemaVersionError) as exc:
        get_engine(str(path))
    assert "m901_broken: bug in migration" in str(exc.value), str(exc.value)
    with sqlite3.connect(path) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "half_done" not in names, "a failed migration was half applied"
    assert "m901_broken" not in _applied(path)


def test_someone_elses_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "theirs.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    before = _digest(path)
    with pytest.raises(SchemaVersionError) as exc:
        get_engine(str(path))
    assert "holds tables hfadapt did not write (customers)" in str(exc.value), str(exc.value)
    assert _digest(path) == before


def test_m008_adds_the_cycle_table_keeping_the_sweeps(tmp_path: Path) -> None:
    """A database at m007 (no ``cycle`` table, a sweep recorded) gains the cycle table, with
    every column of the SQLModel table, and keeps its sweep."""
    path = tmp_path / "runs.db"
    get_engine(str(path)).dispose()
    with sqlite3.connect(path) as conn:  # as m007 left it: no cycle table, m008 not recorded
        conn.execute("DROP TABLE cycle")
        conn.execute(f"DELETE FROM {MIGRATIONS_TABLE} WHERE name = 'm008_cycles'")
        conn.execute("INSERT INTO sweep (key, status, mode, execution, dtype, dedupe, executor, "
                     "workers, models, units, judged, resumes, seconds, started_at) VALUES "
                     "('k', 'done', 'structural', 'eager', 'fp16', 1, 'local', 1, 3, 1, 1, 0, "
                     "1.5, '2026-12-01 00:00:00')")  # fmt: skip
    engine = get_engine(str(path))
    assert "m008_cycles" in _applied(path), _applied(path)
    with engine.connect() as conn:
        have = {c["name"] for c in inspect(conn).get_columns("cycle")}
    want = {c.name for c in SQLModel.metadata.tables["cycle"].columns}
    assert have == want, f"cycle columns differing: {sorted(have ^ want)}"
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT key, models FROM sweep").fetchall() == [("k", 3)]
    engine.dispose()


def test_m009_adds_the_cycle_draft_table_keeping_the_cycles(tmp_path: Path) -> None:
    """A database at m008 (a cycle recorded, no ``cycle_draft`` table) gains the table, with
    every column of the SQLModel table, and keeps its cycle."""
    path = tmp_path / "runs.db"
    get_engine(str(path)).dispose()
    with sqlite3.connect(path) as conn:  # as m008 left it
        conn.execute("DROP TABLE cycle_draft")
        conn.execute(f"DELETE FROM {MIGRATIONS_TABLE} WHERE name = 'm009_cycle_drafts'")
        conn.execute("INSERT INTO cycle (key, status, regressions, resumes, seconds, started_at) "
                     "VALUES ('{}', 'done', 2, 0, 9.5, '2026-12-01 00:00:00')")  # fmt: skip
    engine = get_engine(str(path))
    assert _applied(path)[-1] == "m009_cycle_drafts", _applied(path)
    with engine.connect() as conn:
        have = {c["name"] for c in inspect(conn).get_columns("cycle_draft")}
    want = {c.name for c in SQLModel.metadata.tables["cycle_draft"].columns}
    assert have == want, f"cycle_draft columns differing: {sorted(have ^ want)}"
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT status, regressions FROM cycle").fetchall() == [("done", 2)]
    engine.dispose()
