"""Running untrusted draft code: ``python -m hfadapt.agent.draft_worker`` inside a bubblewrap
sandbox (:mod:`hfadapt.isolation`: no network, its own /proc and PID space, only the files it
needs and those read-only, a size-capped private tmpfs, a seccomp filter, CPU/memory/process/
file limits, an allowlisted environment), reading its job and the draft from a read-only input
folder and answering on its standard output, which is read with a byte cap. A wall-time limit
kills the whole sandbox. Without bubblewrap it runs only when the caller passed
``unsafe_no_isolation=True``.

Every record the worker writes is untrusted: each line is parsed with bounds, each field
checked and cut, unknown records dropped. What finished before a kill is kept, and the step
that was running is the one reported as killed."""

from __future__ import annotations

import base64
import binascii
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

from hfadapt import isolation, settings
from hfadapt.errors import SandboxError, UntrustedDataError
from hfadapt.untrusted import bounded, clean_text, parse_json

DEFAULT_TIMEOUT_S = 180.0
DEFAULT_MEMORY_MB = 3072
MAX_RESULT_BYTES = 48 * 1024 * 1024
STATUSES = ("pass", "fail", "skip", "killed", "error")
RESULT_FILES = ("graph.json", "constants.safetensors")


@dataclass
class SandboxLimits:
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB  # address space the draft may add after imports
    threads: int = 1
    processes: int = 64  # tasks (threads count) the sandbox may add
    tmpfs_mb: int = 512  # its private /tmp


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
    plus the package path and offline settings. Of the Hugging Face folders only the hub cache
    is named (``HF_HOME`` points at an empty scratch folder, so no token file is there); any
    value equal to a secret is dropped."""
    values = {s for s in (secrets or []) if s}
    tmp = str(workdir) if workdir is not None else "/tmp"
    package_root = str(Path(__file__).resolve().parents[2])
    # isolated: only the folders the sandbox may show (never the working or home folder)
    path = isolation.python_path() if workdir is None else [package_root, *settings.python_path()]
    extra = {
        "PYTHONPATH": os.pathsep.join(path),
        settings.HFADAPT_SANDBOX.name: "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "MALLOC_ARENA_MAX": "2",  # each glibc arena reserves address space under RLIMIT_AS
        "HF_HOME": f"{tmp}/hf_home",
        "HF_HUB_CACHE": hub_cache(),
        "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
    }
    env = isolation.sandbox_env(extra)
    if workdir is not None:
        env.update(HOME=f"{tmp}/home", TMPDIR=tmp)
    return {k: v for k, v in env.items() if v not in values}


def hub_cache() -> str:
    """The Hugging Face hub cache (model files only; tokens live beside it, in HF_HOME)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def readable_paths(job: dict[str, Any]) -> list[Path]:
    """What the worker reads besides the interpreter, hfadapt's package and the system
    (:func:`hfadapt.isolation.mounts`): the hub cache and the case's captured calls."""
    paths = [Path(hub_cache())]
    case = job.get("case") or {}
    if case.get("example_file"):
        paths.append(Path(case["example_file"]))
    return [p.resolve() for p in paths if p.exists()]


def read_records(
    raw: bytes, expected: tuple[str, ...]
) -> tuple[list[StepReport], str | None, dict[str, bytes]]:
    """Finished steps, the one that started but never finished (if any), and the result files,
    from the worker's output. Every record is untrusted: lines that do not parse, records of an
    unknown shape and steps the job did not ask for are dropped; fields are checked and cut."""
    steps: list[StepReport] = []
    running: str | None = None
    files: dict[str, bytes] = {}
    for line in raw.splitlines():
        try:
            rec = parse_json(line, max_bytes=MAX_RESULT_BYTES, max_depth=10)
        except UntrustedDataError:
            continue  # a line cut by a kill, or not ours
        if not isinstance(rec, dict):
            continue
        if rec.get("start") in expected:
            running = rec["start"]
        elif rec.get("step") in expected:
            out = rec.get("output")
            status = rec.get("status")
            seconds = rec.get("seconds")
            steps.append(
                StepReport(
                    rec["step"],
                    status if status in STATUSES else "error",
                    clean_text(rec.get("summary", ""), 800),
                    bounded(out, max_depth=6, max_string=2000, max_items=300)
                    if isinstance(out, dict)
                    else {},
                    float(seconds)
                    if isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                    else 0.0,
                )
            )
            running = None
        elif rec.get("file") in RESULT_FILES and isinstance(rec.get("b64"), str):
            try:
                files[rec["file"]] = base64.b64decode(rec["b64"], validate=True)
            except (binascii.Error, ValueError):
                continue
    return steps, running, files


def run_sandbox(
    draft_source: str,
    job: dict[str, Any],
    limits: SandboxLimits | None = None,
    *,
    secrets: list[str] | None = None,
    unsafe_no_isolation: bool = False,
) -> SandboxRun:
    """Run the job's steps on the draft in a fresh sandboxed worker. Raises
    :class:`~hfadapt.errors.IsolationUnavailableError` when bubblewrap cannot isolate it and
    ``unsafe_no_isolation`` is False."""
    limits = limits or SandboxLimits()
    isolated = isolation.require_isolation(unsafe=unsafe_no_isolation)
    base = Path(tempfile.mkdtemp(prefix="hfadapt-sandbox-"))
    inputs, scratch = base / "in", base / "scratch"
    inputs.mkdir()
    scratch.mkdir()
    try:
        (inputs / "draft.py").write_text(draft_source, encoding="utf-8")
        seen_in = Path(isolation.INPUT_DIR) if isolated else inputs
        payload = {
            **job,
            "draft_path": str(seen_in / "draft.py"),
            "scratch": "/tmp" if isolated else str(scratch),
            "memory_mb": limits.memory_mb,
            "cpu_seconds": int(limits.timeout_s) + 5,
            "threads": limits.threads,
        }
        (inputs / "job.json").write_text(json.dumps(payload), encoding="utf-8")
        env = clean_env(secrets, None if isolated else scratch)
        env["OMP_NUM_THREADS"] = str(limits.threads)
        start = time.monotonic()
        command = [sys.executable, "-m", "hfadapt.agent.draft_worker", str(seen_in / "job.json")]
        try:
            proc = isolation.spawn(
                command,
                inputs=inputs,
                env=env,
                limits=isolation.Limits(
                    cpu_seconds=int(limits.timeout_s) + 5,
                    processes=limits.processes,
                    tmpfs_mb=limits.tmpfs_mb,
                ),
                isolate=isolated,
                readable=readable_paths(job),
                cwd=scratch,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start the sandbox process: {exc}") from exc
        done = isolation.collect(proc, limits.timeout_s, max_stdout=MAX_RESULT_BYTES)
        killed = (
            f"exceeded the time limit of {limits.timeout_s:g} s"
            if done.timed_out
            else done.overflow
        )
        seconds = time.monotonic() - start
        steps, running, files = read_records(done.stdout, tuple(job["steps"]))
        tail = clean_text("\n".join(done.stderr_tail.strip().splitlines()[-15:]), 3000)
        if not killed and done.code not in (0, None):
            killed = _exit_reason(done.code, done.stderr_tail, limits)
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
        return SandboxRun(steps, done.code, killed, seconds, tail, isolated, files)
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
