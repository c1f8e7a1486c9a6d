"""Every command through each class of mistake, via the real entry point (``hfadapt.cli.main``):
one line on stderr, the documented exit code (2 bad input, 3 something this machine lacks),
nothing on stdout, and nothing created or written (every file under the working folder is
compared byte for byte before and after)."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.db.engine import sqlite_path

# The commands that only read, with arguments that would work on a good database.
READERS: dict[str, list[str]] = {
    "models": ["models"],
    "census": ["census"],
    "show": ["show", "m/one"],
    "sweeps": ["sweeps"],
    "failures": ["failures"],
    "report": ["report"],
    "attempts": ["attempts"],
    "draft --list": ["draft", "--top", "2", "--list"],
}
# The commands that record something; each would start real work on a good database.
WRITERS: dict[str, list[str]] = {
    "crawl": ["crawl", "--offline", "--limit", "5"],
    "sweep": ["sweep", "--top", "1"],
    "diagnose": ["diagnose", "org/model", "--mode", "structural"],
    "draft": ["draft", "org/model", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
    "agent-eval": ["agent-eval", "--reference", "--case", "gelu-new-cube"],
}
EVERY = {**READERS, **WRITERS}


def _tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its content hash ("dir" for folders)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, report_engine: Any) -> Path:
    """An empty working folder as the current directory, $HFADAPT_DB unset (./runs.db is the
    default there), and beside it ``good.db``: a database with a crawl and two sweeps. The
    sandbox counts as available (draft checks it before the database; a test that wants it
    missing says so)."""
    from hfadapt import isolation

    monkeypatch.setattr(isolation, "unavailable_reason", lambda: None)
    folder = tmp_path / "work"
    folder.mkdir()
    source = sqlite3.connect(sqlite_path(report_engine.url))  # a copy with what is in the WAL
    target = sqlite3.connect(tmp_path / "good.db")
    source.backup(target)
    source.close()
    target.close()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("HFADAPT_DB", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    return folder


def _damaged(good: Path, target: Path, first: int | None = None) -> Path:
    """A copy of ``good`` with a valid header and schema page but garbage in three data pages
    (from page ``first``, default the middle): SQLite opens it, and a query may or may not
    touch the damage."""
    shutil.copy(good, target)
    raw = sqlite3.connect(target)
    raw.execute("PRAGMA journal_mode=DELETE")
    page = raw.execute("PRAGMA page_size").fetchone()[0]
    pages = raw.execute("PRAGMA page_count").fetchone()[0]
    raw.close()
    assert pages >= 8, pages
    data = bytearray(target.read_bytes())
    start_page = pages // 2 if first is None else first
    for number in range(start_page, start_page + 3):  # 1-based page numbers, page 1 kept
        start = (number - 1) * page
        data[start : start + page] = bytes([0xA5]) * page
    target.write_bytes(bytes(data))
    return target


def _refused(
    args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    watched: Path,
    *,
    code: int,
    says: str,
) -> None:
    before = _tree(watched)
    got, out, err = run_cli(args, monkeypatch, capsys)
    assert (got, out, err.count("\n")) == (code, "", 1), (args, got, out, err)
    assert err.startswith("error: ") and says in err and "Traceback" not in err, (args, err)
    after = _tree(watched)
    assert after == before, f"{args} changed {set(after.items()) ^ set(before.items())}"


# ---- the database: missing, a folder, not SQLite, damaged, in a folder that does not exist ---


@pytest.mark.parametrize("command", sorted(READERS))
def test_read_only_commands_refuse_a_missing_database_and_create_none(
    command: str, work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(
        READERS[command], monkeypatch, capsys, work.parent, code=2, says="no database at runs.db"
    )


@pytest.mark.parametrize("command", sorted(EVERY))
@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("folder missing", "does not exist"),
        ("a directory", "is a directory"),
        ("not sqlite", "is not an SQLite database"),
        ("damaged", "is damaged (SQLite quick_check: "),
    ],
)
def test_every_command_refuses_a_bad_database_in_one_line_untouched(
    command: str,
    case: str,
    says: str,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if case == "folder missing":
        db = work / "nodir" / "runs.db"
        says = says if command in WRITERS else "no database at"
    elif case == "a directory":
        db = work / "folder.db"
        db.mkdir()
    elif case == "not sqlite":
        db = work / "notes.db"
        db.write_text("these are my notes, not a database\n" * 20)
    else:
        db = _damaged(work.parent / "good.db", work / "damaged.db")
    _refused([*EVERY[command], "--db", str(db)], monkeypatch, capsys, work, code=2, says=says)


def test_damage_a_query_does_not_touch_is_still_found(
    work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The damaged file reads without an error where the damage is not: only quick_check
    finds it (as before this check, `sweeps` and `models` answered from it silently)."""
    good = work.parent / "good.db"
    with sqlite3.connect(good) as raw:
        pages = raw.execute("PRAGMA page_count").fetchone()[0]
    found = []  # where the damage lies outside the sweep table's pages (the schema moves them)
    for first in range(2, pages - 2):
        db = _damaged(good, work / f"damaged-{first}.db", first)
        raw = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        try:
            sweeps = raw.execute("SELECT count(*) FROM sweep").fetchone()[0]
            problems = raw.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError:
            continue
        finally:
            raw.close()
        found.append((first, sweeps, problems[:3]))
        break
    assert found, f"no 3-page damage of {pages} pages leaves the sweep table readable"
    first, sweeps, problems = found[0]
    assert sweeps == 2 and problems != [("ok",)], (first, sweeps, problems)


