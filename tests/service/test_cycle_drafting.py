"""``hfadapt cycle --draft``: the failure fingerprints new since the last completed cycle (and
only those) are drafted for against the loopback scripted OpenAI endpoint, most downloads
blocked first, one at a time, until the attempt or token budget is spent; each is recorded in
``cycle_draft`` and counted in the cycle's summary and JSON; a resumed cycle keeps what it
drafted; bad budgets and a missing endpoint are refused before any work. The models'
diagnosis (``hfadapt.agent.workflows.cases_for_model``) is replaced by the softsign case
carrying the wanted fingerprint: the planning, the endpoint, the proofs and the acceptance
are the real ones."""

from __future__ import annotations

import functools
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlmodel import col, select
from support.cli_runner import run_cli
from support.drafting import GOOD, softsign_case
from support.openai_server import (
    ScriptedOpenAI,
    openai_server_fixture,  # noqa: F401
)

from hfadapt.agent.client import AgentSettings
from hfadapt.db.engine import get_engine, session
from hfadapt.db.tables import DONE, RUNNING, Cycle, CycleDraft, HubModel, Run, Sweep, utcnow
from hfadapt.judge.options import JudgeOptions
from hfadapt.service.compare import compare_sweeps
from hfadapt.service.drafting import CycleDrafting, DraftBudget, draft_new_fingerprints

OLD = "0ld0ld0ld0ld"  # failing in both cycles: never drafted for
NEW = {"org/n1": ("aaaa11111111", 9_000), "org/n2": ("bbbb22222222", 5_000),
       "org/n3": ("cccc33333333", 3_000)}  # fmt: skip
NO_CODE = "I would rather not write code today."  # refused at extraction: a cheap attempt
PER_REQUEST = 1500  # the scripted server's usage: 1200 prompt + 300 completion tokens


def _run(model: str, sweep_id: int, fingerprint: str | None) -> Run:
    verdict = "lowering_failed" if fingerprint else "pass"
    violations = [{"fingerprint": fingerprint, "rule_id": "op.pow.square",
                   "op": "aten::pow.Tensor_Scalar", "message": "pow"}] if fingerprint else []  # fmt: skip
    return Run(model_id=model, sweep_id=sweep_id, verdict=verdict, mode="structural",
               execution="eager", reason=f"{verdict} in sweep {sweep_id}",
               fingerprints=[fingerprint] if fingerprint else [], violations=violations,
               finished_at=utcnow())  # fmt: skip


@pytest.fixture
def two_cycles(tmp_path: Path) -> Iterator[tuple[Any, int, Any]]:
    """(engine, the running second cycle, its comparison): cycle 1 (done) failed with OLD
    only; cycle 2's sweep fails with OLD and the three NEW fingerprints."""
    engine = get_engine(str(tmp_path / "runs.db"))
    with session(engine) as sess:
        for model, downloads in [("org/old", 20_000), *[(m, d) for m, (_, d) in NEW.items()]]:
            sess.add(HubModel(id=model, downloads=downloads, model_type="bert"))
    sweeps = []
    for number in (1, 2):
        with session(engine) as sess:
            sweep = Sweep(key=f"s{number}", status=DONE, models=4, finished_at=utcnow())
            sess.add(sweep)
            sess.flush()
            assert sweep.id is not None
            sess.add(_run("org/old", sweep.id, OLD))
            for model, (fp, _) in NEW.items():
                sess.add(_run(model, sweep.id, fp if number == 2 else None))
            sweeps.append(sweep.id)
    with session(engine) as sess:
        sess.add(Cycle(key="{}", status=DONE, sweep_id=sweeps[0], finished_at=utcnow()))
        second = Cycle(key="{}", status=RUNNING, sweep_id=sweeps[1], baseline_sweep_id=sweeps[0])
        sess.add(second)
        sess.flush()
        assert second.id is not None
        cycle_id = second.id
    yield engine, cycle_id, compare_sweeps(engine, sweeps[1], sweeps[0])
    engine.dispose()


