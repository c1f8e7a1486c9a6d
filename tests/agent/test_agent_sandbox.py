"""The sandbox: no secrets in its environment, an audit hook that refuses writes outside its
scratch space and network access, results read with a byte cap, and API keys never reaching
runs.db or the logs."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
from support.drafting import GOOD, TARGET, client_for, softsign_case
from support.openai_server import (
    ScriptedOpenAI,
    openai_server_fixture,  # noqa: F401
)

from hfadapt.agent.loop import ACCEPTED, draft_adapter
from hfadapt.agent.options import DraftOptions
from hfadapt.agent.records import Recorder
from hfadapt.agent.sandbox import clean_env, run_sandbox
from hfadapt.db.engine import get_engine

KEY = "sk-live-THIS-IS-SECRET-4242"
# the sandboxed worker imports this test module by name, and it imports tests/support
HERE = Path(__file__).resolve()
TESTS = os.pathsep.join([str(HERE.parent), str(HERE.parents[1])])
SOLUTION = GOOD.split("```python\n")[1].split("```")[0]


def env_example(seed: int) -> Any:
    """An example builder that shows the sandbox's environment (on standard error)."""
    import sys

    from hfadapt.agent.evalcases import softsign_example

    print("ENV " + json.dumps(sorted(dict(os.environ).items())), file=sys.stderr, flush=True)
    return softsign_example(seed)


def flood_example(seed: int) -> Any:
    """An example builder that writes far more than the result cap to every open descriptor."""
    chunk = b"x" * (1 << 20)
    for _ in range(80):
        for fd in range(1, 8):
            try:
                os.write(fd, chunk)
            except OSError:
                continue
    raise AssertionError("unreachable: the parent kills a sandbox past its result cap")


def lingering_example(seed: int) -> Any:
    """An example builder that shows the sandbox's garbage collector (on standard error), then
    leaves something to run after its results: an exit handler and a thread that is not a
    daemon, sleeping for a minute."""
    import atexit
    import gc
    import sys
    import threading
    import time

    from hfadapt.agent.evalcases import softsign_example

    print("GC", *gc.get_threshold(), gc.get_freeze_count(), file=sys.stderr, flush=True)
    atexit.register(lambda: print("EXIT HANDLER RAN", file=sys.stderr, flush=True))
    threading.Thread(target=time.sleep, args=(60,), daemon=False).start()
    return softsign_example(seed)


ESCAPE_TARGET = Path("/var/tmp/hfadapt-test-escape.txt")


def escape_example(seed: int) -> Any:
    """An example builder that tries to write outside the sandbox folder."""
    with open(ESCAPE_TARGET, "w") as fh:
        fh.write("escaped")
    raise AssertionError("unreachable")


def network_example(seed: int) -> Any:
    import socket

    socket.create_connection(("127.0.0.1", 9), timeout=1)
    raise AssertionError("unreachable")


def _secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("HF_TOKEN", "hf_secret_token_value")
    monkeypatch.setenv("MY_SERVICE_SECRET", "s3cr3t-value")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("INNOCENT_LOOKING", KEY)  # a secret under a harmless name: dropped by value
    monkeypatch.setenv("PYTHONPATH", TESTS)


def test_clean_env_drops_every_secret_by_name_and_by_value(monkeypatch: pytest.MonkeyPatch) -> None:
    _secret_env(monkeypatch)
    env = clean_env([KEY])
    values = (KEY, "hf_secret_token_value", "s3cr3t-value", "AKIAEXAMPLE")
    leaked = sorted(k for k, v in env.items() if any(x in v for x in values))
    assert leaked == [], leaked
    for name in (
        "OPENAI_API_KEY",
        "HF_TOKEN",
        "MY_SERVICE_SECRET",
        "AWS_ACCESS_KEY_ID",
        "INNOCENT_LOOKING",
    ):
        assert name not in env
    assert env["HF_HUB_OFFLINE"] == "1" and env["HFADAPT_SANDBOX"] == "1"


