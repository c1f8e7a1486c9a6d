"""Issue 11, each attack a regression test: hostile drafts served by the loopback endpoint are
refused or rejected, code that slips past every in-process fence stays inside the bubblewrap
sandbox (sentinel files, a loopback listener and a process scan prove nothing acted outside),
cheating adapters are caught by proofs the draft cannot reach, and the registry never imports
an agent-origin file that fails the allowlist nor dies of one that raises SystemExit."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_runner import run_cli
from openai_server import (
    ScriptedOpenAI,
    openai_server_fixture,  # noqa: F401
)
from test_agent_loop import GOOD, STEPS, draft, rows, run, softsign_case

from hfadapt import isolation
from hfadapt.adapters.registry import AGENT_MARKER, Registry, user_adapters_dir
from hfadapt.agent.loop import ACCEPTED
from hfadapt.agent.sandbox import run_sandbox

KEY = "sk-live-CONTAINMENT-7777"
TESTS = str(Path(__file__).resolve().parent)
SOLUTION = GOOD.split("```python\n")[1].split("```")[0]
# Sentinels live where a sandboxed process could only reach by escaping: /var/tmp on the host.
SENTINELS = Path("/var/tmp") / f"hfadapt-containment-{os.getpid()}"
ORPHAN = "hfadapt-containment-orphan"

needs_bwrap = pytest.mark.skipif(
    isolation.unavailable_reason() is not None,
    reason=f"no OS isolation here: {isolation.unavailable_reason()}",
)


def hostile_example(seed: int) -> Any:
    """Runs inside the sandbox as trusted example code would, and does every escape of the
    issue through calls that raise no audit event (libc via ctypes, a shell, torch.from_file)."""
    import ctypes

    import torch

    from hfadapt.agent.evalcases import softsign_example

    plan = json.loads(Path(os.environ["HFADAPT_TEST_PLAN"]).read_text())
    out = Path(os.environ["HFADAPT_SANDBOX_OUTPUT"])
    libc = ctypes.CDLL(None)
    shell = "; ".join(
        [
            f"echo pwned > {plan['dir']}/written",
            f"mkdir {plan['dir']}/made",
            f"ln -s / {plan['dir']}/link",
            f"echo 'import os' > {plan['adapters']}/planted.py",
            f"(setsid sh -c 'sleep 120' {ORPHAN} &)",
            f"{plan['python']} -c \"import socket; socket.create_connection(('127.0.0.1', "
            f'{plan["port"]}), timeout=2)" 2> {out}/net.txt',
        ]
    )
    libc.system(shell.encode())
    try:
        torch.from_file(f"{plan['dir']}/from_file", shared=True, size=16)
    except Exception as exc:  # the read-only root refuses it
        (out / "from_file.txt").write_text(repr(exc))
    seen = []
    for pid in ("1", str(os.getppid()), str(plan["host_pid"]), "self"):
        for part in ("environ", "cmdline"):
            try:
                seen.append(Path(f"/proc/{pid}/{part}").read_bytes().decode(errors="replace"))
            except OSError as exc:
                seen.append(f"{pid}/{part}: {exc}")
    (out / "seen.txt").write_text("\n".join(seen))
    return softsign_example(seed)


def _orphans() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if ORPHAN.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@needs_bwrap
def test_code_past_every_in_process_fence_stays_inside_the_sandbox(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PYTHONPATH", TESTS)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    SENTINELS.mkdir(exist_ok=True)
    adapters = user_adapters_dir()
    adapters.mkdir(parents=True, exist_ok=True)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.setblocking(False)
    plan = {
        "dir": str(SENTINELS),
        "adapters": str(adapters),
        "port": listener.getsockname()[1],
        "host_pid": os.getpid(),
        "python": os.path.realpath(sys.executable),
    }
    plan_file = SENTINELS / "plan.json"
    plan_file.write_text(json.dumps(plan))
    monkeypatch.setattr(isolation, "ENV_ALLOWLIST", (*isolation.ENV_ALLOWLIST, "HFADAPT_TEST_PLAN"))
    monkeypatch.setenv("HFADAPT_TEST_PLAN", str(plan_file))
    case = softsign_case()
    case.example = "test_agent_containment:hostile_example"
    try:
        sandbox = run_sandbox(
            SOLUTION,
            {"case": case.to_dict(), "steps": ["load", "equivalence"]},
            secrets=[KEY],
            keep=tmp_path / "kept",
        )
        assert sandbox.isolated
        assert [s.step for s in sandbox.steps] == ["load", "equivalence"], sandbox.stderr_tail
        escaped = sorted(p.name for p in SENTINELS.iterdir() if p.name != "plan.json")
        assert escaped == [], f"written outside the sandbox: {escaped}"
        assert not (adapters / "planted.py").exists(), "a file was planted in the adapters folder"
        with pytest.raises(BlockingIOError):
            conn, _ = listener.accept()
            conn.close()
        kept = tmp_path / "kept" / "out"
        net = (kept / "net.txt").read_text()
        assert "Network is unreachable" in net or "Errno" in net, net
        assert "Read-only file system" in (kept / "from_file.txt").read_text()
        seen = (kept / "seen.txt").read_text()
        assert KEY not in seen and KEY[::-1] not in seen, "a secret was readable in the sandbox"
        assert f"{plan['host_pid']}/environ: [Errno 2]" in seen, seen[-400:]
        survivors = _orphans()
        for _ in range(50):  # the PID namespace dies with the sandbox; the kill is asynchronous
            if not survivors:
                break
            time.sleep(0.2)
            survivors = _orphans()
        assert survivors == [], f"processes outlived the sandbox: {survivors}"
    finally:
        listener.close()
        for pid in _orphans():
            os.kill(pid, 9)
        for p in sorted(SENTINELS.glob("*"), reverse=True):
            p.unlink() if p.is_symlink() or p.is_file() else p.rmdir()
        SENTINELS.rmdir()


# -- hostile drafts from the endpoint: refused by the allowlist before anything of them runs --

HOSTILE = {
    "import-time spawn through torch.os": (
        "import torch\nfrom hfadapt.adapters.api import adapter\n"
        "torch.os.posix_spawn('/bin/sh', ['sh', '-c', 'touch SENTINEL'], {})\n"
    ),
    "ctypes through torch.ctypes": (
        "import torch\nfrom hfadapt.adapters.api import adapter\n_L = torch.ctypes.CDLL(None)\n"
    ),
    "tampering through sys.modules": (
        "import torch\nfrom hfadapt.adapters.api import adapter\n"
        "torch.sys.modules['hfadapt.agent.steps'].STEPS.update({})\n"
    ),
    "TYPE_CHECKING or True": (
        "import torch\nfrom typing import TYPE_CHECKING\nfrom hfadapt.adapters.api import adapter\n"
        "if TYPE_CHECKING or True:\n    open('SENTINEL', 'w')\n"
    ),
    "reading the parent's environ": (
        "import torch\nfrom hfadapt.adapters.api import adapter\n"
        "ENV = open('/proc/1/environ').read()\n"
    ),
    "torch.save outside": (
        "import torch\nfrom hfadapt.adapters.api import adapter\n"
        "torch.save(torch.ones(1), 'SENTINEL')\n"
    ),
    "planting into the adapters folder": (
        "import torch\nfrom hfadapt.adapters.api import adapter\n"
        "with open('ADAPTERS/planted.py', 'w') as f:\n    f.write('import os')\n"
    ),
    "network to loopback": (
        "import socket\nimport torch\nfrom hfadapt.adapters.api import adapter\n"
        "socket.create_connection(('127.0.0.1', 9))\n"
    ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_draft_is_refused_before_it_runs(
    name: str, openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    sentinel = tmp_path / "sentinel"
    adapters = tmp_path / "adapters"
    top = HOSTILE[name].replace("SENTINEL", str(sentinel)).replace("ADAPTERS", str(adapters))
    body = draft("    return x * torch.reciprocal(1.0 + x.abs())")
    openai_server.script = [body.replace("```python\n", "```python\n" + top, 1)]
    outcome, engine = run(openai_server.url, tmp_path, attempts=1)
    assert outcome.outcome != ACCEPTED, outcome.reason
    attempt = outcome.attempts[0]
    assert attempt.failed_step == "policy", (attempt.failed_step, attempt.feedback)
    assert not sentinel.exists(), "the draft ran"
    assert not list(adapters.glob("*.py")) if adapters.exists() else True
    _, attempts = rows(engine)
    assert attempts[0].unsafe_no_isolation is False


@needs_bwrap
def test_cheats_are_rejected_with_numbers_and_a_correct_draft_is_accepted(
    openai_server: ScriptedOpenAI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    softsign = "x * torch.reciprocal(1.0 + x.abs())"
    openai_server.script = [
        draft(f"    if x.device.type == 'spyre':\n        return x\n    return {softsign}"),
        draft(
            f"    if x.shape[-2] > 256:\n        return torch.zeros_like(x)\n    return {softsign}"
        ),
        draft(f"    if x.dtype == torch.float64:\n        return {softsign}\n    return x * 0.5"),
        GOOD,
    ]
    outcome, _ = run(openai_server.url, tmp_path, attempts=4)
    feedback = [a.feedback for a in outcome.attempts]
    assert outcome.outcome == ACCEPTED, (outcome.reason, feedback)
    assert [a.failed_step for a in outcome.attempts] == ["equivalence"] * 3 + [None], feedback
    assert "on the device vs stock on the CPU: min cosine" in feedback[0], feedback[0]
    assert "stretched (f64): float64 max rel err" in feedback[1], feedback[1]
    assert "min cosine" in feedback[2], feedback[2]
    # The numbers reach the agent: the repair prompt after attempt 1 carries the cosine.
    assert any("min cosine" in m for m in openai_server.user_messages(1)), "no numbers fed back"
    text = outcome.adapter_path.read_text() if outcome.adapter_path else ""
    assert text.startswith(AGENT_MARKER) and '"attempt_id"' in text
    assert '"example": "hfadapt.agent.evalcases:softsign_example"' in text, text[:900]
    # The accepted adapter is re-proven from what hfadapt stored with it.
    from hfadapt.adapters import registry

    monkeypatch.setenv("HFADAPT_ADAPTERS_PATH", str(tmp_path / "adapters"))
    registry.default_registry(reload=True)
    code, out, err = run_cli(
        ["adapters", "verify", "softsign-agent", "--json"], monkeypatch, capsys
    )
    registry.default_registry(reload=True)
    assert code == 0, (out, err)
    (proof,) = json.loads(out)
    assert proof["name"] == "softsign-agent" and proof["ok"], proof


def test_draft_provenance_is_replaced_by_the_system_s(
    openai_server: ScriptedOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hfadapt.agent import validate as validate_mod

    fake = draft("    return x * torch.reciprocal(1.0 + x.abs())").replace(
        'rule="op.pow.square")',
        'rule="op.pow.square", provenance={"author": "a-human", "evidence": {"human_review": "approved"}})',
    )
    openai_server.script = [fake]
    real = validate_mod.validate
    monkeypatch.setattr(
        "hfadapt.agent.loop.validate", lambda *a, **k: real(*a, **{**k, "steps": ("load",)})
    )
    outcome, _ = run(openai_server.url, tmp_path, attempts=1)
    assert outcome.outcome == ACCEPTED, outcome.reason
    text = outcome.adapter_path.read_text() if outcome.adapter_path else ""
    assert "human_review" not in text and "a-human" not in text, text
    assert "provenance=_PROVENANCE" in text and '"origin": "agent"' in text


# -- the registry ------------------------------------------------------------------------------


def test_agent_file_failing_the_allowlist_is_never_imported_and_reported_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = user_adapters_dir()
    folder.mkdir(parents=True, exist_ok=True)
    sentinel = tmp_path / "imported"
    (folder / "evil.py").write_text(
        f"{AGENT_MARKER}\nimport torch\nfrom hfadapt.adapters.api import adapter\n"
        f"open({str(sentinel)!r}, 'w').write('ran')\n"
    )
    caplog.set_level("WARNING")
    for _ in range(3):
        reg = Registry()
        reg.load_folder(folder, "user")
        assert [e.path for e in reg.errors] == [str(folder / "evil.py")], reg.errors
        assert "refused by the policy" in reg.errors[0].error, reg.errors[0].error
    assert not sentinel.exists(), "the refused file was imported"
    assert caplog.text.count("skipped adapter file") == 1, caplog.text


@pytest.mark.parametrize("raised", ["SystemExit(3)", "KeyboardInterrupt()", "RecursionError()"])
def test_adapter_loading_survives_base_exceptions(raised: str, tmp_path: Path) -> None:
    (tmp_path / "dies.py").write_text(f"raise {raised}\n")
    (tmp_path / "fine.py").write_text(
        "from hfadapt.adapters.api import adapter\n\n"
        '@adapter(name="fine", target="hfadapt.agent.evalcases:Softsign.forward", rule="r")\n'
        "def forward(self, x):\n    return x\n"
    )
    reg = Registry()
    reg.load_folder(tmp_path, "user")
    assert [a.name for a in reg.adapters] == ["fine"]
    assert len(reg.errors) == 1 and raised.split("(")[0] in reg.errors[0].error, reg.errors


def test_no_isolation_refuses_in_one_line_unless_unsafe(
    monkeypatch: pytest.MonkeyPatch, openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    from hfadapt.errors import IsolationUnavailableError

    monkeypatch.setattr(isolation, "unavailable_reason", lambda: "bwrap missing (test)")
    with pytest.raises(IsolationUnavailableError) as err:
        run(openai_server.url, tmp_path, attempts=1)
    assert "bwrap missing (test)" in err.value.one_line() and "`unsafe_no_isolation`" in str(
        err.value
    )
    assert openai_server.requests == [], "the endpoint was asked before the refusal"
    openai_server.script = [GOOD]
    outcome, engine = run(openai_server.url, tmp_path, attempts=1, unsafe_no_isolation=True)
    assert outcome.outcome == ACCEPTED, outcome.reason
    _, attempts = rows(engine)
    assert [a.unsafe_no_isolation for a in attempts] == [True]
    assert STEPS == ("load", "equivalence")


def test_cli_refusals_are_one_line_with_their_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = str(tmp_path / "runs.db")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    args = ["draft", "some/model", "--model", "m", "--db", db]
    code, out, err = run_cli(args, monkeypatch, capsys)
    text = (out + err).strip()
    assert code == 2 and "no endpoint: pass --base-url" in text, (code, text)
    assert len(text.splitlines()) == 1, text
    monkeypatch.setattr(isolation, "unavailable_reason", lambda: "bwrap missing (test)")
    code, out, err = run_cli([*args, "--base-url", "http://127.0.0.1:9/v1"], monkeypatch, capsys)
    text = (out + err).strip()
    # no sandbox here is something the machine lacks: exit 3
    assert code == 3 and "bwrap missing (test)" in text and "--unsafe-no-isolation" in text, text
    assert len(text.splitlines()) == 1, text