def _diagnosis_shows(monkeypatch: pytest.MonkeyPatch, shown: dict[str, str]) -> list[str]:
    """Each model's diagnosis finds the softsign case with the fingerprint ``shown`` gives it
    (none for a model not in ``shown``); returns the models diagnosed, in order."""
    from hfadapt.agent import workflows

    diagnosed: list[str] = []

    def cases_for_model(model_ref: str, judge: Any, **_: Any) -> tuple[Any, list[Any]]:
        diagnosed.append(model_ref)
        diag = SimpleNamespace(verdict="lowering_failed", reason="pow on the device")
        if model_ref not in shown:
            return SimpleNamespace(verdict="pass", reason="runs now"), []
        case = softsign_case()
        case.fingerprint = shown[model_ref]
        return diag, [case]

    monkeypatch.setattr(workflows, "cases_for_model", cases_for_model)
    return diagnosed


def _drafting(url: str, *, attempts: int, tokens: int, per_fingerprint: int) -> CycleDrafting:
    settings = AgentSettings(model="scripted-model", base_url=url, api_key="sk-test-0000",
                             max_attempts=per_fingerprint, max_retries=0, timeout_s=30)  # fmt: skip
    return CycleDrafting(settings=settings, budget=DraftBudget(attempts, tokens))


