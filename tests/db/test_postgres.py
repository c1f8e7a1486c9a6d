"""``--db postgresql://...``: the shared results database, against a real PostgreSQL server
(tests/support/pg_server.py starts one from Debian's package). Migrations (fresh, older, newer, several
processes at once), sweeps and their resume after kill -9, the guard that keeps a second driver
off a sweep that runs (from another machine too), the commands, a read-only role, and one-line
errors for a server that refuses."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, inspect, text
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel, select
from support.cli_runner import run_cli
from support.pg_server import PostgresServer
from support.sweeps import store_crawl, sweep_records

from hfadapt.db import migrations
from hfadapt.db.engine import get_engine, session
from hfadapt.db.migrations import MIGRATIONS, MIGRATIONS_TABLE, db_version, migrate
from hfadapt.db.tables import HubModel, Run, Sweep
from hfadapt.errors import DatabaseUnavailableError, SchemaVersionError, UsageError
from hfadapt.sweep.options import SweepOptions
from hfadapt.sweep.run import run_sweep
from hfadapt.sweep.store import done_rows, get_sweep, open_sweep

TESTS = Path(__file__).resolve().parents[1]
DRIVER = """
import sys
from hfadapt.db.engine import get_engine
from hfadapt.sweep.run import SweepOptions, run_sweep

if __name__ == "__main__":
    options = SweepOptions(workers=2, timeout=60)
    result = run_sweep(get_engine(sys.argv[1]), options, worker="support.sweep_fakes:fake_judge")
    print(f"RESULT resumed={result.resumed} already={result.already_done} judged={result.judged} models={result.models}")
"""


def _scalar(url: str, sql: str) -> Any:
    engine = get_engine(url, migrate=False)
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql)).scalar()
    finally:
        engine.dispose()


def _tables(url: str) -> list[str]:
    engine = get_engine(url, migrate=False)
    try:
        with engine.connect() as conn:
            return sorted(inspect(conn).get_table_names())
    finally:
        engine.dispose()


@pytest.fixture
def slow_migration() -> Iterator[None]:
    """A last migration that takes a second, as a later hfadapt's data migration might."""

    def m900_slow(conn: Connection) -> None:
        conn.execute(text("SELECT pg_sleep(1)"))

    MIGRATIONS.append(m900_slow)
    try:
        yield
    finally:
        MIGRATIONS.remove(m900_slow)


# ---- migrations ---------------------------------------------------------------------------------


def test_fresh_database_matches_the_tables(pg_url: str) -> None:
    engine = get_engine(pg_url)
    assert engine.dialect.name == "postgresql" and engine.driver == "psycopg", engine.url
    assert db_version(engine) == migrations.SCHEMA_VERSION == len(MIGRATIONS)
    with engine.connect() as conn:
        insp = inspect(conn)
        for name, table in SQLModel.metadata.tables.items():
            have = {c["name"] for c in insp.get_columns(name)}
            want = {c.name for c in table.columns}
            assert have == want, f"{name}: {sorted(have ^ want)} differ"
    assert migrate(engine) == [], "applied migrations ran again"
    engine.dispose()


def test_older_database_gets_the_newer_migrations_and_keeps_its_rows(pg_url: str) -> None:
    engine = get_engine(pg_url)
    with session(engine) as sess:
        sess.add(Run(model_id="kept/model", verdict="pass", evidence={"k": [1, 2]}))
    with engine.begin() as conn:  # as the database was before m005, m006 and m007
        conn.execute(text("DROP INDEX ix_run_evidence_level"))
        conn.execute(text("ALTER TABLE run DROP COLUMN evidence_level"))
        conn.execute(text("ALTER TABLE agent_attempt DROP COLUMN unsafe_no_isolation"))
        conn.execute(text("ALTER TABLE hub_model ALTER COLUMN num_parameters TYPE INTEGER"))
        conn.execute(
            text(f"DELETE FROM {MIGRATIONS_TABLE} WHERE name IN ('m005_run_evidence_level', "
                 "'m006_agent_isolation', 'm007_big_counts')")
        )  # fmt: skip
    engine.dispose()

    engine = get_engine(pg_url)
    assert db_version(engine) == len(MIGRATIONS)
    with engine.connect() as conn:
        insp = inspect(conn)
        columns = {c["name"]: c for c in insp.get_columns("agent_attempt")}
        assert "evidence_level" in {c["name"] for c in insp.get_columns("run")}
        assert "ix_run_evidence_level" in {i["name"] for i in insp.get_indexes("run")}
        flag = columns["unsafe_no_isolation"]
        assert not flag["nullable"] and str(flag["default"]).lower() == "false", flag
        kinds = {c["name"]: str(c["type"]) for c in insp.get_columns("hub_model")}
        assert kinds["num_parameters"] == kinds["downloads"] == "BIGINT", kinds
    with session(engine) as sess:  # a 7B-parameter model fits
        sess.add(HubModel(id="big/model", num_parameters=7_000_000_000, downloads=3_000_000_000))
    with session(engine, write=False) as sess:
        row = sess.exec(select(Run).where(Run.model_id == "kept/model")).one()
    assert (row.verdict, row.evidence, row.evidence_level) == ("pass", {"k": [1, 2]}, None)
    engine.dispose()


