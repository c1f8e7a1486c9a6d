"""Front-door gaps, each through the real entry point (``hfadapt.cli.main``): ``models --all``
explained, ``draft`` naming a missing model and a missing endpoint in one message, "did you
mean" for model ids and adapter names, the report's "what it means" column saying what to do,
and the next step of a ``--no-adapters`` run."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

GELU_BERT = {
    "architectures": ["BertModel"], "model_type": "bert", "hidden_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 256,
    "hidden_act": "gelu_new", "vocab_size": 1000,
}  # fmt: skip


@pytest.fixture
def no_agent_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from hfadapt import isolation

    monkeypatch.setattr(isolation, "unavailable_reason", lambda: None)
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "HFADAPT_AGENT_MODEL"):
        monkeypatch.delenv(name, raising=False)


def test_models_help_explains_all(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["models", "--help"], monkeypatch, capsys)
    flat = " ".join(out.split())
    assert code == 0 and "prefilter excluded from sweeps" in flat, flat
    assert "'excluded: REASON'" in flat and "only the models a sweep would judge" in flat, flat


def test_draft_names_a_missing_model_and_a_missing_endpoint_at_once(
    no_agent_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["draft", "./no-such-model", "--model", "m"], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert (code, out, len(lines)) == (2, "", 1), (code, out, err)
    assert "no such folder: ./no-such-model" in err and "no endpoint: pass --base-url" in err, err


def test_draft_names_a_missing_model_and_a_dead_endpoint_at_once(
    no_agent_env: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from support.openai_server import dead_url

    args = ["draft", "./no-such-model", "--model", "m", "--base-url", dead_url(), "--api-key", "k"]
    code, out, err = run_cli(args, monkeypatch, capsys)
    assert (code, out, len(err.strip().splitlines())) == (2, "", 1), (code, out, err)
    assert "no such folder: ./no-such-model" in err and "connection refused" in err, err


def test_did_you_mean_for_model_ids_and_adapter_names(
    report_engine: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from hfadapt.db.engine import sqlite_path

    db = str(sqlite_path(report_engine.url))
    code, _, err = run_cli(["show", "m/thre", "--db", db], monkeypatch, capsys)
    assert code == 2 and "did you mean 'm/three'?" in err, (code, err)
    code, _, err = run_cli(["show", "zz/nothing-like-it", "--db", db], monkeypatch, capsys)
    assert code == 2 and "did you mean" not in err, (code, err)

    from hfadapt.adapters.registry import default_registry

    name = default_registry().adapters[0].name
    typo = name[:-1] if len(name) > 4 else name + "x"
    code, _, err = run_cli(["adapters", "show", typo], monkeypatch, capsys)
    assert code == 2 and f"did you mean {name!r}?" in err, (code, err)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_cli(["diagnose", "BAAI/bge-smal-en-v1.5", "--db", db], monkeypatch, capsys)
    assert code == 2 and "did you mean 'BAAI/bge-small-en-v1.5'?" in err, (code, err)
    args = ["diagnose", "org/m", "--without-adapter", typo, "--db", db]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 2 and f"did you mean {name!r}?" in err, (code, err)


def test_report_says_what_to_do_about_each_failure(
    report_engine: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Sweep 2's failures recorded no next step: each row's note is one for its verdict (a
    fingerprint to draft for, code to review), never the raw reason."""
    from hfadapt.db.engine import sqlite_path

    out_csv = tmp_path / "models.csv"
    args = ["report", "--db", str(sqlite_path(report_engine.url)), "--csv", str(out_csv)]
    code, _, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    notes = {
        row["model_id"]: row["note"] for row in csv.DictReader(io.StringIO(out_csv.read_text()))
    }
    assert (
        notes["m/three"] == "draft an adapter for what blocks it: hfadapt draft --fingerprint F1"
    ), notes
    assert (
        notes["m/four"] == "draft an adapter for what blocks it: hfadapt draft --fingerprint F3"
    ), notes
    assert notes["m/seven"] == (
        "review the repository's code, then: hfadapt diagnose m/seven --trust-remote-code"
    ), notes


def test_a_no_adapters_run_says_to_drop_the_flag_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "gelu-bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GELU_BERT))
    db = str(tmp_path / "runs.db")
    args = ["diagnose", str(folder), "--mode", "structural", "--eager", "--no-adapters",
            "--db", db, "--json"]  # fmt: skip
    code, out, err = run_cli(args, monkeypatch, capsys)
    diag = json.loads(out)
    assert diag["verdict"] in ("lowering_failed", "verification_failed"), (diag["verdict"], err)
    step = diag["next_step"]
    assert "(--no-adapters): run it without that flag first" in step, step
    code, out, err = run_cli(["show", str(folder), "--db", db, "--json"], monkeypatch, capsys)
    assert code == 0 and json.loads(out)["next_step"] == step, (code, out, err)