def test_the_sandbox_process_sees_no_secret(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _secret_env(monkeypatch)
    case = softsign_case()
    case.example = "test_agent_sandbox:env_example"
    run = run_sandbox(
        SOLUTION, {"case": case.to_dict(), "steps": ["load", "capture"]}, secrets=[KEY]
    )
    assert [(s.step, s.status) for s in run.steps] == [("load", "pass"), ("capture", "pass")], (
        run.stderr_tail
    )
    line = next(ln for ln in run.stderr_tail.splitlines() if ln.startswith("ENV "))
    env = dict(json.loads(line[4:]))
    assert len(env) > 5, f"the probe saw only {len(env)} variables"
    assert not [k for k, v in env.items() if KEY in v], "the API key reached the sandbox"
    assert "OPENAI_API_KEY" not in env and "HF_TOKEN" not in env and "MY_SERVICE_SECRET" not in env


def test_the_sandbox_ends_once_its_results_are_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker collects garbage as the command does (hfadapt.own_process) and, its records
    written, ends at once: no exit handler of the draft's runs, and a thread the draft left
    sleeping for a minute does not hold the sandbox."""
    import time

    monkeypatch.setenv("PYTHONPATH", TESTS)
    case = softsign_case()
    case.example = "test_agent_sandbox:lingering_example"
    start = time.monotonic()
    run = run_sandbox(SOLUTION, {"case": case.to_dict(), "steps": ["load", "capture"]})
    seconds = time.monotonic() - start
    assert [(s.step, s.status) for s in run.steps] == [("load", "pass"), ("capture", "pass")], (
        run.stderr_tail
    )
    line = next(ln for ln in run.stderr_tail.splitlines() if ln.startswith("GC "))
    threshold0, threshold1, threshold2, frozen = (int(x) for x in line.split()[1:])
    print(f"{seconds:.1f} s; {line}")
    assert (threshold0, threshold1, threshold2) == (200_000, 30, 30), line
    assert frozen > 100_000, f"only {frozen} objects frozen after torch's import"
    assert "EXIT HANDLER RAN" not in run.stderr_tail, run.stderr_tail[-2000:]
    assert seconds < 45, f"the sandbox took {seconds:.1f} s: it waited for the draft's thread"


def test_the_sandbox_refuses_writes_outside_its_folder_and_network(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTHONPATH", TESTS)
    outside = ESCAPE_TARGET
    outside.unlink(missing_ok=True)
    case = softsign_case()
    case.example = "test_agent_sandbox:escape_example"
    run = run_sandbox(SOLUTION, {"case": case.to_dict(), "steps": ["load", "capture"]})
    step = run.steps[-1]
    assert (step.step, step.status) == ("capture", "fail"), run.steps
    assert "sandbox: writing" in step.summary and "not allowed" in step.summary, step.summary
    assert not outside.exists()
    case.example = "test_agent_sandbox:network_example"
    run = run_sandbox(SOLUTION, {"case": case.to_dict(), "steps": ["load", "capture"]})
    assert "sandbox: socket" in run.steps[-1].summary, run.steps[-1].summary


def test_results_past_the_byte_cap_kill_the_sandbox(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from hfadapt.agent import sandbox

    monkeypatch.setenv("PYTHONPATH", TESTS)
    monkeypatch.setattr(sandbox, "MAX_RESULT_BYTES", 8 * 1024 * 1024)
    case = softsign_case()
    case.example = "test_agent_sandbox:flood_example"
    run = run_sandbox(SOLUTION, {"case": case.to_dict(), "steps": ["load", "capture"]})
    assert run.killed == "wrote more than 8388608 bytes of results", (run.killed, run.steps)
    assert run.steps[-1].status == "killed" and run.files == {}, run.steps


@pytest.mark.usefixtures("proofs_in_process")
def test_api_key_never_reaches_runs_db_or_logs(
    openai_server: ScriptedOpenAI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    def echo_key(request: dict[str, Any]) -> str:
        headers = {k.lower(): v for k, v in openai_server.requests[-1]["headers"].items()}
        auth = headers.get("authorization", "")
        return f"Your key is {auth.removeprefix('Bearer ')}.\n" + GOOD

    openai_server.script = [echo_key]
    db = tmp_path / "runs.db"
    engine = get_engine(str(db))
    client = client_for(openai_server.url, key=KEY)
    caplog.set_level(logging.DEBUG)
    outcome = draft_adapter(
        softsign_case(),
        client,
        DraftOptions(adapters_dir=tmp_path / "adapters"),
        recorder=Recorder(engine, client.settings.secrets()),
        taken_names={},
    )
    assert outcome.outcome == ACCEPTED, outcome.reason
    sent = {k.lower(): v for k, v in openai_server.requests[0]["headers"].items()}
    assert sent["authorization"] == f"Bearer {KEY}"  # it was sent
    engine.dispose()
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("runs.db*"))
    assert b"[redacted]" in stored, "the echoed key was not stored redacted"
    assert KEY.encode() not in stored, "the API key reached runs.db"
    assert KEY not in caplog.text
    assert KEY not in repr(client) and KEY not in repr(client.settings)
    assert outcome.adapter_path is not None
    written = "".join(p.read_text(errors="replace") for p in outcome.adapter_path.iterdir())
    assert KEY not in written and TARGET in written
