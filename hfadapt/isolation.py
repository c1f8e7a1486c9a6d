"""OS isolation for running untrusted code (drafted adapters, a model's own remote code): a
bubblewrap (``bwrap``) sandbox with new user, PID, network, IPC, UTS, cgroup and mount
namespaces, no network at all, its own ``/proc``, no further user namespaces
(``--disable-userns``), a seccomp filter (:mod:`hfadapt.seccomp`), every capability dropped,
``--die-with-parent``, ``--new-session``, and a root filesystem made of only what the worker
needs, read-only: ``/usr`` and the library folders, a few files of ``/etc`` (the loader cache,
passwd), the interpreter, the package and what the caller names (the Hugging Face *hub* cache,
never the folder holding tokens). Scratch space is a private tmpfs on ``/tmp`` capped in size.
Resource limits (CPU time, address space, file size, processes, no core dumps) are set with
setrlimit before ``bwrap`` starts and are inherited by everything inside.

A sandbox hands its results back on its standard output, which the parent reads with a byte
cap (:func:`collect`): no result folder, so there is nothing for it to fill. Input files are in
one read-only folder. See docs/security.md.

This module imports only the standard library and hfadapt's core modules, so any layer may
use it."""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hfadapt import seccomp, settings
from hfadapt.errors import IsolationUnavailableError, option
from hfadapt.untrusted import SECRET_NAME

# Where the input folder appears inside the sandbox.
INPUT_DIR = "/tmp/hfadapt-in"
# The only variables copied from the parent's environment (values that carry no credential).
ENV_ALLOWLIST = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "TZ", "TERM")
UNSAFE_OPTION = option("unsafe_no_isolation")
# The system folders shown inside (read-only); on merged-/usr systems the top-level ones are
# symlinks into /usr and are recreated as symlinks.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/localtime",
    "/etc/alternatives",
)
# What the CPU topology readers of torch and OpenMP look at.
_SYS_FILES = ("/sys/devices/system/cpu",)

__all__ = [
    "ENV_ALLOWLIST",
    "INPUT_DIR",
    "SECRET_NAME",
    "Collected",
    "Limits",
    "bwrap_argv",
    "collect",
    "guard",
    "limit_self",
    "require_isolation",
    "result_stream",
    "sandbox_env",
    "spawn",
    "unavailable_reason",
]


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed process tree (setrlimit, inherited by every child)."""

    cpu_seconds: int = 185
    processes: int = 64  # tasks (threads count) beyond what the user already runs
    file_mb: int = 64  # largest file it may write
    memory_mb: int | None = None  # address space of the whole tree (None: no outer bound)
    tmpfs_mb: int = 512  # the private /tmp


@dataclass
class Collected:
    """What a sandboxed process left: its exit code, whether it was killed for time or for
    output, its standard output (at most the cap), and the end of its standard error."""

    code: int | None
    timed_out: bool
    stdout: bytes
    stderr_tail: str
    overflow: str = ""  # why it was killed for its output ("" when it was not)


@functools.cache
def unavailable_reason() -> str | None:
    """None when bubblewrap sandboxes work here, else one line saying why not (cached)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return (
            "bubblewrap (bwrap) is not installed: install it (Debian/Ubuntu: apt-get install "
            "bubblewrap); on macOS OS isolation is not available"
        )
    argv = bwrap_argv(["true"], inputs=None, exe=exe, seccomp_fd=None)
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
    here = settings.environment()
    env = {k: here[k] for k in ENV_ALLOWLIST if k in here}
    env.update({"HOME": "/tmp/home", "TMPDIR": "/tmp", "PYTHONNOUSERSITE": "1"})
    for key, value in (extra or {}).items():
        if SECRET_NAME.search(key):
            raise ValueError(f"extra: {key!r} is named like a credential; it is never passed")
        env[key] = value
    return env


def interpreter_paths() -> list[Path]:
    """The interpreter, its standard library and site-packages, and every folder on sys.path:
    what a Python worker reads to start (pyenv and venvs often keep them in a home folder)."""
    paths = [Path(sys.base_prefix), Path(sys.prefix), Path(sys.executable).resolve().parent]
    paths += [Path(p) for p in sys.path if p and os.path.isdir(p)]
    return paths


def _system_binds() -> list[str]:
    argv: list[str] = []
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    for f in (*_ETC_FILES, *_SYS_FILES):
        argv += ["--ro-bind-try", f, f]
    return argv


