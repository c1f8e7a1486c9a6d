"""OS isolation for running untrusted code (drafted adapters, a model's own remote code): a
bubblewrap (``bwrap``) sandbox with new user, PID, network, IPC, UTS, cgroup and mount
namespaces, no network at all, its own ``/proc`` (``/proc/sys`` and the other kernel knobs
read-only), no further user namespaces (``--disable-userns``), a seccomp filter
(:mod:`hfadapt.seccomp`), every capability dropped, ``--die-with-parent``, ``--new-session``.
It never runs as root: when hfadapt runs as root, the process drops to ``nobody``
(:data:`SANDBOX_UID`/:data:`SANDBOX_GID`) before ``bwrap`` starts, so uid 0 is not mapped inside.

Its root filesystem is read-only and holds only what the worker needs: ``/usr`` and the library
folders, a few files of ``/etc`` (the loader cache, passwd), the interpreter with its standard
library and this environment's site-packages, hfadapt's own package folder (of a checkout: the
package, ``adapters/``, ``prompts/`` and ``pyproject.toml``, never the checkout's root), and what
the caller names (the Hugging Face *hub* cache, never the folder holding tokens). Never the
working folder, the home folder or a ``sys.path`` entry that is not an installed package
location. Folders are opened here (``O_PATH``) and handed to bwrap as descriptors
(``--ro-bind-fd``), so a folder the unprivileged user could not reach (a venv under ``/root``)
is still shown. The writable places are capped tmpfs: ``/tmp`` (``Limits.tmpfs_mb``) and
``/dev/shm`` (``Limits.shm_mb``). Resource limits (CPU time, address space, file size,
processes, no core dumps) are set with setrlimit before ``bwrap`` starts and are inherited by
everything inside.

A sandbox hands its results back on its standard output, which the parent reads with a byte
cap (:func:`collect`): no result folder, so there is nothing for it to fill. Input files are in
one read-only folder. See docs/security.md.

This module imports only the standard library and hfadapt's core modules, so any layer may
use it."""

from __future__ import annotations

import contextlib
import functools
import os
import pwd
import resource
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

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
# Who the sandbox runs as when hfadapt runs as root: nobody (never uid 0, which bwrap would map
# to the real root).
SANDBOX_UID = 65534
SANDBOX_GID = 65534
# Beside the package, in a checkout: what hfadapt reads from there (bundled adapters, prompts;
# pyproject.toml is how it tells a checkout).
_CHECKOUT_FILES = ("adapters", "prompts", "pyproject.toml")

