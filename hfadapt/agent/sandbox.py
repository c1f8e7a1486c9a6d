"""Running untrusted draft code: ``python -m hfadapt.agent.sandbox_worker`` inside a bubblewrap
sandbox (:mod:`hfadapt.isolation`: no network, its own /proc and PID space, the root read-only,
a private tmpfs, CPU/process/file-size limits, an allowlisted environment), reading its job and
the draft from a read-only input folder and writing only to an empty result folder, with a
wall-time limit (the whole sandbox is killed). The worker adds an address-space limit after its
imports and an audit hook (a second, weaker fence). Without bubblewrap it runs only when the
caller passed ``unsafe_no_isolation=True``.

The worker reports each step as a JSON line in ``results.jsonl``; what finished before a kill
is kept, and the step that was running is the one reported as killed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hfadapt import isolation
from hfadapt.errors import SandboxError

DEFAULT_TIMEOUT_S = 180.0
DEFAULT_MEMORY_MB = 3072


@dataclass
class SandboxLimits:
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB  # address space the draft may add after imports
    threads: int = 1
    processes: int = 64  # tasks (threads count) the sandbox may add


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
    isolated: bool = True  # False only after the user's explicit --unsafe-no-isolation
    files: dict[str, bytes] = field(default_factory=dict)  # result files, as untrusted bytes


def clean_env(secrets: list[str] | None = None, workdir: Path | None = None) -> dict[str, str]:
    """The sandbox's environment: built from an allowlist (:func:`hfadapt.isolation.sandbox_env`),
    plus the package path, offline and sandbox settings; any value equal to a secret is dropped."""
    values = {s for s in (secrets or []) if s}
    # The draft is imported from a checkout or an install alike.
    package_root = str(Path(__file__).resolve().parents[2])
    extra = {
        "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p),
        "HFADAPT_SANDBOX": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MALLOC_ARENA_MAX": "2",  # each glibc arena reserves address space under RLIMIT_AS
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor",
    }
    for name in ("HF_HOME", "HF_HUB_CACHE", "HFADAPT_HOME", "HFADAPT_ADAPTERS_PATH"):
        if os.environ.get(name):
            extra[name] = os.environ[name]
    extra.update(_cache_env())
    env = isolation.sandbox_env(extra)
    if workdir is not None:
        env["TMPDIR"] = str(workdir)
        env["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / "inductor")
    return {k: v for k, v in env.items() if v not in values}


def _cache_env() -> dict[str, str]:
    """Where the parent finds cached models: the sandbox's HOME is not the user's."""
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - a dependency
        return {}
    return {"HF_HOME": str(constants.HF_HOME), "HF_HUB_CACHE": str(constants.HF_HUB_CACHE)}


def readable_paths(job: dict[str, Any], env: dict[str, str]) -> list[Path]:
    """What the worker must read that the sandbox's tmpfs or hidden home would cover: the model
    cache, hfadapt's home and adapter folders, the package, a local model folder, captured calls."""
    from hfadapt.judge.sandboxed import worker_readable_paths

    paths = worker_readable_paths(env)
    case = job.get("case") or {}
    if case.get("example_file"):
        paths.append(Path(case["example_file"]))
    ref = (case.get("model") or {}).get("ref")
    if isinstance(ref, str) and os.path.isabs(ref):
        paths.append(Path(ref))
    return [p.resolve() for p in paths]


def _read_steps(text: str) -> tuple[list[StepReport], str | None]:
    """Finished steps, and the one that started but never finished (if any). The text is the
    worker's (untrusted): only well-formed records of the expected shape are kept."""
    steps: list[StepReport] = []
    running: str | None = None
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by the kill
        if not isinstance(rec, dict):
            continue
        if isinstance(rec.get("start"), str):
            running = rec["start"]
        elif isinstance(rec.get("step"), str):
            out = rec.get("output")
            steps.append(
                StepReport(
                    rec["step"],
                    str(rec.get("status", "error")),
                    str(rec.get("summary", "")),
                    out if isinstance(out, dict) else {},
                    float(rec.get("seconds", 0.0))
                    if isinstance(rec.get("seconds"), (int, float))
                    else 0.0,
                )
            )
            running = None
    return steps, running


def run_sandbox(
    draft_source: str,
    job: dict[str, Any],
    limits: SandboxLimits | None = None,
    *,
    secrets: list[str] | None = None,
    keep: Path | None = None,
    unsafe_no_isolation: bool = False,
) -> SandboxRun:
    """Run the job's steps on the draft in a fresh sandboxed worker. Raises
    :class:`~hfadapt.errors.IsolationUnavailableError` when bubblewrap cannot isolate it and
    ``unsafe_no_isolation`` is False."""
    limits = limits or SandboxLimits()
    isolated = isolation.require_isolation(unsafe=unsafe_no_isolation)
    base = Path(tempfile.mkdtemp(prefix="hfadapt-sandbox-"))
    inputs, outputs = base / "in", base / "out"
    inputs.mkdir()
    outputs.mkdir()
    try:
        (inputs / "draft.py").write_text(draft_source, encoding="utf-8")
        seen_in = Path(isolation.INPUT_DIR) if isolated else inputs
        seen_out = Path(isolation.OUTPUT_DIR) if isolated else outputs
        payload = {
            **job,
            "draft_path": str(seen_in / "draft.py"),
            "results_path": str(seen_out / "results.jsonl"),
            "output_dir": str(seen_out),
            "memory_mb": limits.memory_mb,
            "cpu_seconds": int(limits.timeout_s) + 5,
            "threads": limits.threads,
        }
        (inputs / "job.json").write_text(json.dumps(payload), encoding="utf-8")
        env = clean_env(secrets, None if isolated else outputs)
        env["OMP_NUM_THREADS"] = str(limits.threads)
        env["HFADAPT_SANDBOX_OUTPUT"] = str(seen_out)
        start = time.monotonic()
        command = [sys.executable, "-m", "hfadapt.agent.sandbox_worker", str(seen_in / "job.json")]
        with (base / "stderr.txt").open("wb") as err, (base / "stdout.txt").open("wb") as out:
            try:
                proc = isolation.spawn(
                    command,
                    inputs=inputs,
                    outputs=outputs,
                    env=env,
                    limits=isolation.Limits(
                        cpu_seconds=int(limits.timeout_s) + 5, processes=limits.processes
                    ),
                    stdout=out,
                    stderr=err,
                    isolate=isolated,
                    readable=readable_paths(job, env),
                )
            except OSError as exc:
                raise SandboxError(f"cannot start the sandbox process: {exc}") from exc
            code, timed_out = isolation.wait(proc, limits.timeout_s)
            killed = f"exceeded the time limit of {limits.timeout_s:g} s" if timed_out else ""
        seconds = time.monotonic() - start
        raw = isolation.read_result(outputs, "results.jsonl") or b""
        steps, running = _read_steps(raw.decode("utf-8", errors="replace"))
        stderr = (base / "stderr.txt").read_text(encoding="utf-8", errors="replace")
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
        files = {
            name: data
            for name in ("tensors.safetensors", "end_to_end.safetensors")
            if (data := isolation.read_result(outputs, name)) is not None
        }
        if keep is not None:
            shutil.copytree(base, keep, dirs_exist_ok=True, symlinks=True)
        return SandboxRun(steps, code, killed, seconds, tail, isolated, files)
    finally:
        shutil.rmtree(base, ignore_errors=True)


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