# ---- a read-only database: read-only commands read it, writers refuse it untouched -----------


def test_a_read_only_database_is_read_and_never_written(
    work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = work / "archived.db"
    shutil.copy(work.parent / "good.db", db)
    db.chmod(0o444)
    try:
        before = _tree(work)
        for name, args in READERS.items():
            code, out, err = run_cli([*args, "--db", str(db)], monkeypatch, capsys)
            assert code == 0, (name, code, err)
            assert _tree(work) == before, f"{name} created or changed a file"
        code, out, err = run_cli(["show", "m/one", "--db", str(db)], monkeypatch, capsys)
        assert "m/one: pass" in out, out
        for name in ("crawl", "sweep", "diagnose"):
            _refused([*WRITERS[name], "--db", str(db)], monkeypatch, capsys, work, code=2,
                     says="is read-only")  # fmt: skip
    finally:
        db.chmod(0o644)


# ---- output paths: checked before any work -----------------------------------------------------


@pytest.mark.parametrize("flag", ["--html", "--output", "--csv"])
@pytest.mark.parametrize(
    ("where", "says"),
    [("nodir/r.out", "does not exist"), (".", "is a directory"), ("ro/r.out", "read-only")],
)
def test_report_outputs_are_checked_before_the_report_is_built(
    flag: str,
    where: str,
    says: str,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import hfadapt.report.coverage as coverage

    if where.startswith("ro/"):
        (work / "ro").mkdir()
        (work / "ro" / "r.out").write_text("keep me\n")
        (work / "ro" / "r.out").chmod(0o444)
        if sys.platform != "linux" or __import__("os").access(work / "ro" / "r.out", 2):
            (work / "ro" / "r.out").chmod(0o644)
            pytest.skip("root ignores a file's write bits here")

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the report was built before its output path was checked")

    monkeypatch.setattr(coverage, "build_report", never)
    good = str(work.parent / "good.db")
    _refused(["report", "--db", good, flag, where], monkeypatch, capsys, work, code=2, says=says)


def test_a_write_that_fails_after_the_report_is_one_line(
    work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    good = str(work.parent / "good.db")
    code, out, err = run_cli(["report", "--db", good, "--html", "/dev/full"], monkeypatch, capsys)
    assert (code, out, err) == (
        2,
        "",
        "error: cannot write --html /dev/full: No space left on device\n",
    ), (code, out, err)


def test_agent_eval_output_is_checked_before_the_evaluation(
    work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["agent-eval", "--reference", "--case", "gelu-new-cube", "--output", "nodir/x.json"]
    _refused(args, monkeypatch, capsys, work, code=2, says="--output nodir/x.json: the folder")


# ---- ids, names that match nothing, options that do not fit, what the machine lacks -----------


@pytest.mark.parametrize("mode", ["full", "structural"])
def test_an_invalid_id_is_refused_the_same_way_in_every_mode(
    mode: str, work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _refused(["diagnose", "bad id!!", "--mode", mode], monkeypatch, capsys, work, code=2,
             says="error: bad id!! is neither a folder nor a Hub model id")  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["show", "nobody/nothing"], "no run of nobody/nothing"),
        (["attempts", "99"], "no attempt 99"),
        (["report", "--sweep", "99"], "no sweep 99"),
        (["failures", "--sweep", "99"], "no sweep 99"),
        (["report", "--against", "99"], "no sweep 99"),
        (["adapters", "show", "nope"], "no adapter named 'nope'"),
        (["adapters", "verify", "nope"], "no adapter named 'nope'"),
        (["adapters", "export", "nope", "--python", "."], "no adapter named 'nope'"),
    ],
)
def test_not_found_is_exit_2_everywhere(
    args: list[str],
    says: str,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = [] if args[0] == "adapters" else ["--db", str(work.parent / "good.db")]
    _refused([*args, *db], monkeypatch, capsys, work.parent, code=2, says=says)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["sweep", "--address", "10.0.0.1:6379"], "--address names a Ray cluster"),
        (["sweep", "--unsafe-no-isolation"], "only with --trust-remote-code"),
        (["diagnose", "org/m", "--unsafe-no-isolation"], "only with --trust-remote-code"),
        (["crawl", "--offline", "--endpoint", "http://127.0.0.1:9"], "cannot be combined"),
        (["draft"], "exactly one of MODEL, --fingerprint ID or --top K"),
        (["draft", "org/m", "--list"], "--list lists the fingerprints"),
        (["draft", "org/m", "--model", "m"], "no endpoint"),
        (["report", "--sweep", "2", "--against", "2"], "is the sweep being reported"),
    ],
)
def test_options_that_do_not_fit_are_refused_before_any_work(
    args: list[str],
    says: str,
    work: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = ["--db", str(work.parent / "good.db")] if args[0] == "report" else []
    _refused([*args, *db], monkeypatch, capsys, work.parent, code=2, says=says)


def test_what_the_machine_lacks_is_exit_3_before_any_work(
    work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt import isolation

    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    _refused(["sweep", "--executor", "ray"], monkeypatch, capsys, work, code=3,
             says="--executor ray needs Ray, which is not installed")  # fmt: skip
    monkeypatch.setattr(isolation, "unavailable_reason", lambda: "bwrap missing (test)")
    for args in (
        ["diagnose", "org/m", "--trust-remote-code"],
        ["sweep", "--trust-remote-code"],
        ["draft", "org/m", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
    ):
        _refused(args, monkeypatch, capsys, work, code=3, says="bwrap missing (test)")


# ---- conventions ----------------------------------------------------------------------------


def test_version_help_and_documented_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.version import __version__

    assert run_cli(["--version"], monkeypatch, capsys)[:2] == (0, f"hfadapt {__version__}\n")
    code, out, _ = run_cli(["-h"], monkeypatch, capsys)
    flat = " ".join(out.split())
    assert code == 0 and "Exit codes: 0 ok; 1 the model failed" in flat, flat
    assert "2 bad input" in flat and "3 something this machine lacks" in flat, flat
    code, out, _ = run_cli(["report", "-h"], monkeypatch, capsys)
    assert code == 0 and "--html PATH" in out, out


def test_empty_database_answers_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.db.engine import get_engine

    db = str(tmp_path / "fresh.db")
    get_engine(db).dispose()
    code, out, err = run_cli(["sweeps", "--db", db], monkeypatch, capsys)
    assert (code, out) == (0, ""), (code, out)
    assert err == f"no sweeps recorded in {db} yet: run hfadapt sweep\n", err
