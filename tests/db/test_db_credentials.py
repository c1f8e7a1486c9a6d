"""No database password on the screen: every command that takes ``--db`` names the database
without its password, in its messages, its JSON, its errors and the hint it prints when
interrupted. The hint stays usable: the URL without the password, which libpq
completes from $PGPASSWORD or ~/.pgpass."""

from __future__ import annotations

import socket
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.db.urls import PASSWORD_SOURCES, describe, hint_value
from hfadapt.untrusted import hide_url_credentials

SECRET = "s3cret-Pa55word"


def _closed_port() -> int:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _clean(out: str, err: str, *secrets: str) -> None:
    for secret in (SECRET, *secrets):
        assert secret not in out and secret not in err, (out, err)


# ---- the helpers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "shown", "left_out"),
    [
        (f"postgresql://me:{SECRET}@host/db", "postgresql://me@host/db", True),
        (
            f"postgresql://me@host:5/db?password={SECRET}&sslmode=require",
            "postgresql://me@host:5/db?sslmode=require",
            True,
        ),
        ("postgresql://me@host/db", "postgresql://me@host/db", False),
        ("runs.db", "runs.db", False),
        (f"postgresql://me:{SECRET}@host:port/db", "postgresql://me:***@host:port/db", True),
    ],
)
def test_hint_value_leaves_the_password_out(value: str, shown: str, left_out: bool) -> None:
    assert hint_value(value) == (shown, left_out)


def test_describe_and_text_hide_passwords_in_userinfo_and_query() -> None:
    assert describe(f"postgresql://me:{SECRET}@h/db?password={SECRET}") == (
        "postgresql://me:***@h/db?password=***"
    )
    text = f"at postgresql://me:{SECRET}@h/db and https://u:p@ss@x:1/v1?api_key=k http://h/a@b"
    assert hide_url_credentials(text) == (
        "at postgresql://me:***@h/db and https://u:***@x:1/v1?api_key=*** http://h/a@b"
    )


# ---- through the CLI, on a server that is not there -----------------------------------------

COMMANDS: list[list[str]] = [
    ["sweep"],
    ["sweep", "--json"],
    ["sweeps"],
    ["crawl", "--offline"],
    ["models"],
    ["census"],
    ["failures"],
    ["report"],
    ["show", "org/m"],
    ["attempts"],
    ["attempts", "1"],
    ["draft", "org/m", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: "-".join(a[:2]))
@pytest.mark.parametrize("form", ["flag", "flag=", "env"])
def test_unreachable_database_error_has_no_password(
    args: list[str],
    form: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"postgresql://me:{SECRET}@127.0.0.1:{_closed_port()}/db?connect_timeout=2"
    if form == "env":
        monkeypatch.setenv("HFADAPT_DB", url)
        extra: list[str] = []
    else:
        extra = ["--db", url] if form == "flag" else [f"--db={url}"]
    code, out, err = run_cli([*args, *extra], monkeypatch, capsys)
    assert code != 0, (out, err)
    _clean(out, err)


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://me:{SECRET}@127.0.0.1:port/db",  # not a number: not a URL make_url reads
        f"postgresql://me:{SECRET}@127.0.0.1 x/db",
        f"nosuchdb://me:{SECRET}@127.0.0.1/db",
    ],
)
def test_malformed_url_error_has_no_password(
    url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for args in (["sweeps"], ["sweep"], ["--verbose", "sweeps"]):
        code, out, err = run_cli([*args, "--db", url], monkeypatch, capsys)
        assert code != 0 and "error" in err, (out, err)
        _clean(out, err)


# ---- through the CLI, on a real server -----------------------------------------------------


def _fake_sweep(
    *, interrupt: bool
) -> Callable[..., Any]:  # hfadapt.sweep.run.run_sweep's signature
    def run_sweep(engine: Any, options: Any, *, progress: Any = None, **_: Any) -> Any:
        p = SimpleNamespace(
            sweep_id=7, units_done=1, units_total=4, models_per_minute=60.0, eta=3.0,
            counts={"pass": 1}, done=1, total=4,
        )  # fmt: skip
        if progress is not None:
            progress(p)
        if interrupt:
            raise KeyboardInterrupt
        return SimpleNamespace(
            sweep_id=7, resumed=False, already_done=0, models=4, seconds=1.0,
            models_per_minute=240.0, units=4, judged=4, dedupe_factor=1.0,
            environment_changes=[], counts={"pass": 4},
        )  # fmt: skip

    return run_sweep


@pytest.mark.parametrize("form", ["flag", "flag=", "env"])
def test_interrupted_sweep_hint_has_no_password_and_still_resumes(
    pg_url: str, form: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hfadapt.sweep.run

    password = hint_secret(pg_url)
    monkeypatch.setattr(hfadapt.sweep.run, "run_sweep", _fake_sweep(interrupt=True))
    if form == "env":
        monkeypatch.setenv("HFADAPT_DB", pg_url)
        db: list[str] = []
    else:
        db = ["--db", pg_url] if form == "flag" else [f"--db={pg_url}"]
    code, out, err = run_cli(["sweep", "--top", "3", *db, "--fresh"], monkeypatch, capsys)
    assert code == 130, (code, err)
    _clean(out, err, password)
    hint = next(line for line in err.splitlines() if line.startswith("interrupted"))
    assert "sweep 7 is recorded as interrupted; resume it with: hfadapt sweep --top 3" in hint
    assert "--fresh" not in hint
    bare, _ = hint_value(pg_url)
    if form == "env":  # $HFADAPT_DB still names the database: nothing to leave out
        assert hint.endswith("hfadapt sweep --top 3"), hint
    else:
        shown = "--db " + bare if form == "flag" else "--db=" + bare
        assert hint.endswith(f"{shown} (with {PASSWORD_SOURCES})"), hint


def hint_secret(url: str) -> str:
    from sqlalchemy.engine import make_url

    password = make_url(url).password
    assert password
    return str(password)


@pytest.mark.parametrize(
    "args",
    [
        ["crawl", "--offline"],
        ["crawl", "--offline", "--json"],
        ["sweep"],
        ["sweep", "--json"],
        ["sweeps"],
        ["sweeps", "--json"],
        ["models", "--top", "2"],
        ["census"],
        ["failures"],
        ["report"],
        ["show", "org/none"],
        ["attempts"],
        ["attempts", "--json"],
        ["attempts", "5"],
    ],
    ids=lambda a: "-".join(a),
)
def test_commands_name_the_database_without_its_password(
    pg_url: str,
    args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import hfadapt.sweep.run

    password = hint_secret(pg_url)
    monkeypatch.setattr(hfadapt.sweep.run, "run_sweep", _fake_sweep(interrupt=False))
    if args[0] != "crawl":  # the others read what a crawl stored
        code, _out, err = run_cli(["crawl", "--offline", "--db", pg_url], monkeypatch, capsys)
        assert code == 0, err
    code, out, err = run_cli([*args, "--db", pg_url], monkeypatch, capsys)
    _clean(out, err, password)
    if args[0] in ("crawl", "sweep"):
        assert code == 0, err
        # the database is named, its password masked
        assert "://hfadapt:***@127.0.0.1:" in out + err, (out, err)
