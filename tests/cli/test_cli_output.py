"""How the CLI's output reads: data on stdout, progress and summaries on stderr (the tally
once), piped output never cropped, a reader closing the pipe early is not an error, stored
strings reach the terminal without control characters, a nested or huge stored value never
raises, library warnings are held back and counted (``--verbose`` lets them through), Ctrl-C
says how to resume, and plurals read right."""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.db.engine import get_engine, sqlite_path

HFADAPT = [str(Path(sys.executable).with_name("hfadapt"))]  # the console script
ESC = "\x1b"


def _env(db: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return {**env, "HFADAPT_DB": str(db), **extra}


@pytest.fixture(scope="module")
def crawled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database holding the bundled snapshot's crawl (read-only use)."""
    from hfadapt.hub.crawl import crawl

    db = tmp_path_factory.mktemp("crawled") / "runs.db"
    engine = get_engine(str(db))
    crawl(engine, offline=True)
    engine.dispose()
    return db


# ---- pipes ------------------------------------------------------------------------------------


def test_piped_tables_keep_every_column_and_whole_names(crawled: Path) -> None:
    """Without a terminal (and without $COLUMNS) a table is as wide as its content: no column
    dropped, no id folded or cut at 80 columns."""
    done = subprocess.run([*HFADAPT, "models", "--top", "40"], env=_env(crawled),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if "rank" in line)
    for column in ("likes", "library", "params", "flags"):
        assert column in header, header
    assert max(len(line) for line in lines) > 80, max(len(line) for line in lines)
    assert "…" not in done.stdout
    ids = {line.split("│")[2].strip() for line in lines if line.count("│") > 3}
    assert "sentence-transformers/all-MiniLM-L6-v2" in ids, sorted(ids)[:5]


@pytest.mark.parametrize("args", [["models", "--top", "5000"], ["report"], ["show", "m/three"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(
    args: list[str], crawled: Path, report_engine: Any
) -> None:
    """`hfadapt ... | head -1`: the pipe closes after one line; exit 0, no traceback, no
    "Exception ignored" at shutdown (a report or a card is several prints: the later ones
    meet the closed pipe)."""
    db = crawled if args[0] == "models" else Path(str(sqlite_path(report_engine.url)))
    proc = subprocess.Popen([*HFADAPT, *args], env=_env(db),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert first.strip() and (code, err) == (0, ""), (first, code, err)


# ---- stored strings ---------------------------------------------------------------------------

HOSTILE = {
    "id": f"org/evil{ESC}]0;owned{ESC}\\name",
    "type": f"bert{ESC}[2J{ESC}[31m",
    "reason": f"refused \u202eop.pow{ESC}[8m hidden{ESC}[0m\x07",
}


@pytest.fixture
def hostile_db(tmp_path: Path) -> Path:
    """Stored strings with ESC sequences, a bell and a bidi override (a database written before
    crawls checked ids, or by a hostile mirror)."""
    from support.sweeps import store_crawl

    from hfadapt.hub.catalog import HubRecord
    from hfadapt.sweep.store import finish_sweep, open_sweep, write_rows

    db = tmp_path / "hostile.db"
    engine = get_engine(str(db))
    store_crawl(engine, [HubRecord(id=HOSTILE["id"], downloads=9, model_type=HOSTILE["type"])])
    sweep, _ = open_sweep(engine, {}, resume=False, mode="structural", models=1, units=1)
    assert sweep.id is not None
    violation = {"fingerprint": "f1", "rule_id": "op.pow", "op": HOSTILE["type"],
                 "message": HOSTILE["reason"], "location": {"file": "x.py", "line": 1}}  # fmt: skip
    write_rows(engine, sweep.id, [{"model_id": HOSTILE["id"], "verdict": "lowering_failed",
                                   "reason": HOSTILE["reason"], "model_type": HOSTILE["type"],
                                   "fingerprints": ["f1"], "violations": [violation]}])  # fmt: skip
    finish_sweep(engine, sweep.id, seconds=1.0)
    engine.dispose()
    return db


@pytest.mark.parametrize(
    "args",
    [
        ["models", "--all"],
        ["census"],
        ["show", HOSTILE["id"]],
        ["sweeps"],
        ["failures"],
        ["report"],
    ],
)
def test_stored_strings_are_printed_without_control_characters(
    args: list[str],
    hostile_db: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run_cli([*args, "--db", str(hostile_db)], monkeypatch, capsys)
    assert code == 0, (code, err)
    controls = Counter(
        ch for ch in out + err if (ord(ch) < 32 and ch not in "\n") or ch == "\u202e"
    )
    assert not controls, (args, controls, out[-400:])
    if args[0] in ("models", "show"):
        assert "org/evil" in out and "name" in out, out


def test_a_nested_or_huge_stored_value_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row whose JSON nests 100,000 levels (json.loads raises RecursionError on it) or whose
    JSON column is 65 MB: `show`, `report` and `failures` read the row, without that value."""
    from hfadapt.db.integrity import MAX_JSON_CHARS

    db = tmp_path / "nested.db"
    get_engine(str(db)).dispose()
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000
    huge = json.dumps(["x" * 1000] * (MAX_JSON_CHARS // 1000 + 1))
    raw = sqlite3.connect(db)
    for model_id, evidence, violations in (("m/deep", deep, deep), ("m/huge", huge, huge)):
        raw.execute(
            "INSERT INTO run (model_id, verdict, reason, mode, execution, dtype, evidence, "
            "violations, fingerprints, started_at, finished_at) VALUES (?, 'lowering_failed', "
            "'r', 'structural', 'eager', 'fp16', ?, ?, '[\"f\"]', '2026-01-01', '2026-01-01')",
            (model_id, evidence, violations),
        )
    raw.commit()
    raw.close()
    for args in (["show", "m/deep"], ["show", "m/huge", "--json"], ["report"], ["failures"]):
        code, out, err = run_cli([*args, "--db", str(db)], monkeypatch, capsys)
        assert code == 0 and "error" not in err and "Traceback" not in err, (args, code, err)
        assert "Recursion" not in out, out[-300:]


# ---- where progress, summaries and data go -------------------------------------------------------


def _fake_sweep(counts: dict[str, int], models: int) -> Any:
    from hfadapt.sweep.run import SweepProgress, SweepResult

    def run_sweep(engine: Any, options: Any, *, progress: Any) -> SweepResult:
        from hfadapt.hub.crawl import crawl

        crawl(engine, offline=True, limit=models)
        for done in range(models + 1):
            seen = Counter({k: min(v, done) for k, v in counts.items()})
            progress(SweepProgress(1, models, done, models, done, seen, 1.0 + done))
        return SweepResult(sweep_id=1, resumed=False, models=models, units=models,
                           judged=models, reused=0, already_done=0, counts=counts, seconds=3.0,
                           planning_seconds=0.1, workers=1, executor="local",
                           dedupe_factor=1.0)  # fmt: skip

    return run_sweep


def test_sweep_progress_and_summary_go_to_stderr_with_the_tally_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hfadapt.sweep.run

    monkeypatch.setattr(hfadapt.sweep.run, "run_sweep", _fake_sweep({"pass": 1}, 1))
    code, out, err = run_cli(["sweep", "--db", str(tmp_path / "s.db")], monkeypatch, capsys)
    assert (code, out) == (0, ""), (code, out)
    lines = err.splitlines()
    assert lines[0].startswith("sweep 1: 0/1 models"), lines  # a plain progress line, no bar
    assert not any("━" in line for line in lines), err
    assert [line.strip() for line in lines].count("pass 1") == 1, err  # the tally, once
    assert "sweep 1: 1 model in 3 s" in err and "1 unit of work" in err, err
    assert "the bundled snapshot of the Hub's ranking (July 2026)" in err, err
    code, out, err = run_cli(
        ["sweep", "--db", str(tmp_path / "s.db"), "--json"], monkeypatch, capsys
    )
    assert code == 0 and json.loads(out)["models"] == 1 and err == "", (out, err)


# ---- library noise ------------------------------------------------------------------------------


def _noisy(tag: str) -> Any:
    def census(*args: Any, **kwargs: Any) -> Any:
        from hfadapt.spyre.rules.tracking import SpyreDowncastWarning

        logging.getLogger("torch._dynamo.symbolic_convert").warning("Graph break %s", tag)
        logging.getLogger("transformers.modeling_utils").warning("Some weights unused %s", tag)
        warnings.warn(f"int64 is downcast to int32 ({tag})", SpyreDowncastWarning, stacklevel=1)
        raise SystemExit(0)

    return census


class _Seen(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_library_warnings_are_held_back_and_counted_once(
    crawled: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hfadapt.hub.catalog as catalog

    seen = _Seen()
    logger = logging.getLogger("torch._dynamo.symbolic_convert")
    logger.addHandler(seen)
    try:
        monkeypatch.setattr(catalog, "census", _noisy("quiet"))
        code, out, err = run_cli(["census", "--db", str(crawled)], monkeypatch, capsys)
        assert (code, out, seen.messages) == (0, "", []), (code, out, seen.messages, err)
        assert err == (
            "note: 3 library messages held back (torch log 1, transformers log 1, the simulated "
            "device SpyreDowncastWarning 1); hfadapt --verbose shows them\n"
        ), err
        monkeypatch.setattr(catalog, "census", _noisy("verbose"))
        code, _, err = run_cli(["census", "--db", str(crawled), "--verbose"], monkeypatch, capsys)
        assert code == 0 and seen.messages == ["Graph break verbose"], (seen.messages, err)
        assert "held back" not in err, err
    finally:
        logger.removeHandler(seen)


# ---- Ctrl-C -------------------------------------------------------------------------------------


def test_ctrl_c_says_how_to_resume_and_records_the_sweep_interrupted(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    args = [*HFADAPT, "sweep", "--top", "3", "--db", str(db)]
    proc = subprocess.Popen(args, env=_env(db), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the first progress line: the sweep is open
    assert first.startswith("sweep 1: 0/3 models"), first
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends the whole foreground group
    out, rest = proc.communicate(timeout=120)
    assert proc.returncode == 130 and out == "", (proc.returncode, out, rest)
    # Progress lines the sweep printed before the signal arrived, then the one message.
    *progress, last = rest.replace("\r", "\n").strip("\n").split("\n")
    assert all(line.startswith("sweep 1: ") for line in progress if line), rest
    assert last == (
        f"interrupted: sweep 1 is recorded as interrupted; resume it with: hfadapt sweep --top 3 "
        f"--db {db}"
    ), rest
    raw = sqlite3.connect(db)
    status = raw.execute("SELECT status, error FROM sweep WHERE id = 1").fetchone()
    raw.close()
    assert status == ("interrupted", None), status


# ---- plain words ---------------------------------------------------------------------------------


def test_applied_adapters_read_plainly() -> None:
    import torch
    from transformers import BertConfig, BertModel

    import hfadapt

    config = BertConfig(hidden_size=64, num_attention_heads=2, intermediate_size=128,
                        num_hidden_layers=1, vocab_size=100, hidden_act="gelu_new")  # fmt: skip
    torch.manual_seed(0)
    handle = hfadapt.adapt(BertModel(config))
    text = repr(handle)
    assert text.startswith("AppliedAdapters(") and "enabled=" not in text, text
    assert "active on spyre and under torch.compile, stock code in eager CPU runs" in text, text
    assert "gelu-new-cube" in text, text
    handle.remove()
    assert repr(handle) == "AppliedAdapters(none applied)", repr(handle)


def test_report_plurals(
    report_engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.report.charts import plural

    assert (plural(1, "model"), plural(2, "model"), plural(1_000, "unit")) == (
        "1 model", "2 models", "1,000 units")  # fmt: skip
    db = str(sqlite_path(report_engine.url))
    code, out, err = run_cli(["report", "--db", db, "--csv", os.devnull], monkeypatch, capsys)
    assert code == 0 and "sweep 2: 7 models;" in out, out
    assert err == f"wrote {os.devnull} (7 models)\n", err


# ---- the adapter registry, read by a person --------------------------------------------------


def test_adapters_show_is_a_card_with_the_change_as_a_diff(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["adapters", "show", "gelu-new-cube"], monkeypatch, capsys)
    assert (code, err) == (0, ""), err
    fields = [
        line.split()[0]
        for line in out.splitlines()[1:]
        if line.startswith("  ") and not line.startswith("    ")
    ]
    assert fields == ["replaces", "rule", "what", "origin", "file", "priority", "change"], fields
    assert "transformers.activations:NewGELUActivation.forward" in out, out
    assert "{" not in out.split("  change")[0], "provenance printed as a dict"
    diff = out.split("  change\n")[1].splitlines()
    assert diff[0].strip().startswith("--- stock: transformers.activations:NewGELUActivation"), diff
    assert any(line.strip().startswith("-") and "torch.pow(input, 3.0)" in line for line in diff), (
        diff
    )
    assert any(line.strip().startswith("+def gelu_new(") for line in diff), diff
    assert not any("@adapter(" in line for line in diff), "the registration is not the change"


def test_adapters_verify_says_why_each_proof_is_ok_and_sums_up(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["adapters", "verify", "gelu-new-cube"], monkeypatch, capsys)
    flat = " ".join(out.split())
    assert code == 0, err
    assert "ok: equivalent in float64 (max rel err" in flat, flat
    assert "op.pow.square fires on the stock code and not on the adapter's" in flat, flat
    assert err == "1 adapter re-proven: 1 ok, 0 failed\n", err


def test_an_ok_whose_rule_does_not_fire_on_the_stock_code_says_so() -> None:
    from hfadapt.adapters.proofs import DeviceCheck, VerifyResult
    from hfadapt.cli.adapters import why_ok

    quiet = VerifyResult("x", "op.unsupported", None, DeviceCheck(stock_rules=[], adapted_rules=[]))
    assert quiet.ok and quiet.device_text == "stock: does not fire; adapted: clean"
    text = why_ok(quiet)
    assert "op.unsupported does not fire on the stock code of this example either" in text, text
    assert text.endswith("a precaution, not a fix shown here"), text


def test_diagnose_shows_a_spinner_on_a_terminal_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import hfadapt.judge.diagnose
    from hfadapt.cli._app import err_console
    from hfadapt.errors import ModelNotFoundError

    def slow(model: str, **kwargs: Any) -> Any:
        time.sleep(0.5)
        raise ModelNotFoundError(f"{model} is not in the HF cache (test)")

    monkeypatch.setattr(hfadapt.judge.diagnose, "diagnose", slow)
    args = ["diagnose", "org/m", "--db", str(tmp_path / "d.db")]
    code, out, err = run_cli(args, monkeypatch, capsys)  # piped: the error line alone
    assert (code, out, err) == (2, "", "error: org/m is not in the HF cache (test)\n"), err
    monkeypatch.setattr(err_console, "_force_terminal", True)  # stderr as a terminal
    monkeypatch.setattr(err_console, "is_interactive", True)
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert code == 2 and out == "", (code, out)
    assert "diagnosing org/m (full, compile)" in err, err
    assert err.rstrip("\n").endswith("error: org/m is not in the HF cache (test)"), err


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (ValueError("boom"), 1, "error: unexpected ValueError: boom (a bug in hfadapt: please "
         "report it; hfadapt --verbose shows the traceback)"),
        (sqlite3.OperationalError("disk I/O error"), 2, "error: the database cannot be used: disk I/O error"),
        (PermissionError(13, "Permission denied", "/etc/x"), 2, "error: Permission denied: /etc/x"),
        (RecursionError("maximum recursion depth exceeded"), 1,
         "error: a stored value is nested too deeply to read (RecursionError); nothing was changed"),
    ],
)  # fmt: skip
def test_an_error_hfadapt_did_not_expect_is_still_one_line(
    error: BaseException,
    code: int,
    line: str,
    crawled: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import hfadapt.hub.catalog as catalog

    def census(*args: Any, **kwargs: Any) -> Any:
        raise error

    monkeypatch.setattr(catalog, "census", census)
    assert run_cli(["census", "--db", str(crawled)], monkeypatch, capsys) == (code, "", line + "\n")
    if isinstance(error, ValueError):
        got, _, err = run_cli(["census", "--db", str(crawled), "--verbose"], monkeypatch, capsys)
        assert (
            got == 1
            and err.startswith("Traceback")
            and err.endswith("(a bug in hfadapt: please report it)\n")
        ), err
