"""Running untrusted draft code: a separate process (``python -m hfadapt.agent.sandbox_worker``)
in a fresh temporary folder, with a wall-time limit (the process group is killed), CPU-time and
address-space limits (setrlimit in the worker), no secrets in its environment, offline Hub
flags, and an audit hook that refuses processes, sockets and writes outside its folder.

The worker reports each step as a JSON line in ``results.jsonl``; what finished before a kill
is kept, and the step that was running is the one reported as killed."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hfadapt.errors import SandboxError

# Any variable whose name says it holds a credential is dropped, whatever its value.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
SECRET_PREFIXES = (
    "OPENAI_",
    "ANTHROPIC_",
    "AWS_",
    "AZURE_",
    "GOOGLE_",
    "GH_",
    "GITHUB_",
    "HF_TOKEN",
)
DEFAULT_TIMEOUT_S = 180.0
DEFAULT_MEMORY_MB = 3072


@dataclass
class SandboxLimits:
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB  # address space the draft may add after imports
    threads: int = 1


@dataclass
class StepReport:
    """One step as the worker reported it (or as the parent saw it end)."""

    step: str
    status: str  # pass | fail | skip | killed | error
    summary: str
    output: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "pass"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SandboxRun:
    steps: list[StepReport]
    exit_code: int | None
    killed: str = ""  # why the process was killed ("" when it ended by itself)
    seconds: float = 0.0
    stderr_tail: str = ""


def clean_env(secrets: list[str] | None = None, workdir: Path | None = None) -> dict[str, str]:
    """The parent's environment less every credential, plus offline and sandbox settings."""
    values = {s for s in (secrets or []) if s}
    env = {
        k: v
        for k, v in os.environ.items()
        if not SECRET_NAME.search(k)
        and not k.upper().startswith(SECRET_PREFIXES)
        and v not in values
    }
    # The draft is imported from a checkout or an install alike.
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env.update(
        {
            "HFADAPT_SANDBOX": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MALLOC_ARENA_MAX": "2",  # each glibc arena reserves address space under RLIMIT_AS
        }
    )
    if workdir is not None:
        env["TMPDIR"] = str(workdir)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / "inductor")
    return env


def _read_steps(path: Path) -> tuple[list[StepReport], str | None]:
    """Finished steps, and the one that started but never finished (if any)."""
    steps: list[StepReport] = []
    running: str | None = None
    if not path.exists():
        return steps, None
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the kill
        if "start" in rec:
            running = rec["start"]
        elif "step" in rec:
            steps.append(StepReport(**rec))
            running = None
    return steps, running


def run_sandbox(
    draft_source: str,
    job: dict[str, Any],
    limits: SandboxLimits | None = None,
    *,
    secrets: list[str] | None = None,
    keep: Path | None = None,
) -> SandboxRun:
    """Run the job's steps on the draft in a fresh worker process."""
    limits = limits or SandboxLimits()
    workdir = Path(tempfile.mkdtemp(prefix="hfadapt-sandbox-"))
    try:
        (workdir / "draft.py").write_text(draft_source, encoding="utf-8")
        payload = {
            **job,
            "draft_path": str(workdir / "draft.py"),
            "results_path": str(workdir / "results.jsonl"),
            "memory_mb": limits.memory_mb,
            "cpu_seconds": int(limits.timeout_s) + 5,
            "threads": limits.threads,
        }
        job_path = workdir / "job.json"
        job_path.write_text(json.dumps(payload), encoding="utf-8")
        env = clean_env(secrets, workdir)
        env["OMP_NUM_THREADS"] = str(limits.threads)
        start = time.monotonic()
        with (workdir / "stderr.txt").open("wb") as err, (workdir / "stdout.txt").open("wb") as out:
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "hfadapt.agent.sandbox_worker", str(job_path)],
                    cwd=workdir,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # its own process group: a kill takes its children
                )
            except OSError as exc:
                raise SandboxError(f"cannot start the sandbox process: {exc}") from exc
            killed = ""
            try:
                code: int | None = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                killed = f"exceeded the time limit of {limits.timeout_s:g} s"
                _kill_group(proc)
                code = proc.wait()
        seconds = time.monotonic() - start
        steps, running = _read_steps(workdir / "results.jsonl")
        stderr = (workdir / "stderr.txt").read_text(encoding="utf-8", errors="replace")
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        if not killed and code not in (0, None):
            killed = _exit_reason(code, stderr, limits)
        if running is not None:
            steps.append(
                StepReport(
                    running,
                    "killed",
                    f"the sandbox was killed: {killed or 'it died'}",
                    {"stderr": tail},
                    seconds,
                )
            )
        if keep is not None:
            shutil.copytree(workdir, keep, dirs_exist_ok=True)
        return SandboxRun(steps, code, killed, seconds, tail)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _exit_reason(code: int, stderr: str, limits: SandboxLimits) -> str:
    if code < 0:
        sig = (
            signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        )
        if sig == "SIGXCPU":
            return f"exceeded the CPU-time limit ({limits.timeout_s:g} s)"
        if sig == "SIGKILL":
            return "killed (SIGKILL; out of memory?)"
        return f"ended by signal {sig}"
    if "MemoryError" in stderr or "memory limit" in stderr:
        return f"exceeded the memory limit of {limits.memory_mb} MB"
    return f"exited with code {code}"