def bwrap_argv(
    command: list[str],
    *,
    inputs: Path | None,
    readable: Iterable[Path] = (),
    exe: str = "bwrap",
    tmpfs_mb: int = 512,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The bubblewrap command line around ``command``. ``readable`` are further files or
    folders shown read-only at their own place (a model cache, a model folder). It carries no
    secret."""
    argv = [exe, "--unshare-all", "--unshare-user", "--disable-userns"]
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += _system_binds()
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    argv += ["--hostname", "hfadapt-sandbox"]
    for path in [*interpreter_paths(), *readable]:
        if path.exists() and str(path) not in ("/", "/tmp"):
            argv += ["--ro-bind", str(path), str(path)]
    argv += ["--dir", "/tmp/home"]
    if inputs is not None:
        argv += ["--ro-bind", str(inputs), INPUT_DIR]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
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
    env: Mapping[str, str],
    limits: Limits,
    stdout: IO[bytes] | int = subprocess.PIPE,
    stderr: IO[bytes] | int = subprocess.PIPE,
    isolate: bool = True,
    readable: Iterable[Path] = (),
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``command`` in the sandbox (``isolate=False``: the same limits and environment,
    without namespaces; only after the user's explicit opt-out, then in ``cwd``). Read its
    output with :func:`collect`."""
    nproc = (0 if os.getuid() == 0 else _user_tasks()) + limits.processes
    fd = seccomp.filter_fd() if isolate else None
    try:
        if isolate:
            argv = bwrap_argv(
                command,
                inputs=inputs,
                readable=readable,
                tmpfs_mb=limits.tmpfs_mb,
                seccomp_fd=fd,
            )
            cwd = None
        else:
            argv = list(command)
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
            pass_fds=(fd,) if fd is not None else (),
        )
    finally:
        if fd is not None:
            os.close(fd)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def collect(
    proc: subprocess.Popen[bytes],
    timeout_s: float,
    *,
    max_stdout: int = 64 * 1024 * 1024,
    max_stderr_tail: int = 64 * 1024,
) -> Collected:
    """Wait for a process :func:`spawn` started with pipes, reading both as they come: at
    most ``max_stdout`` bytes of standard output (past that the whole process group is killed,
    ``overflow`` says so) and the last ``max_stderr_tail`` bytes of standard error. Past
    ``timeout_s`` the group is killed too."""
    out = bytearray()
    err = bytearray()
    overflow: list[str] = []

    def read_out() -> None:
        assert proc.stdout is not None
        while chunk := proc.stdout.read(65536):
            if len(out) + len(chunk) > max_stdout:
                overflow.append(f"wrote more than {max_stdout} bytes of results")
                _kill(proc)
                break
            out.extend(chunk)

    def read_err() -> None:
        assert proc.stderr is not None
        while chunk := proc.stderr.read(65536):
            err.extend(chunk)
            if len(err) > 2 * max_stderr_tail:
                del err[: len(err) - max_stderr_tail]

    readers = [threading.Thread(target=f, daemon=True) for f in (read_out, read_err)]
    for t in readers:
        t.start()
    timed_out = False
    try:
        code: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
        code = proc.wait()
    for t in readers:
        t.join(timeout=10)
    tail = bytes(err[-max_stderr_tail:]).decode("utf-8", errors="replace")
    return Collected(code, timed_out, bytes(out), tail, overflow[0] if overflow else "")


# -- the worker's side: what a process started in the sandbox does to itself ---------------------

_DENIED_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "pty.spawn",
        "os.kill",
        "os.killpg",
        "socket.connect",
        "socket.bind",
        "socket.getaddrinfo",
        "socket.sendto",
        "urllib.Request",
        "webbrowser.open",
    }
)
_PATH_EVENTS = frozenset(
    {"os.remove", "os.rename", "os.rmdir", "shutil.rmtree", "os.truncate", "os.chmod"}
)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def vm_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def limit_self(job: dict[str, Any]) -> None:
    """Address space = what the imports already mapped + the job's budget; CPU time; no core
    dumps; files of at most 64 MB."""
    budget = int(job.get("memory_mb", 3072)) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + budget, vm_bytes() + budget))
    cpu = int(job.get("cpu_seconds", 185))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024 * 1024, 64 * 1024 * 1024))


def guard(*writable: str) -> None:
    """A second, weaker fence than the OS sandbox: an audit hook refusing processes, sockets
    and writes outside ``writable``."""
    roots = tuple(os.path.realpath(w) + os.sep for w in writable if w)

    def inside(path: Any) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        return os.path.realpath(str(path)).startswith(roots) or str(path) == os.devnull

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event in _DENIED_EVENTS:
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open" and args:
            path, mode, flags = [*args, None, None][:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and not inside(path):
                raise PermissionError(f"sandbox: writing {path!r} is not allowed")
        elif event in _PATH_EVENTS and args and not inside(args[0]):
            raise PermissionError(f"sandbox: {event} on {args[0]!r} is not allowed")

    sys.addaudithook(hook)


def result_stream() -> IO[str]:
    """The channel to the parent (the original standard output); from here on, standard output
    is standard error, so nothing printed can look like a record."""
    stream = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream
