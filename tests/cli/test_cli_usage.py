"""The front door through ``hfadapt.cli.main``: every usage
error is one line on stderr with exit code 2, numbers are bounded before any work starts,
and help says what the commands do."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.cli_runner import run_cli


def _one_line_exit_2(code: int, out: str, err: str) -> None:
    assert (code, err.count("\n")) == (2, 1), (code, out, err)
    assert err.startswith("error: ") and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "error: hfadapt needs a command: adapters, agent-eval, attempts, cache, census, "),
        (
            ["adapters"],
            "error: hfadapt adapters needs a command: export, list, remove, show, verify ",
        ),
        (["models", "--bogus"], "error: No such option: --bogus (see hfadapt models --help)"),
        (["report", "--output"], "error: Option '--output' requires an argument."),
        (["diagnose"], "error: Missing argument 'MODEL'."),
        (["no-such-command"], "error: No such command 'no-such-command'."),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    args: list[str],
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli(args, monkeypatch, capsys)
    _one_line_exit_2(code, out, err)
    assert err.startswith(expected), err


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["sweep", "--top", "-5"], "--top"),
        (["sweep", "--top", "0"], "--top"),
        (["models", "--top", "-3"], "--top"),
        (["failures", "--top", "0"], "--top"),
        (["census", "--top", "0"], "--top"),
        (["crawl", "--limit", "0"], "--limit"),
        (["attempts", "--limit", "0"], "--limit"),
        (["agent-eval", "--max-attempts", "0", "--reference"], "--max-attempts"),
        (["adapters", "verify", "--seeds", "0"], "--seeds"),
        (["sweep", "--top", "12345678901234567890123"], "--top"),
        (["sweep", "--workers", "99999999999999999999999"], "--workers"),
        (["sweep", "--memory-limit", "-1"], "--memory-limit"),
        (["report", "--sweep", "0"], "--sweep"),
        (["sweep", "--timeout", "nan"], "--timeout"),
        (["sweep", "--timeout", "inf"], "--timeout"),
        (["sweep", "--timeout", "1e309"], "--timeout"),
        (["sweep", "--timeout", "0"], "--timeout"),
        (["sweep", "--timeout", "-3"], "--timeout"),
        (["sweep", "--mode", "fast"], "--mode"),
        (["sweep", "--executor", "slurm"], "--executor"),
        (["diagnose", "m", "--dtype", "int8"], "--dtype"),
        (["diagnose", "m", "--no-adapters", "--without-adapter", "x"], "--without-adapter"),
        (["sweep", "--no-adapters", "--without-adapter", "x"], "--without-adapter"),
        (["draft", "m", "--no-adapters", "--without-adapter", "x"], "--without-adapter"),
    ],
)
def test_numbers_and_choices_are_bounded_before_any_work(
    args: list[str],
    flag: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = tmp_path / "runs.db"
    with_db = [] if args[0] == "adapters" else ["--db", str(db)]
    code, out, err = run_cli([*args, *with_db], monkeypatch, capsys)
    _one_line_exit_2(code, out, err)
    assert flag in err, err
    assert not db.exists(), f"{args} opened {db} before refusing"


def test_workers_are_capped_by_this_machine_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.sweep.limits import max_local_workers

    cap, why = max_local_workers(None)
    db = tmp_path / "runs.db"
    code, out, err = run_cli(
        ["sweep", "--workers", str(cap + 1), "--db", str(db)], monkeypatch, capsys
    )
    _one_line_exit_2(code, out, err)
    assert err == (
        f"error: --workers {cap + 1} is more than this machine holds: at most {cap} ({why})\n"
    ), err
    assert not db.exists(), "workers were refused after the database was opened"
    assert cap >= 1 and "CPUs" in why and "MB of RAM" in why, (cap, why)


def test_the_library_refuses_what_the_cli_refuses_naming_parameters(tmp_path: Path) -> None:
    from hfadapt.db.engine import get_engine
    from hfadapt.errors import UsageError
    from hfadapt.sweep.limits import max_local_workers
    from hfadapt.sweep.run import run_sweep

    engine = get_engine(str(tmp_path / "runs.db"))
    cap, _ = max_local_workers(None)
    from hfadapt.judge.options import JudgeOptions
    from hfadapt.sweep.options import SweepOptions

    for kwargs, message in (
        ({"timeout": float("nan")}, r"^timeout must be a finite number of seconds above 0"),
        (
            {"workers": cap + 1},
            rf"^workers={cap + 1} is more than this machine holds: at most {cap} ",
        ),
        ({"mode": "fast"}, r"^mode must be one of full, structural, not 'fast'$"),
        ({"memory_limit": -1}, r"^memory_limit must be 0 \(none\) or a number of MB"),
    ):
        with pytest.raises(UsageError, match=message) as info:
            judging = {k: kwargs.pop(k) for k in ("mode",) if k in kwargs}
            run_sweep(engine, SweepOptions(judge=JudgeOptions(**judging), **kwargs))
        assert "--" not in str(info.value), info.value


def test_census_is_sorted_by_downloads_with_top(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_cli(["crawl", "--offline"], monkeypatch, capsys)
    code, out, err = run_cli(["census", "--json"], monkeypatch, capsys)
    assert code == 0, err
    every = json.loads(out)
    downloads = [r["downloads"] for r in every["model_types"]]
    assert downloads == sorted(downloads, reverse=True), downloads[:10]
    code, out, err = run_cli(["census", "--top", "3", "--json"], monkeypatch, capsys)
    top = json.loads(out)
    assert [r["model_type"] for r in top["model_types"]] == ["bert", "xlm-roberta", "mpnet"], top
    assert (
        (top["models"], top["downloads"])
        == (every["models"], every["downloads"])
        == (
            10_000,
            418_117_860,
        )
    ), "--top must not change the totals"


def test_models_fit_80_columns_and_keep_numbers_whole(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_cli(["crawl", "--offline"], monkeypatch, capsys)
    code, out, err = run_cli(["models", "--top", "12", "--all"], monkeypatch, capsys, columns=80)
    assert code == 0, err
    widest = max(len(line) for line in out.splitlines())
    assert widest <= 80, f"{widest} columns:\n{out}"
    for number in ("167,480,843", "39,663,955", "4,569,286"):
        assert number in out, f"{number} split or dropped:\n{out}"
    folded = "".join(line.split("│")[2].strip() for line in out.splitlines() if "│" in line)
    assert "sentence-transformers/all-MiniLM-L6-v2" in folded, out


def test_help_agrees_with_behaviour(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.spyre.rules.profile import load_profile

    default = load_profile(None).name
    code, out, _ = run_cli(["diagnose", "--help"], monkeypatch, capsys)
    flat = " ".join(out.split())
    assert code == 0 and f"(default: the bundled {default})" in flat, flat
    assert "--mode <full|structural>" in flat and "--dtype <fp16|bf16|fp32>" in flat, flat
    assert "<bool>" not in flat and "{model}" not in flat, flat
    code, out, _ = run_cli(["sweep", "--help"], monkeypatch, capsys)
    flat = " ".join(out.split())
    assert "needs the ray extra" in flat and "--executor <local|ray>" in flat, flat
    code, out, _ = run_cli(["attempts", "--help"], monkeypatch, capsys)
    assert "[[ID]]" not in out and "[ID]" in out, out
    code, out, _ = run_cli(["report", "--help"], monkeypatch, capsys)
    flat = " ".join(out.split())
    assert "--json Print the report as JSON" in flat and "--output PATH" in flat, flat


def test_agent_eval_lists_cases_and_names_the_reference_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.agent.suite import SUITE

    code, out, err = run_cli(["agent-eval", "--list-cases", "--json"], monkeypatch, capsys)
    assert code == 0, err
    assert [c["case"] for c in json.loads(out)] == [c.name for c in SUITE], out
    code, out, err = run_cli(["agent-eval", "--list-cases"], monkeypatch, capsys)
    assert code == 0 and all(c.name in out for c in SUITE), out


def test_attempts_say_retries_once_and_escape_markup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.db.engine import get_engine, session
    from hfadapt.db.tables import AgentAttempt, DraftSession

    db = str(tmp_path / "runs.db")
    with session(get_engine(db)) as sess:
        draft = DraftSession(fingerprint="f00d", outcome="endpoint_error")
        sess.add(draft)
        sess.flush()
        sess.add(
            AgentAttempt(
                session_id=draft.id,
                fingerprint="f00d",
                endpoint_model="m[x]",
                retries=0,
                error="HTTP 503; gave up after 5 tries",
            )
        )
        sess.add(AgentAttempt(session_id=draft.id, number=2, fingerprint="f00d", retries=2))
    code, out, err = run_cli(["attempts", "1", "--db", db], monkeypatch, capsys)
    assert code == 0, err
    assert "gave up after 5 tries" in out and "retr" not in out.replace("tries", ""), out
    assert "model m[x]" in out, f"rich markup ate the model name:\n{out}"
    code, out, err = run_cli(["attempts", "2", "--db", db], monkeypatch, capsys)
    assert code == 0 and "retried 2 time(s) before the answer" in out, (code, out, err)


@pytest.mark.slow
def test_agent_eval_reference_says_what_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["agent-eval", "--reference", "--case", "gelu-new-cube", "--db", str(tmp_path / "e.db")]
    code, out, err = run_cli(args, monkeypatch, capsys, columns=80)
    flat = " ".join(out.split())
    assert code == 0, err
    assert "the reference solutions (self-check, no endpoint): accepted 1/1 (100%)" in flat, out
    assert "reference reference" not in flat and "…" not in out, out
    assert "gelu-new-cube" in out and re.search(r"all \d steps", out), (
        out
    )  # the count is the loop's


def test_the_command_tunes_its_own_collector_and_the_library_never_does() -> None:
    """The ``hfadapt`` process collects cycles less often and, once diagnose has imported what
    it runs on, exempts those objects from later collections (hfadapt.own_process); a program that
    imports hfadapt keeps Python's collector as it was."""
    import gc
    import subprocess
    import sys

    report = (
        "import atexit, gc, sys\n"
        "atexit.register(lambda: print('GC', *gc.get_threshold(), gc.get_freeze_count()))\n"
    )
    command = report + (
        "from hfadapt.cli import main\n"
        "sys.argv = ['hfadapt', 'diagnose', 'not a model id!', '--json']\n"
        "main()\n"
    )
    library = report + "import hfadapt, hfadapt.judge.diagnose\n"
    seen = {}
    for name, code in (("command", command), ("library", library)):
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
        )
        line = [x for x in done.stdout.splitlines() if x.startswith("GC ")]
        assert line, (name, done.returncode, done.stdout[-500:], done.stderr[-1500:])
        seen[name] = [int(x) for x in line[-1].split()[1:]]
    print(f"(threshold0, 1, 2, frozen objects): {seen}; Python's defaults {gc.get_threshold()}")
    assert seen["command"][:3] == [200_000, 30, 30], seen
    assert seen["command"][3] > 100_000, f"only {seen['command'][3]} objects frozen"
    assert seen["library"] == [700, 10, 10, 0], seen


def test_the_console_script_skips_teardown_but_not_exit_handlers_or_output() -> None:
    """``hfadapt.cli.entry`` (the console script, ``python -m hfadapt``) ends with os._exit
    after the exit handlers and a flush: an atexit handler still runs, every line of a long
    output arrives, and the exit code is the command's; finalizers that only teardown would run
    (an object alive until interpreter exit) do not. ``python -m hfadapt`` (for an environment
    whose scripts folder is not on PATH) is the same command: the same help, line for line."""
    import subprocess
    import sys

    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('handler ran'))\n"
        "class Late:\n"
        "    def __del__(self):\n"
        "        print('teardown ran')\n"
        "keep = Late()\n"
        "from hfadapt.cli import entry\n"
        "sys.argv = ['hfadapt'] + sys.argv[1:]\n"
        "entry()\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=120
    )
    stock = subprocess.run(
        [sys.executable, "-m", "hfadapt", "--help"], capture_output=True, text=True, timeout=120
    )
    print(f"exit {shown.returncode}; last lines {shown.stdout.splitlines()[-2:]}")
    assert stock.returncode == 0 and "diagnose" in stock.stdout, stock.stderr[-500:]
    assert shown.returncode == 0 and shown.stdout.endswith("handler ran\n"), shown.stdout[-300:]
    assert "teardown ran" not in shown.stdout, "the interpreter's teardown ran"
    normal = subprocess.run(  # main() exits the normal way: the teardown runs
        [sys.executable, "-c", code.replace("entry", "main"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert normal.stdout.endswith("handler ran\nteardown ran\n"), normal.stdout[-200:]
    assert shown.stdout.removesuffix("handler ran\n") == stock.stdout, "output was lost"
    bad = subprocess.run(
        [sys.executable, "-c", code, "no-such-command"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2 and bad.stdout == "handler ran\n", (bad.returncode, bad.stdout)
    _one_line_exit_2(bad.returncode, "", bad.stderr)
