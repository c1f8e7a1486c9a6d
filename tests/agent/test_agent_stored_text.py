"""No control character in a stored field: an endpoint's error text with terminal
escape sequences, NUL and BEL is stored in ``agent_attempt.error`` without them, and so is
every other text the agent records (answers, drafts, steps, feedback, the session's reason);
``hfadapt attempts`` then shows clean text. Newlines and tabs stay in the texts that have lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.cli_runner import run_cli
from support.drafting import rows, run
from support.openai_server import ScriptedOpenAI, openai_server_fixture  # noqa: F401

from hfadapt.agent.loop import ENDPOINT_ERROR
from hfadapt.agent.records import Recorder
from hfadapt.db.engine import get_engine
from hfadapt.db.tables import AgentAttempt, DraftSession
from hfadapt.untrusted import clean_text, strip_control

HOSTILE = "bad \x1b[31mred\x1b[0m\x00 bell\x07 title\x1b]0;pwned\x07 del\x7f csi\x9b2J end"
# any control character but newline and tab, DEL, C1, and the bidi overrides
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_strip_control_removes_escape_sequences_whole() -> None:
    assert strip_control(HOSTILE) == "bad red bell title del csi end"
    assert strip_control("a\r\nb\rc\td\ne\u202ef") == "a\nb\nc\td\nef"
    assert clean_text("x\x1b[2Jy", 10) == "xy"


def test_endpoint_error_is_stored_and_listed_without_control_characters(
    openai_server: ScriptedOpenAI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    openai_server.script = [{"status": 400, "body": {"error": {"message": HOSTILE}}}]
    outcome, engine = run(openai_server.url, tmp_path)
    assert outcome.outcome == ENDPOINT_ERROR, outcome.reason
    sessions, attempts = rows(engine)
    error = attempts[0].error or ""
    assert "request refused (400)" in error and "bad red bell title del csi end" in error, error
    assert not CONTROL.search(error) and "\x1b" not in error and "[31m" not in error, error
    assert not CONTROL.search(sessions[0].reason or ""), sessions[0].reason
    assert not CONTROL.search(outcome.reason), outcome.reason
    engine.dispose()

    db = str(tmp_path / "runs.db")
    for args in (["attempts"], ["attempts", "--json"], ["attempts", str(attempts[0].id)]):
        code, out, err = run_cli([*args, "--db", db], monkeypatch, capsys)
        assert code == 0, err
        assert not CONTROL.search(out) and not CONTROL.search(err), (out, err)
        if args == ["attempts", str(attempts[0].id)]:
            assert "bad red bell title del csi end" in out, out
    code, out, _ = run_cli(["attempts", str(attempts[0].id), "--json", "--db", db], monkeypatch, capsys)  # fmt: skip
    assert code == 0 and "\\u00" not in out and "\\u001b" not in out, out
    assert "bad red bell title del csi end" in json.loads(out)["error"]


def test_every_recorded_text_is_stored_without_control_characters(tmp_path: Path) -> None:
    engine = get_engine(str(tmp_path / "runs.db"))
    recorder = Recorder(engine, ["sk-secret-key-123456789"])
    sess = DraftSession(fingerprint="fp\x1b[1m", reason=HOSTILE, case={"m\x00": HOSTILE})
    recorder.save_session(sess)
    row = AgentAttempt(
        session_id=sess.id,
        fingerprint="fp",
        endpoint_model="m\x07",
        prompt=[{"role": "user", "content": "line 1\r\nline\t2 " + HOSTILE}],
        response="```python\nx = 1\x00\n```\x1b[2J",
        code="def f(x):\r\n\treturn x\x08\n",
        steps=[{"step": "load", "status": "fail", "output": "Traceback\n" + HOSTILE}],
        failed_step="load\x1b[K",
        feedback="sk-\x00secret-key-123456789 " + HOSTILE,
        error=HOSTILE,
    )
    recorder.save_attempt(row)
    sessions, attempts = rows(engine)
    stored = [s.model_dump() for s in sessions] + [a.model_dump() for a in attempts]
    text = json.dumps(stored, default=str, ensure_ascii=False)
    assert not CONTROL.search(text), text
    a = attempts[0]
    assert a.prompt == [{"role": "user", "content": "line 1\nline\t2 bad red bell title del csi end"}]  # fmt: skip
    assert a.code == "def f(x):\n\treturn x\n"
    assert a.feedback is not None and "secret-key" not in a.feedback, a.feedback
    assert sessions[0].case == {"m": "bad red bell title del csi end"}
    engine.dispose()