def _rows(engine: Any) -> dict[str, tuple[Any, ...]]:
    with session(engine, write=False) as sess:
        rows = sess.exec(select(CycleDraft).order_by(col(CycleDraft.id)))
        return {r.fingerprint: (r.outcome, r.attempts, r.tokens_in + r.tokens_out, r.model_id)
                for r in rows}  # fmt: skip


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Accepted drafts go to this test's $HFADAPT_HOME/adapters: the process-wide registry
    forgets them afterwards."""
    yield
    from hfadapt.adapters.registry import default_registry

    monkeypatch.delenv("HFADAPT_HOME", raising=False)
    default_registry(reload=True)


def test_the_attempt_budget_stops_drafting_new_fingerprints_only(
    two_cycles: tuple[Any, int, Any],
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine, cycle_id, comparison = two_cycles
    new = [fp for fp, _ in NEW.values()]
    assert comparison.new_fingerprints == sorted(new), comparison.new_fingerprints
    diagnosed = _diagnosis_shows(monkeypatch, {m: fp for m, (fp, _) in NEW.items()})
    openai_server.script = [NO_CODE] * 10
    drafting = _drafting(openai_server.url, attempts=3, tokens=1_000_000, per_fingerprint=2)
    result = draft_new_fingerprints(engine, cycle_id, comparison, drafting, JudgeOptions())
    summary = result.summary()
    print(f"\nsummary {summary}; requests {len(openai_server.requests)}; diagnosed {diagnosed}")
    # most downloads blocked first: n1 gets its 2 attempts, n2 the 1 left, n3 none
    assert [r.fingerprint for r in result.rows] == new, [r.fingerprint for r in result.rows]
    assert diagnosed == ["org/n1", "org/n2"], diagnosed
    assert len(openai_server.requests) == 3 == summary["attempts"], summary
    assert summary == {"new_fingerprints": 3, "drafted": 2, "accepted": 0, "refused": 2,
                       "not_reproduced": 0, "errors": 0, "skipped_budget": 1,
                       "skipped_endpoint": 0, "attempts": 3, "tokens": 3 * PER_REQUEST}  # fmt: skip
    assert _rows(engine) == {
        new[0]: ("refused", 2, 2 * PER_REQUEST, "org/n1"),
        new[1]: ("refused", 1, PER_REQUEST, "org/n2"),
        new[2]: ("skipped_budget", 0, 0, "org/n3"),
    }, _rows(engine)
    assert OLD not in _rows(engine), "a fingerprint of the last cycle was drafted for"
    assert "attempt budget spent (3 of 3)" in (result.rows[2].reason or ""), result.rows[2]


def test_the_token_budget_then_a_resumed_cycle_drafts_what_is_left(
    two_cycles: tuple[Any, int, Any],
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine, cycle_id, comparison = two_cycles
    new = [fp for fp, _ in NEW.values()]
    # org/n2 does not show its fingerprint when diagnosed now
    _diagnosis_shows(monkeypatch, {"org/n1": new[0], "org/n3": new[2]})
    openai_server.script = [NO_CODE] * 10
    drafting = _drafting(openai_server.url, attempts=50, tokens=2_000, per_fingerprint=4)
    result = draft_new_fingerprints(engine, cycle_id, comparison, drafting, JudgeOptions())
    print(f"\nfirst: {result.summary()}")
    # the agent checks its limit before each attempt: 1,500 < 2,000 asks once more (3,000),
    # then the budget is spent: past it by at most one request's tokens
    assert result.tokens == 2 * PER_REQUEST <= 2_000 + PER_REQUEST, result.summary()
    assert _rows(engine) == {
        new[0]: ("refused", 2, 2 * PER_REQUEST, "org/n1"),
        new[1]: ("skipped_budget", 0, 0, "org/n2"),
        new[2]: ("skipped_budget", 0, 0, "org/n3"),
    }, _rows(engine)
    assert result.rows[0].agent_outcome == "token_budget", result.rows[0]
    assert len(openai_server.requests) == 2, len(openai_server.requests)

    # the same cycle again (resumed) with a larger budget: n1 is kept, n2 and n3 are tried
    requests_before = len(openai_server.requests)
    drafting = _drafting(openai_server.url, attempts=50, tokens=6_000, per_fingerprint=4)
    again = draft_new_fingerprints(engine, cycle_id, comparison, drafting, JudgeOptions())
    print(f"resumed: {again.summary()}; rows {_rows(engine)}")
    rows = _rows(engine)
    assert rows[new[0]] == ("refused", 2, 2 * PER_REQUEST, "org/n1"), rows
    assert rows[new[1]][0] == "not_reproduced" and rows[new[1]][1] == 0, rows
    # 6,000 - 3,000 spent = 3,000 left: two requests (1,500 < 3,000), then spent
    assert rows[new[2]] == ("refused", 2, 2 * PER_REQUEST, "org/n3"), rows
    assert len(openai_server.requests) - requests_before == 2, openai_server.requests
    assert again.summary()["tokens"] == 4 * PER_REQUEST <= 6_000, again.summary()
    assert "did not occur now" in (again.rows[1].reason or ""), again.rows[1]


def test_a_dead_endpoint_skips_every_new_fingerprint_without_diagnosing(
    two_cycles: tuple[Any, int, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from support.openai_server import dead_url

    engine, cycle_id, comparison = two_cycles
    diagnosed = _diagnosis_shows(monkeypatch, {m: fp for m, (fp, _) in NEW.items()})
    drafting = _drafting(dead_url(), attempts=3, tokens=10_000, per_fingerprint=2)
    result = draft_new_fingerprints(engine, cycle_id, comparison, drafting, JudgeOptions())
    print(f"\n{result.summary()}; {result.note}")
    assert diagnosed == [], f"models diagnosed for a dead endpoint: {diagnosed}"
    assert result.summary()["skipped_endpoint"] == 3 and result.tokens == 0, result.summary()
    assert "connection refused" in result.note, result.note
    assert {r[0] for r in _rows(engine).values()} == {"skipped_endpoint"}, _rows(engine)


def test_the_first_cycle_drafts_nothing(tmp_path: Path) -> None:
    engine = get_engine(str(tmp_path / "runs.db"))
    drafting = _drafting("http://127.0.0.1:9/v1", attempts=3, tokens=10_000, per_fingerprint=2)
    result = draft_new_fingerprints(engine, 1, None, drafting, JudgeOptions())
    assert result.rows == [] and "first cycle" in result.note, result.to_dict()
    engine.dispose()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--draft-attempts", "5"], "--draft-attempts only go with --draft"),
        (["--draft", "--draft-attempts", "0"], "--draft-attempts must be a whole number from 1 to 1,000 (got 0)"),
        (["--draft", "--draft-tokens", "10"], "--draft-tokens must be a whole number from 1,000 to 100,000,000 (got 10)"),
        (["--draft", "--base-url", "http://127.0.0.1:9/v1"], "no agent model: pass --model"),
        (["--draft", "--model", "m"], "no endpoint: pass --base-url"),
    ],
)  # fmt: skip
def test_bad_drafting_options_are_refused_before_any_work(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    says: str,
) -> None:
    for var in ("OPENAI_BASE_URL", "OPENAI_API_KEY", "HFADAPT_AGENT_MODEL"):
        monkeypatch.delenv(var, raising=False)
    if "--draft" in args and ("--draft-attempts" in args or "--draft-tokens" in args):
        args = [*args, "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
    db = tmp_path / "runs.db"
    code, out, err = run_cli(["cycle", "--offline", "--top", "3", *args, "--db", str(db)],
                             monkeypatch, capsys)  # fmt: skip
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and says in lines[0], (code, err)
    assert out == "" and not db.exists(), "the refused cycle opened the database"


def _fake_sweeps(monkeypatch: pytest.MonkeyPatch, worker: str) -> None:
    """The cycle's sweeps use the stand-in worker (fake verdicts, no device)."""
    from hfadapt.service import cycle as service_cycle

    monkeypatch.setattr(service_cycle, "run_sweep",
                        functools.partial(service_cycle.run_sweep, worker=worker))  # fmt: skip