def test_database_of_a_newer_version_is_refused_untouched(pg_url: str) -> None:
    get_engine(pg_url).dispose()
    future = "m042_from_the_future"
    with get_engine(pg_url, migrate=False).begin() as conn:
        conn.execute(text(f"INSERT INTO {MIGRATIONS_TABLE} VALUES (:n, '2099-01-01')"), {"n": future})  # fmt: skip
    before = _tables(pg_url)
    with pytest.raises(SchemaVersionError, match="written by a newer hfadapt") as info:
        get_engine(pg_url)
    assert "***@127.0.0.1" in str(info.value) and "postgres" in str(info.value), info.value
    assert _tables(pg_url) == before
    assert _scalar(pg_url, f"SELECT count(*) FROM {MIGRATIONS_TABLE}") == len(MIGRATIONS) + 1


def test_threads_opening_a_fresh_database_together_migrate_it_once(
    pg_url: str, slow_migration: None
) -> None:
    # The first to migrate holds its transaction open for a second (m900_slow): the others
    # must wait for it and then find nothing left to do, not create the same tables again.
    barrier = threading.Barrier(3)
    errors: list[BaseException] = []

    def open_it() -> None:
        barrier.wait()
        try:
            get_engine(pg_url).dispose()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_it) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, [f"{type(e).__name__}: {e}" for e in errors]
    names = _scalar(pg_url, f"SELECT string_agg(name, ',' ORDER BY name) FROM {MIGRATIONS_TABLE}")
    assert names.split(",") == sorted(fn.__name__ for fn in MIGRATIONS), names


WRITERS, ROWS_EACH = 4, 25


def _write_rows(url: str, worker: int) -> None:
    engine = get_engine(url)  # fresh database: the writers also race to migrate it
    for i in range(ROWS_EACH):
        with session(engine) as sess:  # read, then write, in one transaction
            sess.exec(select(func.count()).select_from(Run)).one()
            sess.add(Run(model_id=f"w{worker}-{i}", verdict="pass"))
    engine.dispose()


def test_concurrent_writer_processes_lose_nothing(pg_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_rows, args=(pg_url, w)) for w in range(WRITERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    assert [p.exitcode for p in procs] == [0] * WRITERS
    ids = _scalar(pg_url, "SELECT string_agg(model_id, ',') FROM run").split(",")
    assert sorted(ids) == sorted(f"w{w}-{i}" for w in range(WRITERS) for i in range(ROWS_EACH))


def _write_with_inherited_engine(engine: Any, queue: Any) -> None:
    with session(engine) as sess:
        sess.add(Run(model_id=f"child-{os.getpid()}", verdict="pass"))
    queue.put("ok")


def test_engine_inherited_through_fork_opens_its_own_connection(pg_url: str) -> None:
    engine = get_engine(pg_url)
    with session(engine) as sess:  # the parent holds a pooled connection before forking
        sess.add(Run(model_id="parent", verdict="pass"))
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_write_with_inherited_engine, args=(engine, queue))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0 and queue.get(timeout=5) == "ok", proc.exitcode
    with session(engine) as sess:  # the parent's pooled connection still works
        sess.add(Run(model_id="parent-again", verdict="pass"))
    with session(engine, write=False) as sess:
        assert sess.exec(select(func.count()).select_from(Run)).one() == 3
    engine.dispose()


# ---- sweeps -------------------------------------------------------------------------------------


