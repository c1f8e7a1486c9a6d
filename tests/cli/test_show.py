"""One model at a glance: ``hfadapt show MODEL`` prints its latest recorded run (verdict,
evidence level, config source, adapters, violations with source lines, next step) from the
database without judging it again and without importing torch; ``hfadapt models`` shows the
latest verdict and evidence level beside each crawled model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.db.engine import sqlite_path
from hfadapt.report.card import model_card


def test_card_of_an_architecture_pass_says_shapes_were_not_checked(report_engine: Any) -> None:
    card = model_card(report_engine, "m/five")
    got = (
        card["verdict"],
        card["evidence_level"],
        card["sweep_id"],
        card["rank"],
        card["downloads"],
    )
    assert got == ("pass", "architecture", 2, 5, 60), got
    assert card["pass_means"] == "architecture passes; this model's shapes were not checked"
    assert "shapes were not checked" in card["next_step"], card["next_step"]
    # Hub ids are case-insensitive: the same card
    assert model_card(report_engine, "M/Five")["run_id"] == card["run_id"]


def test_show_prints_violations_with_source_lines(
    report_engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(sqlite_path(report_engine.url))
    code, out, err = run_cli(["show", "m/three", "--db", db], monkeypatch, capsys)
    assert code == 0, err
    assert "m/three: lowering_failed (config evidence)" in out, out
    assert out.count("[rule.F") == 2, out
    assert "at transformers/models/bert/modeling_bert.py:42 in forward" in out, out
    code, out, err = run_cli(["show", "m/three", "--db", db, "--json"], monkeypatch, capsys)
    data = json.loads(out)
    assert [v["rule_id"] for v in data["violations"]] == ["rule.F1", "rule.F2"], data["violations"]


def test_show_of_an_unknown_model_is_a_usage_error(
    report_engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(sqlite_path(report_engine.url))
    code, out, err = run_cli(["show", "nobody/nothing", "--db", db], monkeypatch, capsys)
    assert code == 2, (code, out, err)
    assert "no run of nobody/nothing" in err and "hfadapt sweep" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_show_does_not_import_torch(report_engine: Any, tmp_path: Path) -> None:
    """Its speed rests on this: no torch, no transformers on the import path of `show`."""
    db = str(sqlite_path(report_engine.url))
    code = (
        "import sys; from hfadapt.cli import main; sys.argv = ['hfadapt', 'show', 'm/one', '--db', "
        f"{db!r}]\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "print('HEAVY', heavy)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout, done.stdout + done.stderr


def test_models_shows_latest_verdict_and_evidence(
    report_engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(sqlite_path(report_engine.url))
    code, out, err = run_cli(["models", "--db", db, "--json"], monkeypatch, capsys)
    assert code == 0, err
    got = {m["id"]: (m["verdict"], m["evidence_level"]) for m in json.loads(out)}
    assert got["m/five"] == ("pass", "architecture") and got["m/six"] == (
        "lowering_failed",
        "weights",
    ), got
    code, out, err = run_cli(["models", "--db", db], monkeypatch, capsys)
    line = next(line for line in out.splitlines() if "m/five" in line)
    assert "pass" in line and "architecture" in line, out


def test_a_local_folders_run_links_to_no_hub_page(
    tiny_bert: Path,
    cpu_runner: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run of a local folder is recorded under the folder's path: ``show`` and the report
    give no huggingface.co URL for it (there was one, https://huggingface.co//tmp/...), and a
    Hub id keeps its page."""
    from hfadapt.judge.diagnose import diagnose
    from hfadapt.report.models import hub_url

    db = str(tmp_path / "runs.db")
    diag = diagnose(tiny_bert, runner=cpu_runner, db=db)
    code, out, err = run_cli(["show", str(tiny_bert), "--db", db], monkeypatch, capsys)
    assert code == 0 and diag.model_id == str(tiny_bert), (err, diag.model_id)
    assert "huggingface.co" not in out and "a local folder, not on the Hub" in out, out
    code, out, err = run_cli(["show", str(tiny_bert), "--db", db, "--json"], monkeypatch, capsys)
    assert code == 0 and json.loads(out)["hub_url"] == "", out
    assert hub_url("sentence-transformers/all-MiniLM-L6-v2") == (
        "https://huggingface.co/sentence-transformers/all-MiniLM-L6-v2"
    )
    assert hub_url("./models/x") == hub_url("~/m") == hub_url("/a/b/c") == ""


def test_show_says_what_the_latest_run_rested_on(
    report_engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sqlalchemy import text

    versions = {
        "hfadapt": "0.1.0", "profile": "spyre-2026.07@2026.07.2", "python": "3.11.7",
        "torch": "2.13.0+cpu", "transformers": "5.25.0", "kernels": "0.19.1",
        "sentence-transformers": "6.3.0", "numeric.dl16": "native", "numeric.amx": "fp32",
        "numeric.cpu": "AVX2",
    }  # fmt: skip
    with report_engine.begin() as conn:
        conn.execute(
            text("UPDATE run SET versions = :v WHERE model_id = 'm/one' AND sweep_id = 2"),
            {"v": json.dumps(versions)},
        )
    db = str(sqlite_path(report_engine.url))
    code, out, err = run_cli(["show", "m/one", "--db", db], monkeypatch, capsys)
    assert code == 0, err
    line = next((x.strip() for x in out.splitlines() if "rested on:" in x), "")
    assert line == (
        "rested on: profile spyre-2026.07@2026.07.2, torch 2.13.0+cpu, transformers 5.25.0, "
        "kernels 0.19.1, sentence-transformers 6.3.0, dl16 native, amx fp32, cpu AVX2"
    ), out
    code, out, err = run_cli(["show", "m/one", "--db", db, "--json"], monkeypatch, capsys)
    assert json.loads(out)["versions"] == versions, out
    code, out, err = run_cli(["show", "m/two", "--db", db], monkeypatch, capsys)
    assert "rested on: not recorded" in out, out  # a row that recorded no environment
