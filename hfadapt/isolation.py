"""OS isolation for running untrusted code (drafted adapters today, remote model code later):
a bubblewrap (``bwrap``) sandbox with new user, PID, network, IPC, UTS and mount namespaces,
no network at all, its own ``/proc``, the root filesystem read-only, the home folder hidden, a
private tmpfs on ``/tmp`` as its scratch space, one read-only input folder and one empty
result folder bound in, ``--die-with-parent``, ``--new-session``, every capability dropped,
resource limits set with setrlimit before ``bwrap`` starts (inherited by everything inside),
and an environment built from an allowlist. See docs/security.md.

This module imports only the standard library and :mod:`hfadapt.errors`, so any layer may use it.
"""

from __future__ import annotations

import functools
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hfadapt.errors import IsolationUnavailableError, option

# Where the input and result folders appear inside the sandbox.
INPUT_DIR = "/tmp/hfadapt-in"
OUTPUT_DIR = "/tmp/hfadapt-out"
# The only variables copied from the parent's environment (values that carry no credential).
ENV_ALLOWLIST = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "TZ", "TERM")
# A name that says it holds a credential is never passed, even when a caller asks for it.
SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE", re.IGNORECASE
)
UNSAFE_OPTION = option("unsafe_no_isolation")


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed process tree (setrlimit, inherited by every child)."""

    cpu_seconds: int = 185
    processes: int = 64  # tasks (threads count) beyond what the user already runs
    file_mb: int = 64  # largest file it may write
    memory_mb: int | None = None  # address space; None: the worker limits itself after imports


@functools.cache
def unavailable_reason() -> str | None:
    """None when bubblewrap sandboxes work here, else one line saying why not (cached)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return (
            "bubblewrap (bwrap) is not installed: install it (Debian/Ubuntu: apt-get install "
            "bubblewrap); on macOS OS isolation is not available"
        )
    argv = bwrap_argv(["true"], inputs=None, outputs=None, exe=exe)
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not start: {exc}"
    if done.returncode != 0:
        why = " ".join(done.stderr.decode(errors="replace").split())[:300]
        return (
            f"bubblewrap cannot create namespaces here ({why or f'exit {done.returncode}'}); "
            "user namespaces may be disabled"
        )
    return None


def require_isolation(*, unsafe: bool, what: str = "drafted code") -> bool:
    """True when untrusted code will run isolated. Without isolation, raise unless ``unsafe``
    (the caller's explicit ``unsafe_no_isolation=True``), then return False. ``what`` names
    the code refused ("drafted code", "the model's own code")."""
    why = unavailable_reason()
    if why is None:
        return True
    if unsafe:
        return False
    raise IsolationUnavailableError(
        f"refusing to run {what} without OS isolation: {why} "
        f"(or pass {UNSAFE_OPTION} to run it unisolated, recorded as such)"
    )


def sandbox_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The sandbox's whole environment: the allowlisted variables of this process, a scratch
    HOME and TMPDIR, and ``extra``; nothing whose name looks like a credential."""
    env = {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ}
    env.update({"HOME": "/tmp/home", "TMPDIR": "/tmp", "PYTHONNOUSERSITE": "1"})
    for key, value in (extra or {}).items():
        if SECRET_NAME.search(key):
            raise ValueError(f"extra: {key!r} is named like a credential; it is never passed")
        env[key] = value
    return env


def _hidden_home() -> Path | None:
    home = Path(os.path.expanduser("~"))
    return home if home.is_dir() and home != Path("/") else None


def bwrap_argv(
    command: list[str],
    *,
    inputs: Path | None,
    outputs: Path | None,
    readable: Iterable[Path] = (),
    exe: str = "bwrap",
) -> list[str]:
    """The bubblewrap command line around ``command``. ``readable`` are files or folders the
    tmpfs on /tmp or the hidden home cover (a model cache, a model folder) shown again
    read-only. It carries no secret."""
    argv = [exe, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += ["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    argv += ["--hostname", "hfadapt-sandbox"]
    home = _hidden_home()
    if home is not None:
        argv += ["--tmpfs", str(home)]
    for path in readable:  # shown again, read-only, at the same place (under /tmp or home too)
        if path.exists():
            argv += ["--ro-bind", str(path), str(path)]
    argv += ["--dir", "/tmp/home"]
    if inputs is not None:
        argv += ["--ro-bind", str(inputs), INPUT_DIR]
    if outputs is not None:
        argv += ["--bind", str(outputs), OUTPUT_DIR]
    argv += ["--chdir", "/tmp", "--", *command]
    return argv


def _user_tasks() -> int:
    """Tasks (processes and threads) this real uid runs now: RLIMIT_NPROC counts them all."""
    uid, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(entry.path).st_uid == uid:
                    count += len(os.listdir(f"{entry.path}/task"))
            except OSError:
                continue
    return count


def _limiter(limits: Limits, nproc: int) -> Any:
    def apply() -> None:  # runs in the child between fork and exec of bwrap
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
        size = limits.file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if limits.memory_mb is not None:
            mem = limits.memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))

    return apply


def spawn(
    command: list[str],
    *,
    inputs: Path,
    outputs: Path,
    env: Mapping[str, str],
    limits: Limits,
    stdout: IO[bytes] | int,
    stderr: IO[bytes] | int,
    isolate: bool = True,
    readable: Iterable[Path] = (),
) -> subprocess.Popen[bytes]:
    """Start ``command`` in the sandbox (``isolate=False``: the same limits and environment,
    without namespaces; only after the user's explicit opt-out). Wait for it with ``wait``."""
    nproc = (0 if os.getuid() == 0 else _user_tasks()) + limits.processes
    if isolate:
        argv = bwrap_argv(command, inputs=inputs, outputs=outputs, readable=readable)
        cwd: Path | None = None
    else:
        argv, cwd = list(command), outputs
    return subprocess.Popen(
        argv,
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,  # its own process group: a kill takes every child
        preexec_fn=_limiter(limits, nproc),  # setrlimit runs in the child, before bwrap
        close_fds=True,
    )


def wait(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, bool]:
    """(exit code, timed out) of a process ``spawn`` started; past ``timeout_s`` its whole
    process group (the sandbox and every child it made) is killed."""
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        return proc.wait(), True


def read_result(outputs: Path, name: str, max_bytes: int = 256 * 1024 * 1024) -> bytes | None:
    """A file the sandbox left in its result folder, read as untrusted data: never through a
    symlink, only a regular file, at most ``max_bytes``; None when absent or not a plain file."""
    try:
        fd = os.open(outputs / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None  # absent, or a symlink (ELOOP)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None  # a FIFO or device would block or lie
        return fh.read(max_bytes)
