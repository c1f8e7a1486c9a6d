"""`hfadapt draft`, `attempts` and `agent-eval` through the real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli_runner import run_cli as run
from support.drafting import GOOD, WRONG, client_for, softsign_case
from support.openai_server import (
    ScriptedOpenAI,
    openai_server_fixture,  # noqa: F401
)

from hfadapt.agent.loop import draft_adapter
from hfadapt.agent.options import DraftOptions
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
    # `failures` ends with the next command: it runs as printed, offline, with no endpoint
    code, out, err = run(["failures", "--db", str(tmp_path / "runs.db")], monkeypatch, capsys)
    assert code == 0, err
    line = next(ln for ln in err.splitlines() if "next: hfadapt draft" in ln)
    printed = line.split("next: hfadapt ", 1)[1].split("  (", 1)[0].split()
    code, out, err = run([*printed, "--db", str(tmp_path / "runs.db")], monkeypatch, capsys)
    assert code == 0 and "aaaaaaaaaaaa" in out, (printed, code, err)


@pytest.mark.usefixtures("proofs_in_process")
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
        DraftOptions(adapters_dir=tmp_path / "adapters"),
        recorder=Recorder(engine),
        taken_names={},
    )
    assert outcome.accepted, outcome.reason
    code, out, err = run(["attempts", "--db", db, "--json"], monkeypatch, capsys)
    assert code == 0, err
    listed = json.loads(out)
    assert [a["result"] for a in listed] == ["accepted", "failed at equivalence"], listed
    assert listed[1]["steps"] == {
        "policy": "pass",
        "load": "pass",
        "capture": "pass",
        "graph": "pass",
        "equivalence": "fail",
    }
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
def test_draft_for_a_recorded_fingerprint_follows_its_runs_mode_and_accepts(
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """A structural, compiled diagnosis records the fingerprints; `draft --fingerprint` then
    drafts in that same mode (a config-only folder: full mode would find no weights) and the
    accepted graph adapter is live in the registry."""
    from hfadapt.agent.suite import get

    gelu = get("gelu-new-cube")
    folder = tmp_path / "gelu-bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GELU_BERT))
    monkeypatch.setenv("HFADAPT_HOME", str(tmp_path / "home"))
    db = str(tmp_path / "runs.db")
    code, out, err = run(
        [
            *("diagnose", str(folder), "--mode", "structural"),
            *("--without-adapter", "gelu-new-cube", "--json", "--db", db),
        ],
        monkeypatch,
        capsys,
    )
    assert code == 1, (code, err)
    pow_fp = next(
        v["fingerprint"]
        for v in json.loads(out)["report"]["violations"]
        if v["op"].startswith("aten::pow")
    )

    def answer(body: dict) -> str:  # a right answer for gelu_new
        solution = gelu.solution.replace("eval-gelu-new-cube", "gelu-new-agent")
        return f"```python\n{solution}```\n"

    openai_server.script = [answer] * 3
    # no --without-adapter: the draft leaves out what the recorded run left out (with every
    # other adapter applied, the structural BERT passes once the cube is right)
    args = ["draft", "--fingerprint", pow_fp[:8], "--base-url", openai_server.url]
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
    assert code == 0, (out[-3000:], err)
    (outcome,) = json.loads(out)
    assert outcome["outcome"] == "accepted", outcome
    manifest_case = json.loads((Path(outcome["adapter_path"]) / "adapter.json").read_text())["case"]
    assert manifest_case["without_adapters"] == ["gelu-new-cube"], manifest_case
    path = Path(outcome["adapter_path"])
    assert path == tmp_path / "home" / "adapters" / "gelu-new-agent" and path.is_dir()
    assert outcome["steps"][-1] == {
        s: "pass"
        for s in ("policy", "load", "capture", "graph", "equivalence", "device", "end_to_end")
    }
    manifest = json.loads((path / "adapter.json").read_text())
    assert (
        manifest["case"]["model"]["structural"] is True
        and manifest["case"]["execution"] == "compile"
    )
    assert (
        "CPU vs stock min token cosine 1.000000" in manifest["provenance"]["evidence"]["end_to_end"]
    )
    from hfadapt.adapters.registry import default_registry

    try:
        assert "gelu-new-agent" in [a.name for a in default_registry(reload=True).adapters]
    finally:  # other tests must not see this user folder in the process-wide registry
        monkeypatch.delenv("HFADAPT_HOME")
        default_registry(reload=True)


def test_a_dead_endpoint_stops_draft_before_any_model_work(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import time

    from support.openai_server import dead_url

    from hfadapt.db.tables import Run

    folder = tmp_path / "gelu-bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GELU_BERT))
    db = str(tmp_path / "runs.db")
    start = time.monotonic()
    args = [
        "draft",
        str(folder),
        "--base-url",
        dead_url(),
        "--model",
        "m",
        "--api-key",
        "k",
        "--db",
        db,
    ]
    code, _, err = run(args, monkeypatch, capsys)
    seconds = time.monotonic() - start
    assert code != 0 and "connection refused" in err and "before any model work" in err, (code, err)
    assert len(err.strip().splitlines()) == 1, err
    assert seconds < 10, f"the refusal took {seconds:.1f} s: the model was judged first"
    with session(get_engine(db), write=False) as s:
        assert s.query(Run).count() == 0, "a diagnosis was recorded before the endpoint check"


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


@pytest.mark.slow
def test_draft_judges_as_asked_says_where_drafts_go_and_adapters_undoes_a_session(
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """`draft MODEL` diagnoses and proves compiled, as `diagnose` does; `--eager` judges eager
    ops. The execution is on the outcome and the attempt; a failure left unfixed exits 1;
    every run says where accepted drafts go, and `hfadapt adapters` lists and removes what a
    session added (its proof record too)."""
    from sqlmodel import select

    from hfadapt.agent.suite import get

    folder = tmp_path / "gelu-bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GELU_BERT))
    monkeypatch.setenv("HFADAPT_HOME", str(tmp_path / "home"))
    db = str(tmp_path / "runs.db")
    solution = get("gelu-new-cube").solution.replace("eval-gelu-new-cube", "gelu-new-agent")
    openai_server.script = [f"```python\n{solution}```\n", "no code, sorry"]
    base = [
        *("draft", str(folder), "--mode", "structural", "--without-adapter", "gelu-new-cube"),
        *("--base-url", openai_server.url, "--model", "scripted-model", "--api-key", "sk-cli"),
        *("--max-attempts", "1", "--db", db, "--json"),
    ]
    try:
        code, out, err = run(base, monkeypatch, capsys)
        assert code == 0, (code, out[-3000:], err)
        home = tmp_path / "home" / "adapters"
        assert f"accepted drafts written to {home}: gelu-new-agent" in err, err[-2000:]
        (compiled,) = json.loads(out)
        assert (compiled["outcome"], compiled["execution"]) == ("accepted", "compile"), compiled
        # the accepted adapter now fixes the failure: leave it out too, so it occurs again
        code, out, err = run(
            [*base, "--without-adapter", "gelu-new-agent", "--eager"], monkeypatch, capsys
        )
        assert code == 1, (code, out[-3000:], err)  # not every failure was fixed
        (eager,) = json.loads(out)
        assert eager["outcome"] != "accepted" and eager["execution"] == "eager", eager
        assert f"accepted drafts are written to {home}" in err, err[-2000:]
        assert "0 of 1 failure fixed" in err, err[-2000:]
        # what the first session added: listed, then removed with its proof record
        sid = str(compiled["session_id"])
        code, out, err = run(
            ["adapters", "list", "--session", sid, "--db", db, "--json"], monkeypatch, capsys
        )
        assert code == 0, err
        (added,) = json.loads(out)
        assert (added["adapter"], added["present"]) == ("gelu-new-agent", True), added
        assert added["path"] == str(home / "gelu-new-agent"), added
        proven = tmp_path / "home" / "proven.json"
        assert str(home / "gelu-new-agent") in proven.read_text()
        code, out, err = run(
            ["adapters", "remove", "--session", sid, "--db", db], monkeypatch, capsys
        )
        assert code == 0 and f"removed gelu-new-agent from {home}" in out, (code, out, err)
        assert not (home / "gelu-new-agent").exists()
        assert str(home / "gelu-new-agent") not in proven.read_text(), proven.read_text()
        code, out, err = run(
            ["adapters", "list", "--session", sid, "--db", db, "--json"], monkeypatch, capsys
        )
        assert json.loads(out)[0]["present"] is False, out
        code, out, err = run(["adapters", "remove", "gelu-new-agent"], monkeypatch, capsys)
        assert code == 2 and "no accepted draft named 'gelu-new-agent'" in err, (code, err)
    finally:  # other tests must not see this user folder in the process-wide registry
        from hfadapt.adapters.registry import default_registry

        monkeypatch.delenv("HFADAPT_HOME")
        default_registry(reload=True)
    with session(get_engine(db), write=False) as s:
        executions = [r.execution for r in s.exec(select(Run).order_by(Run.id))]  # type: ignore[arg-type]
    assert executions == ["compile", "eager"], executions
    code, out, err = run(["attempts", "--db", db, "--json"], monkeypatch, capsys)
    assert code == 0, err
    newest = json.loads(out)[0]["id"]
    code, out, err = run(["attempts", str(newest), "--db", db], monkeypatch, capsys)
    assert code == 0 and "judged eager" in out, out[:600]