__all__ = [
    "ENV_ALLOWLIST",
    "INPUT_DIR",
    "SANDBOX_GID",
    "SANDBOX_UID",
    "SECRET_NAME",
    "Collected",
    "Killable",
    "Limits",
    "bwrap_argv",
    "collect",
    "guard",
    "interpreter_paths",
    "kill_group",
    "limit_self",
    "mounts",
    "package_paths",
    "python_path",
    "require_isolation",
    "result_stream",
    "sandbox_env",
    "sandbox_ids",
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
    shm_mb: int = 64  # the private /dev/shm


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
    """None when bubblewrap sandboxes work here, else one line saying why not (cached). The
    probe starts bwrap the way :func:`spawn` does (as nobody when hfadapt runs as root)."""
    exe = shutil.which("bwrap")
    if exe is None:
        return (
            "bubblewrap (bwrap) is not installed: install it (Debian/Ubuntu: apt-get install "
            "bubblewrap); on macOS OS isolation is not available"
        )
    argv = bwrap_argv(["true"], binds=[], exe=exe, seccomp_fd=None)
    limits = Limits()
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            timeout=30,
            check=False,
            cwd="/",
            preexec_fn=_limiter(limits, _nproc(limits)),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not start: {exc}"
    except subprocess.SubprocessError:  # the child's staging or privilege drop failed
        return (
            "hfadapt runs as root and cannot give the sandbox a private mount namespace and "
            "drop to nobody (CAP_SYS_ADMIN missing, as in an unprivileged container)"
        )
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


def sandbox_ids() -> tuple[int, int] | None:
    """The (uid, gid) the sandbox drops to before bwrap starts: nobody when hfadapt runs as
    root, None otherwise (an unprivileged caller's own ids are already unprivileged)."""
    return (SANDBOX_UID, SANDBOX_GID) if os.geteuid() == 0 else None


def _homes() -> set[str]:
    homes = {os.path.expanduser("~")}
    with contextlib.suppress(KeyError):
        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    return {os.path.realpath(h) for h in homes if h and h != "~"}


def _private(path: Path) -> str:
    """Why ``path`` must never be shown as a code location ("" when it may be): the root, the
    working folder or the home folder (or a folder holding either), a checkout's root."""
    real = os.path.realpath(path)
    if real == "/":
        return "the root folder"
    for what, place in [("the working folder", os.path.realpath(os.getcwd()))] + [
        ("the home folder", h) for h in _homes()
    ]:
        if place == real or place.startswith(real.rstrip("/") + "/"):
            return f"{what} or a folder holding it"
    if os.path.exists(os.path.join(real, ".git")):
        return "a checkout's root"
    return ""


def interpreter_paths() -> list[Path]:
    """What a Python worker reads to start, and nothing else of ``sys.path``: the interpreter
    (the venv's ``python`` and the binary it points at, ``pyvenv.cfg``, libpython), the
    standard library and headers (sysconfig ``stdlib``/``platstdlib``/``include``, this
    environment's and its base's) and this environment's site-packages (sysconfig
    ``purelib``/``platlib`` and :func:`site.getsitepackages`, which names the base's too when
    a venv includes system site-packages)."""
    paths = [Path(sys.executable), Path(sys.executable).resolve()]
    if sys.prefix != sys.base_prefix:
        paths.append(Path(sys.prefix) / "pyvenv.cfg")
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    for scheme in (sysconfig.get_paths(), sysconfig.get_paths(vars=base)):
        paths += [Path(scheme[k]) for k in ("stdlib", "platstdlib", "include", "platinclude")]
    here = sysconfig.get_paths()
    paths += [Path(here["purelib"]), Path(here["platlib"])]
    paths += [Path(p) for p in site.getsitepackages()]
    libdir = sysconfig.get_config_var("LIBDIR")
    for name in {sysconfig.get_config_var("LDLIBRARY"), sysconfig.get_config_var("INSTSONAME")}:
        if libdir and name and str(name).endswith(tuple(f".so{v}" for v in ("", ".1.0"))):
            paths.append(Path(libdir) / str(name))
    return _unique(p for p in paths if p.exists() and not _private(p))


def package_paths() -> list[Path]:
    """hfadapt's own files: its package folder only (an editable install: never the checkout's
    root, ``.git`` or what else lies there), and of a checkout the bundled ``adapters/``,
    ``prompts/`` and ``pyproject.toml`` hfadapt reads from there."""
    package = Path(__file__).resolve().parent  # this module lives at the package's top
    paths = [package]
    if (package.parent / "pyproject.toml").is_file():
        paths += [package.parent / name for name in _CHECKOUT_FILES]
    return [p for p in paths if p.exists()]


def python_path() -> list[str]:
    """The sandbox's ``PYTHONPATH``: the folder holding the hfadapt package (an editable
    install's checkout is on it, but only the package is shown there), then the folders of this
    process's ``$PYTHONPATH`` that may be named (never the root, the working folder, the home
    folder or a checkout's root; of the others only their Python modules and packages are
    shown, see :func:`mounts`)."""
    paths = [str(Path(__file__).resolve().parents[1])]
    paths += [p for p in settings.python_path() if os.path.isdir(p) and not _private(Path(p))]
    return paths


def _modules(folder: Path, limit: int = 500) -> list[Path]:
    """What of a ``$PYTHONPATH`` folder the sandbox shows: its importable Python only (its
    ``*.py`` files and package folders holding ``__init__.py``; at most ``limit``), never the
    folder itself, so no ``.env``, ``.netrc`` or other file lying beside them."""
    found: list[Path] = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []
    for entry in entries:
        if entry.name.startswith(".") or len(found) >= limit:
            continue
        path = Path(entry.path)
        module = entry.is_file() and entry.name.endswith(".py")
        if module or (entry.is_dir() and (path / "__init__.py").is_file()):
            found.append(path)
    return found


def _unique(paths: Iterable[Path]) -> list[Path]:
    seen: dict[str, Path] = {}
    for p in paths:
        seen.setdefault(str(p), p)
    return list(seen.values())


def mounts(readable: Iterable[Path] = ()) -> list[Path]:
    """Every file and folder shown read-only at its own place besides the system folders: the
    interpreter, hfadapt's package, the importable Python of the sandbox's ``$PYTHONPATH``
    folders and ``readable`` (a model cache, a model folder), parents before what lies inside them, nothing twice. A ``readable``
    path that is the root or holds the home folder is refused."""
    extra = [m for p in python_path()[1:] for m in _modules(Path(p))]
    paths = [*interpreter_paths(), *package_paths(), *extra]
    for path in readable:
        why = _private(path)
        if why in ("the root folder", "the home folder or a folder holding it"):
            raise ValueError(f"{path}: {why} is never shown inside the sandbox")
        paths.append(path)
    chosen: list[Path] = []
    for path in sorted(_unique(p for p in paths if p.exists()), key=lambda p: len(p.parts)):
        if str(path) in ("/", "/tmp"):
            continue
        if any(_within(path, c) for c in chosen):
            continue  # already shown, with a folder holding it
        chosen.append(path)
    return chosen


def _within(path: Path, folder: Path) -> bool:
    """True when ``path`` lies in ``folder`` both as named and once symlinks are resolved."""
    if not (path == folder or folder in path.parents):
        return False
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(top.rstrip("/") + "/")


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
    binds: Iterable[tuple[str, str, str]],
    exe: str = "bwrap",
    tmpfs_mb: int = 512,
    shm_mb: int = 64,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The bubblewrap command line around ``command``. ``binds`` are (option, source, place),
    each shown read-only at its place: ``("--ro-bind-fd", FD, place)`` for a descriptor
    :func:`spawn` opened, ``("--ro-bind", STAGED, place)`` for one it staged (as root). Once
    everything is in place the root and ``/dev`` are remounted read-only: the only writable
    places are ``/tmp`` (``tmpfs_mb``) and ``/dev/shm`` (``shm_mb``). It carries no secret."""
    argv = [exe, "--unshare-all", "--unshare-user", "--disable-userns"]
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += _system_binds()
    argv += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"]
    argv += ["--size", str(shm_mb * 1024 * 1024), "--tmpfs", "/dev/shm"]
    argv += ["--size", str(tmpfs_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    argv += ["--hostname", "hfadapt-sandbox", "--dir", "/tmp/home"]
    for option_, source, place in binds:
        argv += [option_, source, place]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--chdir", "/tmp", "--", *command]
    return argv


def _user_tasks(uid: int) -> int:
    """Tasks (processes and threads) ``uid`` runs now: RLIMIT_NPROC counts them all."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(entry.path).st_uid == uid:
                    count += len(os.listdir(f"{entry.path}/task"))
            except OSError:
                continue
    return count


def _nproc(limits: Limits, *, drop: bool = True) -> int:
    """RLIMIT_NPROC for a sandbox: what its uid (nobody when hfadapt runs as root and
    ``drop``) runs now plus ``limits.processes``."""
    ids = sandbox_ids() if drop else None
    uid = ids[0] if ids is not None else os.getuid()
    return (0 if uid == 0 else _user_tasks(uid)) + limits.processes


# Where, as root, the child stages what bwrap shows (in its own mount namespace, unseen by
# the host): bwrap then runs as nobody, which could not reach a folder under /root itself.
_STAGE = "/tmp"
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8


# The new mount API (the same numbers on every architecture since Linux 5.2/5.12).
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _AT_RECURSIVE, _AT_EMPTY_PATH = 0x1, 0x8000, 0x1000
_MOVE_MOUNT_F_EMPTY_PATH, _MOUNT_ATTR_IDMAP, _AT_FDCWD = 0x4, 0x00100000, -100


@functools.cache
def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def _owner_map() -> int | None:
    """A user namespace mapping uid and gid 0 to the sandbox's ids, held open for this
    process's life (None where one cannot be made). An idmapped mount through it shows root's
    files as the sandbox user's own, so a file root saved 0600 (``save_pretrained`` does) is
    readable inside, read-only."""
    libc = _libc()
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a new user namespace, then wait until the parent has mapped it
        try:
            os.close(ready_r)
            os.close(go_w)
            os.write(ready_w, b"1" if libc.unshare(0x10000000) == 0 else b"0")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) != b"1":
            return None
        for kind, value in (("uid", SANDBOX_UID), ("gid", SANDBOX_GID)):
            with open(f"/proc/{pid}/{kind}_map", "w", encoding="ascii") as fh:
                fh.write(f"0 {value} 1\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    finally:
        os.close(ready_r)
        os.close(go_w)
        os.waitpid(pid, 0)


def _mount_attr(userns: int) -> Any:
    """``struct mount_attr`` asking for an idmapped mount through ``userns``."""
    import ctypes

    class MountAttr(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint64) for n in ("set", "clr", "propagation", "userns")]

    return ctypes.byref(MountAttr(_MOUNT_ATTR_IDMAP, 0, 0, userns))


