"""`hfadapt draft`, `attempts` and `agent-eval` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_runner import run_cli as run
from openai_server import (
    ScriptedOpenAI,
    openai_server_fixture,  # noqa: F401
)
from test_agent_loop import GOOD, WRONG, client_for, softsign_case

from hfadapt.agent.loop import draft_adapter
from hfadapt.agent.records import Recorder
from hfadapt.db.engine import get_engine, session
from hfadapt.db.tables import HubModel, Run


def test_draft_top_without_sweeps_is_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # the endpoint settings are checked first (before the database is opened): give them
    args = ["draft", "--top", "3", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]
    code, out, err = run(args, monkeypatch, capsys)
    assert code == 2, (code, out, err)
    assert "no failure fingerprints recorded" in err and "run a sweep" in err, err


def test_draft_needs_exactly_one_source_and_a_model(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(["draft", "--model", "m"], monkeypatch, capsys)
    assert code == 2 and "exactly one of MODEL, --fingerprint ID or --top K" in err, err
    monkeypatch.delenv("HFADAPT_AGENT_MODEL", raising=False)
    code, _, err = run(["agent-eval"], monkeypatch, capsys)
    assert code == 2 and "pass --model or set HFADAPT_AGENT_MODEL" in err, err


def _fp_run(model_id: str, fps: list[str], rule: str = "op.pow.square") -> Run:
    violations = [
        {
            "fingerprint": fp,
            "rule_id": rule,
            "op": "aten::pow.Tensor_Scalar",
            "location": {"file": "x.py", "function": "forward"},
        }
        for fp in fps
    ]
    return Run(
        model_id=model_id, verdict="lowering_failed", fingerprints=fps, violations=violations
    )


def test_draft_top_lists_fingerprints_by_downloads_they_block(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    engine = get_engine(str(tmp_path / "runs.db"))
    with session(engine) as s:
        for mid, dl in (("a/one", 1000), ("b/two", 300), ("c/three", 50)):
            s.add(HubModel(id=mid, downloads=dl))
        s.add(_fp_run("a/one", ["aaaaaaaaaaaa"]))
        s.add(_fp_run("b/two", ["bbbbbbbbbbbb", "aaaaaaaaaaaa"]))
        s.add(_fp_run("c/three", ["bbbbbbbbbbbb"]))
        s.add(
            Run(model_id="c/three", verdict="pass", fingerprints=[])
        )  # fixed since: latest run wins
    code, out, err = run(
        ["draft", "--top", "2", "--list", "--json", "--db", str(tmp_path / "runs.db")],
        monkeypatch,
        capsys,
    )
    assert code == 0, err
    top = json.loads(out)
    assert [(t["fingerprint"], t["downloads"]) for t in top] == [
        ("aaaaaaaaaaaa", 1300),
        ("bbbbbbbbbbbb", 300),
    ], top
    assert top[0]["models"] == ["a/one", "b/two"]


def test_attempts_lists_and_shows_recorded_attempts(
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "runs.db")
    engine = get_engine(db)
    openai_server.script = [WRONG, GOOD]
    client = client_for(openai_server.url)
    outcome = draft_adapter(
        softsign_case(),
        client,
        recorder=Recorder(engine),
        steps=("load", "equivalence"),
        adapters_dir=tmp_path / "adapters",
        taken_names={},
    )
    assert outcome.accepted, outcome.reason
    code, out, err = run(["attempts", "--db", db, "--json"], monkeypatch, capsys)
    assert code == 0, err
    listed = json.loads(out)
    assert [a["result"] for a in listed] == ["accepted", "failed at equivalence"], listed
    assert listed[1]["steps"] == {"policy": "pass", "load": "pass", "equivalence": "fail"}
    code, out, err = run(["attempts", str(listed[1]["id"]), "--db", db], monkeypatch, capsys)
    assert code == 0, err
    assert "failed at equivalence" in out and "NOT equivalent" in out and "x * x" in out, out
    code, out, err = run(["attempts", "999", "--db", db], monkeypatch, capsys)
    assert code == 2 and "no attempt 999" in err


GELU_BERT = {
    "architectures": ["BertModel"],
    "model_type": "bert",
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 256,
    "hidden_act": "gelu_new",
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}


@pytest.mark.slow
def test_draft_model_diagnoses_drafts_validates_on_the_model_and_accepts(
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    from test_agent_device import GELU, fenced

    folder = tmp_path / "gelu-bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GELU_BERT))
    monkeypatch.setenv("HFADAPT_HOME", str(tmp_path / "home"))

    def answer(body: dict) -> str:  # a right answer for gelu_new, no code for the rest
        if "NewGELUActivation" in body["messages"][1]["content"]:
            return fenced(GELU.solution.replace("eval-gelu-new-cube", "gelu-new-agent"))
        return "I cannot fix this one."

    openai_server.script = [answer] * 10
    db = str(tmp_path / "runs.db")
    args = [
        "draft",
        str(folder),
        "--mode",
        "structural",
        "--no-adapters",
        "--base-url",
        openai_server.url,
    ]
    args += [
        "--model",
        "scripted-model",
        "--api-key",
        "sk-cli",
        "--max-attempts",
        "1",
        "--db",
        db,
        "--json",
    ]
    code, out, err = run(args, monkeypatch, capsys)
    assert code == 0, err
    outcomes = {o["fingerprint"]: o for o in json.loads(out)}
    accepted = [o for o in outcomes.values() if o["outcome"] == "accepted"]
    assert len(outcomes) >= 2 and len(accepted) == 1, outcomes
    path = Path(accepted[0]["adapter_path"])
    assert path == tmp_path / "home" / "adapters" / "gelu_new_agent.py"
    assert accepted[0]["steps"][-1] == {
        s: "pass" for s in ("policy", "load", "equivalence", "device", "end_to_end")
    }
    assert "End to end: CPU vs stock min token cosine 1.000000" in path.read_text()
    from hfadapt.adapters.registry import default_registry

    try:
        assert "gelu-new-agent" in [a.name for a in default_registry(reload=True).adapters]
    finally:  # other tests must not see this user folder in the process-wide registry
        monkeypatch.delenv("HFADAPT_HOME")
        default_registry(reload=True)
    # The diagnosis was recorded: --top now ranks its fingerprints.
    code, out, err = run(
        ["draft", "--top", "10", "--list", "--json", "--db", db], monkeypatch, capsys
    )
    assert code == 0, err
    assert accepted[0]["fingerprint"] in [t["fingerprint"] for t in json.loads(out)]


def test_fingerprint_prefix_finds_its_models_or_says_why(tmp_path: Path) -> None:
    from hfadapt.agent.workflows import models_for_fingerprint
    from hfadapt.errors import UsageError

    engine = get_engine(str(tmp_path / "runs.db"))
    with session(engine) as s:
        s.add(HubModel(id="a/one", downloads=10))
        s.add(HubModel(id="b/two", downloads=900))
        s.add(_fp_run("a/one", ["abc111111111"]))
        s.add(_fp_run("b/two", ["abc111111111", "abc222222222"]))
    assert models_for_fingerprint(engine, "abc1") == ("abc111111111", ["b/two", "a/one"])
    with pytest.raises(UsageError, match="ambiguous"):
        models_for_fingerprint(engine, "abc")
    with pytest.raises(UsageError, match="no recorded run has fingerprint 'fff'"):
        models_for_fingerprint(engine, "fff")
