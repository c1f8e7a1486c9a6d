"""hfadapt.db.engine: where the database is, WAL and locking, concurrent writers, and the one-line
errors for databases that cannot be used (nothing stored is ever lost)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import event, func
from sqlmodel import select
from support.db_race import race_from_a_small_process

from hfadapt.db.engine import get_engine, resolve_url, session, sqlite_path
from hfadapt.db.tables import Run
from hfadapt.errors import DatabaseUnavailableError

WRITERS, ROWS_EACH = 4, 200


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_line(exc: pytest.ExceptionInfo[Exception]) -> str:
    text = str(exc.value)
    assert "\n" not in text, f"message spans lines: {text!r}"
    return text


def test_default_is_runs_db_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HFADAPT_DB")
    monkeypatch.chdir(tmp_path)
    assert resolve_url() == "sqlite:///runs.db"
    engine = get_engine()
    assert (tmp_path / "runs.db").is_file()
    with engine.connect() as conn:
        mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
        busy = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
    assert mode == "wal", f"journal_mode={mode}"
    assert busy is not None and busy >= 10_000, f"busy_timeout={busy} ms"


def test_env_var_path_and_url_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HFADAPT_DB", str(tmp_path / "from_env.db"))
    assert sqlite_path(resolve_url()) == tmp_path / "from_env.db"
    assert sqlite_path(resolve_url(str(tmp_path / "explicit.db"))) == tmp_path / "explicit.db"
    assert resolve_url(f"sqlite:///{tmp_path}/url.db") == f"sqlite:///{tmp_path}/url.db"
    get_engine(str(tmp_path / "explicit.db"))
    assert (tmp_path / "explicit.db").is_file()
    assert not (tmp_path / "from_env.db").exists()
    # a folder that does not exist is never made: a mistyped --db leaves nothing behind
    with pytest.raises(DatabaseUnavailableError, match=r"the folder of database .* does not exist"):
        get_engine(str(tmp_path / "sub" / "dir" / "explicit.db"))
    assert not (tmp_path / "sub").exists()


def test_in_memory_database_is_shared_across_sessions() -> None:
    engine = get_engine(":memory:")
    with session(engine) as sess:
        sess.add(Run(model_id="a", verdict="pass"))
    with session(engine, write=False) as sess:
        assert len(sess.exec(select(Run)).all()) == 1


def test_writers_begin_immediate_readers_deferred() -> None:
    engine = get_engine()
    seen: list[str] = []
    event.listen(
        engine,
        "before_cursor_execute",
        lambda *a: seen.append(a[2]) if a[2].startswith("BEGIN") else None,
    )
    with session(engine) as sess:
        sess.add(Run(model_id="a", verdict="pass"))
    with session(engine, write=False) as sess:
        sess.exec(select(Run)).all()
    assert seen == ["BEGIN IMMEDIATE", "BEGIN DEFERRED"], f"transactions began with {seen}"


def test_session_rolls_back_on_error() -> None:
    engine = get_engine()
    with pytest.raises(RuntimeError), session(engine) as sess:
        sess.add(Run(model_id="a", verdict="pass"))
        sess.flush()
        raise RuntimeError("boom")
    with session(engine, write=False) as sess:
        count = sess.exec(select(func.count()).select_from(Run)).one()
    assert count == 0, f"{count} rows survived a failed session"


def test_concurrent_writer_processes_lose_nothing(tmp_path: Path) -> None:
    url = tmp_path / "shared.db"  # fresh: the workers also race to create and migrate it
    (codes,) = race_from_a_small_process([url], WRITERS, rows=ROWS_EACH)
    assert codes == [0] * WRITERS, f"worker exit codes {codes}"
    with session(get_engine(str(url)), write=False) as sess:
        ids = sess.exec(select(Run.model_id)).all()
    expected = {f"w{w}-{i}" for w in range(WRITERS) for i in range(ROWS_EACH)}
    assert len(ids) == WRITERS * ROWS_EACH, (
        f"stored {len(ids)} rows, expected {WRITERS * ROWS_EACH}"
    )
    assert set(ids) == expected, f"missing {sorted(expected - set(ids))[:5]}"


def test_processes_racing_to_create_one_database_all_open_it(tmp_path: Path) -> None:
    """Eight processes open one new database at once and write a row, 40 times over. Switching
    it to WAL takes an exclusive lock, and SQLite answers "database is locked" at once, without
    waiting its busy timeout, to one of two connections that both ask (it would deadlock).
    Before get_engine tried again, a process was lost in about 1 of 50 rounds of 4 (and 1 run
    in 6 of test_concurrent_writer_processes_lose_nothing), with an error that claimed a 60 s
    wait it never made; without the retry, 12 of 100 rounds of 8 lost one (measured), so 40
    rounds miss that with a chance of 0.6%."""
    urls = [tmp_path / f"race-{round_}.db" for round_ in range(40)]
    rounds = race_from_a_small_process(urls, 8)
    failed = [(round_, codes) for round_, codes in enumerate(rounds) if codes != [0] * 8]
    for round_, url in enumerate(urls):
        mode = sqlite3.connect(url).execute("PRAGMA journal_mode").fetchone()
        assert mode == ("wal",), (round_, mode)
    assert not failed, f"rounds with a process that could not open the database: {failed}"


def _write_with_inherited_engine(engine, queue) -> None:  # type: ignore[no-untyped-def]
    with session(engine) as sess:
        sess.add(Run(model_id=f"child-{os.getpid()}", verdict="pass"))
    queue.put("ok")


def test_engine_inherited_through_fork_opens_its_own_connection() -> None:
    engine = get_engine()
    with session(engine) as sess:  # the parent holds a pooled connection before forking
        sess.add(Run(model_id="parent", verdict="pass"))
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_write_with_inherited_engine, args=(engine, queue))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 0 and queue.get(timeout=5) == "ok", f"child exit code {proc.exitcode}"
    with session(engine) as sess:
        sess.add(Run(model_id="parent-again", verdict="pass"))
    with session(engine, write=False) as sess:
        count = sess.exec(select(func.count()).select_from(Run)).one()
    assert count == 3, f"{count} rows, expected 3"


def test_corrupt_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    path.write_bytes(b"<html>this is not a database</html>" * 100)
    before = _digest(path)
    with pytest.raises(DatabaseUnavailableError) as exc:
        get_engine(str(path))
    assert "is not an SQLite database" in _one_line(exc) and str(path) in str(exc.value)
    assert _digest(path) == before, "the corrupt file was modified"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db"], (
        "SQLite side files were created"
    )


def test_damaged_sqlite_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    engine = get_engine(str(path))
    with session(engine) as sess:
        sess.add(Run(model_id="a", verdict="pass"))
    engine.dispose()
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw.execute("PRAGMA journal_mode=DELETE")
    raw.close()
    data = bytearray(path.read_bytes())
    data[100:4096] = os.urandom(4096 - 100)  # the schema page, header kept
    path.write_bytes(bytes(data))
    before = _digest(path)
    with pytest.raises(DatabaseUnavailableError) as exc:
        get_engine(str(path))
    assert "is damaged (SQLite quick_check: " in _one_line(exc), str(exc.value)
    assert "it was left untouched" in _one_line(exc), str(exc.value)
    assert _digest(path) == before, "the damaged file was modified"


def test_read_only_file_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    engine = get_engine(str(path))
    with session(engine) as sess:
        sess.add(Run(model_id="kept", verdict="pass"))
    engine.dispose()
    path.chmod(0o444)
    before = _digest(path)
    try:
        with pytest.raises(DatabaseUnavailableError) as exc:
            get_engine(str(path))
        assert "is read-only" in _one_line(exc) and "chmod u+w" in str(exc.value)
        assert _digest(path) == before
    finally:
        path.chmod(0o644)
    with session(get_engine(str(path)), write=False) as sess:
        assert sess.exec(select(Run.model_id)).all() == ["kept"]


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(DatabaseUnavailableError) as exc:
        get_engine(str(tmp_path))
    assert "is a directory" in _one_line(exc)


def test_lock_held_too_long_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hfadapt.db.engine as store

    path = tmp_path / "runs.db"
    get_engine(str(path)).dispose()
    monkeypatch.setattr(store, "BUSY_TIMEOUT_S", 0.2)
    impatient = get_engine(str(path))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(DatabaseUnavailableError) as exc, session(impatient) as sess:
            sess.add(Run(model_id="a", verdict="pass"))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert "stayed locked by another process" in _one_line(exc)