def _staged(index: int) -> str:
    return f"{_STAGE}/{index}"


def _limiter(
    limits: Limits, nproc: int, stage: list[tuple[str, bool]] | None = None, *, drop: bool = True
) -> Any:
    """What runs in the child between fork and exec of bwrap: setrlimit; as root (and
    ``drop``: not for an unisolated run, which is the caller's own opt-out), the staging of
    ``stage`` ((path, is a folder), bound at ``_staged(i)``) in a private mount namespace, then
    the drop to nobody, for good."""
    ids = sandbox_ids() if drop else None
    libc: Any = _libc() if ids is not None else None
    owner = _owner_map() if ids is not None else None
    items = [(_staged(i).encode(), path.encode(), d) for i, (path, d) in enumerate(stage or [])]
    attr = _mount_attr(owner) if owner is not None else None

    def idmapped(source: bytes, place: bytes) -> bool:
        """Clone ``source``'s mounts, map root's ids to the sandbox user's, attach at
        ``place``; False where the kernel or the file system cannot (then a plain bind)."""
        fd = libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, source, _OPEN_TREE_CLONE | _AT_RECURSIVE)
        if fd < 0:
            return False
        try:
            flags = _AT_EMPTY_PATH | _AT_RECURSIVE
            if libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", flags, attr, 32) != 0:
                return False
            empty = _MOVE_MOUNT_F_EMPTY_PATH
            return bool(libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, place, empty) == 0)
        finally:
            os.close(fd)

    def check(result: int) -> None:
        if result != 0:
            import ctypes

            err = ctypes.get_errno()
            raise OSError(err, f"staging the sandbox's folders: {os.strerror(err)}")

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))
        size = limits.file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if limits.memory_mb is not None:
            mem = limits.memory_mb * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        if ids is None:
            return
        check(libc.unshare(_CLONE_NEWNS))
        check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None))
        # opened in this namespace before the stage covers /tmp (the inputs live there)
        opened = [
            (place, os.open(source, os.O_PATH | os.O_CLOEXEC), d) for place, source, d in items
        ]
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        check(libc.mount(b"hfadapt", _STAGE.encode(), b"tmpfs", flags, b"mode=0755,size=64k"))
        for place, fd, folder in opened:
            if folder:
                os.mkdir(place, 0o755)
            else:
                os.close(os.open(place, os.O_CREAT | os.O_WRONLY, 0o644))
            source = f"/proc/self/fd/{fd}".encode()
            if attr is None or not idmapped(source, place):
                check(libc.mount(source, place, None, _MS_BIND | _MS_REC, None))
            os.close(fd)
        os.setgroups([])
        os.setgid(ids[1])
        os.setuid(ids[0])

    return apply