def test_cycle_draft_on_the_command_line_drafts_the_new_fingerprint_and_reports_it(
    tmp_path: Path,
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    fake_worker: str,
    fresh_registry: None,
) -> None:
    """Two cycles of fake verdicts; the first cycle's runs are made to lack one fingerprint
    the second has, which ``--draft`` then drafts for (accepted at the first answer)."""
    from support.sweep_fakes import FINGERPRINTS

    _fake_sweeps(monkeypatch, fake_worker)
    db = tmp_path / "runs.db"
    base = ["cycle", "--offline", "--limit", "50", "--top", "12", "--db", str(db), "--draft",
            "--base-url", openai_server.url, "--model", "scripted-model", "--api-key", "sk-cli"]  # fmt: skip
    code, out, err = run_cli(base, monkeypatch, capsys)
    assert code == 0, (code, err)
    assert "drafting: first cycle on this database: no fingerprint is new" in err, err
    assert openai_server.requests == [], "the first cycle asked the endpoint"
    old, new = FINGERPRINTS
    with sqlite3.connect(db) as conn:  # the first cycle's runs knew only `old`
        conn.execute("UPDATE run SET fingerprints = replace(fingerprints, ?, ?)", (new, old))
        failing = conn.execute("SELECT model_id FROM run WHERE fingerprints LIKE ?",
                               (f"%{old}%",)).fetchall()  # fmt: skip
    assert failing, "the fake sweep failed no model: nothing to draft for"
    diagnosed = _diagnosis_shows(monkeypatch, {m: new for (m,) in failing})
    openai_server.script = [GOOD]
    code, out, err = run_cli([*base, "--draft-attempts", "2", "--json"], monkeypatch, capsys)
    assert code == 0, (code, err[-2000:])
    data = json.loads(out)
    drafted = data["drafting"]
    print(f"\ndrafting {json.dumps(drafted)[:600]}; diagnosed {diagnosed}")
    assert data["comparison"]["new_fingerprints"] == [new], data["comparison"]
    assert {k: drafted[k] for k in ("new_fingerprints", "drafted", "accepted", "refused",
            "skipped_budget", "attempts", "tokens")} == {"new_fingerprints": 1, "drafted": 1,
            "accepted": 1, "refused": 0, "skipped_budget": 0, "attempts": 1,
            "tokens": PER_REQUEST}, drafted  # fmt: skip
    assert drafted["budget"] == {"attempts": 2, "tokens": 200_000}, drafted["budget"]
    (row,) = drafted["fingerprints"]
    home = tmp_path / "hfadapt_home" / "adapters"
    assert drafted["adapters_dir"] == str(home) and row["adapter_path"].startswith(str(home)), row
    assert row["fingerprint"] == new and len(diagnosed) == 1, (row, diagnosed)
    assert data["seconds"]["draft"] > 0, data["seconds"]
    with sqlite3.connect(db) as conn:
        recorded = conn.execute("SELECT cycle_id, fingerprint, outcome, tokens_in + tokens_out "
                                "FROM cycle_draft").fetchall()  # fmt: skip
    assert recorded == [(data["cycle"], new, "accepted", PER_REQUEST)], recorded