def test_sweep_on_postgres_records_what_it_records_on_sqlite(
    pg_url: str, tmp_path: Path, fake_worker: str
) -> None:
    results = {}
    for name, url in (("postgres", pg_url), ("sqlite", str(tmp_path / "runs.db"))):
        engine = get_engine(url)
        store_crawl(engine, sweep_records("small"))
        result = run_sweep(engine, SweepOptions(workers=2), worker=fake_worker)
        rows = done_rows(engine, result.sweep_id)
        results[name] = (result, rows)
        engine.dispose()
    (pg, pg_rows), (lite, lite_rows) = results["postgres"], results["sqlite"]
    assert (pg.models, pg.units, pg.judged, pg.counts) == (lite.models, lite.units, lite.judged, lite.counts)  # fmt: skip
    assert pg.models == 13 and pg.judged == 5, pg

    def view(rows: dict[str, dict[str, Any]]) -> dict[str, tuple[Any, ...]]:
        def rep(r: dict[str, Any]) -> Any:
            return (r["evidence"] or {}).get("sweep", {}).get("representative")

        return {
            m: (r["verdict"], r["signature"], r["fingerprints"], rep(r)) for m, r in rows.items()
        }

    assert view(pg_rows) == view(lite_rows)
    member = pg_rows["org/bert-a3"]["evidence"]["sweep"]
    assert member["representative_run"] == pg_rows["org/bert-a0"]["id"], member
    stamps = [rows["org/bert-a0"]["started_at"] for rows in (pg_rows, lite_rows)]
    assert [s.utcoffset() for s in stamps] == [timedelta(0)] * 2, stamps  # UTC, as on SQLite


def _rows_now(url: str) -> int:
    try:
        return int(_scalar(url, "SELECT count(*) FROM run"))
    except Exception:  # not created yet
        return 0


@pytest.mark.slow
def test_kill_9_a_driver_then_resume_and_no_second_driver_meanwhile(
    pg_url: str, tmp_path: Path, fake_worker: str
) -> None:
    engine = get_engine(pg_url)
    store_crawl(engine, sweep_records("many"))  # 92 models: 30 units of 3, custom_code, skipped
    engine.dispose()
    script = tmp_path / "drive.py"
    script.write_text(DRIVER)
    env = {
        **os.environ,
        "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "HFADAPT_FAKE_SLEEP": "0.3",
    }
    proc = subprocess.Popen(
        [sys.executable, str(script), pg_url], env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while _rows_now(pg_url) < 2 + 3 * 8 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)

        # A second driver, as if on another machine (where the first one's pid says nothing),
        # must not resume the sweep while the first one runs it.
        engine = get_engine(pg_url)
        with engine.begin() as conn:
            conn.execute(text("UPDATE sweep SET host = 'another-machine', driver_pid = 1"))
        running = get_sweep(engine, 1)
        assert running is not None and running.options is not None
        with pytest.raises(UsageError, match="being run right now by process 1 on another-machine"):
            open_sweep(engine, running.options, resume=True)
        assert _scalar(pg_url, "SELECT count(*) FROM sweep") == 1
        assert _scalar(pg_url, "SELECT resumes FROM sweep") == 0
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    at_kill = _rows_now(pg_url)
    print(f"\nkilled with {at_kill} of 92 rows written")
    assert 2 + 3 * 8 <= at_kill < 92 and at_kill % 3 == 2, f"{at_kill} rows: a unit half written"

    again = subprocess.run(
        [sys.executable, str(script), pg_url], env=env, capture_output=True, text=True, timeout=180
    )
    assert again.returncode == 0, again.stderr[-2000:]
    line = next(x for x in again.stdout.splitlines() if x.startswith("RESULT"))
    assert f"resumed=True already={at_kill}" in line and "models=92" in line, line
    assert int(line.split("judged=")[1].split()[0]) == (92 - at_kill) // 3, line
    with engine.connect() as conn:
        models = list(conn.execute(select(Run.model_id)).scalars())
        status, resumes, judged = conn.execute(
            select(Sweep.status, Sweep.resumes, Sweep.judged)
        ).one()  # type: ignore[call-overload]
    assert len(models) == 92 and len(set(models)) == 92, "a row was lost or duplicated"
    assert (status, resumes, judged) == ("done", 1, 30)
    engine.dispose()


# ---- commands -----------------------------------------------------------------------------------