def _readable_by_sandbox(inputs: Path) -> None:
    """The input folder (inside a private 0700 folder of the parent) readable by the sandbox's
    unprivileged user."""
    os.chmod(inputs, 0o755)
    for root, dirs, files in os.walk(inputs):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)


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
    nproc = _nproc(limits, drop=isolate)
    fds: list[int] = []
    stage: list[tuple[str, bool]] = []
    try:
        if isolate:
            seccomp_fd = seccomp.filter_fd()
            if seccomp_fd is not None:
                fds.append(seccomp_fd)
            _readable_by_sandbox(inputs)
            binds = []
            for path, place in [*((p, str(p)) for p in mounts(readable)), (inputs, INPUT_DIR)]:
                if sandbox_ids() is None:  # opened here, shown by descriptor
                    fds.append(os.open(path, os.O_PATH | os.O_CLOEXEC))
                    binds.append(("--ro-bind-fd", str(fds[-1]), place))
                else:  # root: staged in the child, since nobody could not reach every place
                    binds.append(("--ro-bind", _staged(len(stage)), place))
                    stage.append((os.path.realpath(path), os.path.isdir(path)))
            argv = bwrap_argv(
                command,
                binds=binds,
                tmpfs_mb=limits.tmpfs_mb,
                shm_mb=limits.shm_mb,
                seccomp_fd=seccomp_fd,
            )
            where: Path | str | None = "/"
        else:
            argv, where = list(command), cwd
        return subprocess.Popen(
            argv,
            cwd=where,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # its own process group: a kill takes every child
            # setrlimit, then (as root) the staging and the drop to nobody, in the child
            preexec_fn=_limiter(limits, nproc, stage, drop=isolate),
            close_fds=True,
            pass_fds=tuple(fds),
        )
    finally:
        for fd in fds:
            os.close(fd)


class Killable(Protocol):
    """A started child process: ``subprocess.Popen`` or ``multiprocessing.Process``."""

    @property
    def pid(self) -> int | None: ...

    def kill(self) -> None: ...


def kill_group(proc: Killable) -> None:
    """SIGKILL to the session ``proc`` leads (the process and anything it ran); to ``proc`` alone
    when it leads none (yet)."""
    assert proc.pid is not None
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
                kill_group(proc)
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
        kill_group(proc)
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

    def inside(path: object) -> bool:
        if isinstance(path, int):
            return True  # an already-open descriptor
        if isinstance(path, bytes):
            path = path.decode(errors="replace")
        return os.path.realpath(str(path)).startswith(roots) or str(path) == os.devnull

    def hook(event: str, args: tuple[object, ...]) -> None:
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