READ_ONLY = [
    ["sweeps"],
    ["models"],
    ["census"],
    ["failures"],
    ["report"],
    ["show", "org/bert-a0"],
    ["attempts"],
]


@pytest.fixture
def swept_pg(pg_url: str, fake_worker: str) -> str:
    """A PostgreSQL database holding the small crawl and one sweep of it."""
    engine = get_engine(pg_url)
    store_crawl(engine, sweep_records("small"))
    run_sweep(engine, SweepOptions(workers=1), worker=fake_worker)
    engine.dispose()
    return pg_url


def test_read_only_commands_work_for_a_role_that_may_only_read(
    swept_pg: str,
    postgres_server: PostgresServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    database = swept_pg.rsplit("/", 1)[1]
    role = f"reader_{database}"
    postgres_server.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'reads'")
    postgres_server.execute(
        f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}", database=database
    )
    reader = postgres_server.url(database, user=role, password="reads")
    try:
        for args in READ_ONLY:
            code, out, err = run_cli([*args, "--db", reader], monkeypatch, capsys)
            assert code == 0, (args, err)
            assert out.strip() or err.strip(), args  # notes ("no attempts yet") go to stderr
        code, out, _ = run_cli(["sweeps", "--db", reader, "--json"], monkeypatch, capsys)
        assert '"status": "done"' in out

        # Writing is refused in one line, and nothing is written.
        code, _out, err = run_cli(["sweep", "--fresh", "--db", reader], monkeypatch, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1, (code, err)
        assert "permission denied" in err and "may not write" in err and "reads" not in err, err
        assert _scalar(swept_pg, "SELECT count(*) FROM sweep") == 1
    finally:
        postgres_server.execute(f"DROP OWNED BY {role}", database=database)
        postgres_server.execute(f"DROP ROLE {role}")


@pytest.mark.parametrize("args", [a for a in READ_ONLY if a[0] != "show"], ids=lambda a: a[0])
def test_read_only_command_on_an_empty_database_creates_nothing(
    pg_url: str,
    args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _out, err = run_cli([*args, "--db", pg_url], monkeypatch, capsys)
    assert code == 2 and "no hfadapt tables in database" in err, (code, err)
    assert len(err.strip().splitlines()) == 1, err
    assert _tables(pg_url) == [], "a read-only command created tables"


def test_crawl_then_models_from_the_bundled_snapshot(
    pg_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["crawl", "--offline", "--db", pg_url], monkeypatch, capsys)
    assert code == 0, err
    kept = _scalar(pg_url, "SELECT kept FROM crawl")
    assert kept > 1000 and _scalar(pg_url, "SELECT count(*) FROM hub_model") >= kept, kept
    code, out, err = run_cli(["crawl", "--offline", "--db", pg_url], monkeypatch, capsys)
    assert code == 0, err  # a second crawl merges into the stored models
    assert _scalar(pg_url, "SELECT count(*) FROM crawl WHERE status = 'done'") == 2
    code, out, err = run_cli(["models", "--top", "3", "--db", pg_url, "--json"], monkeypatch, capsys)  # fmt: skip
    assert code == 0 and out.count('"id"') == 3, (err, out[:500])


# ---- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("database", "password", "says"),
    [
        ("postgres", "not-the-secret", "password authentication failed"),
        ("no_such_db", None, 'database "no_such_db" does not exist'),
    ],
)
def test_a_refused_connection_is_one_line_without_the_password(
    postgres_server: PostgresServer,
    database: str,
    password: str | None,
    says: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = postgres_server.url(database, password=password)
    code, _out, err = run_cli(["sweeps", "--db", url], monkeypatch, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, (code, err)
    assert says in err and "cannot use database" in err, err
    assert (password or postgres_server.password) not in err, err


def test_server_that_does_not_answer_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code, _out, err = run_cli(
        ["sweep", "--db", f"postgresql://u:secret@127.0.0.1:{port}/x"], monkeypatch, capsys
    )
    assert code == 2 and len(err.strip().splitlines()) == 1, (code, err)
    assert "cannot use database" in err and "refused" in err and "secret" not in err, err


def test_missing_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg raises ImportError
    with pytest.raises(DatabaseUnavailableError, match=r"pip install '\.\[postgres\]'"):
        get_engine("postgres://u@127.0.0.1:1/x")
