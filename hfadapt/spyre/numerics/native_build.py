"""The C kernels' library (``dl16_kernels.c``, package data): built with the system C compiler on
first use into the cache folder, loaded, and bound from the declarations the C file makes once.

Declared once: the C file's ``begin exports`` block holds one prototype per exported kernel;
``declared()`` reads it for the ctypes bindings (each parameter's type and name, in order),
the compiler checks every definition against it, and ``-Werror=missing-prototypes`` fails a
build that exports a function the block does not declare.

A failed build is reported once and remembered: the compiler's message goes into a record
beside where the library would be (``dl16-<key>.failed.json``, the key a hash of the C
source, the compiler and the flags), the first use in each process logs one warning naming
the record, and later processes read the record instead of running the compiler again, until
``hfadapt cache clear`` (or deleting the record) asks for another try. Without a compiler, with
``HFADAPT_NATIVE_DL16=0`` or after a failure, every kernel loader gives None and the torch ops
compute the same values."""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from hfadapt import settings

log = logging.getLogger(__name__)

SOURCE_FILE = "dl16_kernels.c"
# No -ffast-math: (v + m) - m must not be simplified away, nor contracted. OpenMP shares
# torch's libgomp (same soname), so torch.set_num_threads bounds both. An exported function
# without a declaration in the exports block is an error.
FLAGS = (
    "-O3",
    "-fPIC",
    "-shared",
    "-fopenmp",
    "-fno-fast-math",
    "-ffp-contract=off",
    "-Werror=missing-prototypes",
)
OPENMP_FLAG = "-fopenmp"
BUILD_TIMEOUT = 120.0  # seconds; a timeout is not recorded (a busy machine): the next process tries
FAILED_SUFFIX = ".failed.json"
_RETRY = "to retry: hfadapt cache clear, or delete that file"


def cache_dir() -> Path:
    return settings.kernel_cache()


@lru_cache(maxsize=1)
def source() -> str:
    """The kernels' C source, as the package ships it."""
    return (
        resources.files("hfadapt.spyre.numerics").joinpath(SOURCE_FILE).read_text(encoding="utf-8")
    )


# -- the declarations --------------------------------------------------------------------------


class BindingError(RuntimeError):
    """The C file's declarations cannot be read into bindings (a block missing, a type with no
    ctypes counterpart): a defect of the shipped C file, found before anything is called."""


# C parameter and return types the exports use -> ctypes; every pointer is a c_void_p
CTYPES: dict[str, Any] = {
    "int64_t": ctypes.c_int64,
    "int32_t": ctypes.c_int32,
    "float": ctypes.c_float,
    "int": ctypes.c_int,
}
_PROTOTYPE = re.compile(r"^(?P<ret>[\w ]+?)\s+(?P<name>hfadapt_\w+)\s*\((?P<params>[^)]*)\)$")
_PARAM = re.compile(r"^(?P<type>(?:const\s+)?\w+(?:\s*\*+\s*|\s+))(?P<name>\w+)$")


@dataclass(frozen=True)
class Signature:
    """An exported kernel as the C file declares it: its name, its parameters (name, C type)
    in order, and its return type."""

    name: str
    params: tuple[tuple[str, str], ...]
    returns: str

    @property
    def argtypes(self) -> list[object]:
        return [ctype(t) for _, t in self.params]

    @property
    def restype(self) -> Any:
        return ctype(self.returns)


def ctype(c_type: str) -> Any:
    """The ctypes type of a C type of the exports (pointers: c_void_p)."""
    if "*" in c_type:
        return ctypes.c_void_p
    found = CTYPES.get(c_type.removeprefix("const ").strip())
    if found is None:
        raise BindingError(f"{SOURCE_FILE}: C type {c_type!r} has no ctypes binding")
    return found


def block(text: str, name: str) -> str:
    """The text between ``/* begin NAME */`` and ``/* end NAME */`` in the C file."""
    found = re.search(rf"/\* begin {name} \*/(.*?)/\* end {name} \*/", text, re.S)
    if found is None:
        raise BindingError(f"{SOURCE_FILE}: no /* begin {name} */ ... /* end {name} */ block")
    return found.group(1)


def prototypes(text: str) -> dict[str, Signature]:
    """The exported kernels a block of C prototypes declares, by name."""
    out: dict[str, Signature] = {}
    code = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    for raw in code.split(";"):
        statement = " ".join(raw.split())
        if not statement:
            continue
        match = _PROTOTYPE.match(statement)
        if match is None:
            raise BindingError(f"{SOURCE_FILE}: not a prototype: {statement!r}")
        params: list[tuple[str, str]] = []
        for part in match["params"].split(","):
            part = " ".join(part.split())
            if part in ("void", ""):
                continue
            p = _PARAM.match(part)
            if p is None:
                raise BindingError(f"{SOURCE_FILE}: {match['name']}: parameter {part!r}")
            c_type = " ".join(p["type"].replace("*", " *").split())
            ctype(c_type)  # every type binds, found here rather than at a call
            params.append((p["name"], c_type))
        ctype(match["ret"].strip())
        out[match["name"]] = Signature(match["name"], tuple(params), match["ret"].strip())
    return out


@lru_cache(maxsize=1)
def declared() -> dict[str, Signature]:
    """The kernels the shipped C file exports (its ``exports`` block), by name."""
    return prototypes(block(source(), "exports"))


# -- building ----------------------------------------------------------------------------------

State = Literal["built", "failed", "no compiler", "disabled", "load failed"]


@dataclass(frozen=True)
class LibraryState:
    """Whether this process has the C kernels, and why not: ``state``, the library's path (built
    or to be built), the failure record (when a build failed), the compiler, and a one-line
    message (the compiler's, for a failure)."""

    state: State
    library: Path | None
    record: Path | None
    compiler: str | None
    message: str


@dataclass(frozen=True)
class _Plan:
    compiler: str | None
    key: str
    library: Path
    record: Path


class _BuildFailed(Exception):
    def __init__(self, command: list[str], returncode: int | None, stderr: str) -> None:
        super().__init__(stderr)
        self.command, self.returncode, self.stderr = command, returncode, stderr


def compiler() -> str | None:
    """The C compiler the build runs: ``$CC`` (found on PATH), else cc or gcc; None when
    there is none."""
    named = settings.c_compiler()
    if named:
        return shutil.which(named)
    return shutil.which("cc") or shutil.which("gcc")


def _plan() -> _Plan:
    cc = compiler()
    text = "\0".join([source(), cc or "", *FLAGS, platform.machine()])
    key = hashlib.sha256(text.encode()).hexdigest()[:16]
    folder = cache_dir()
    return _Plan(cc, key, folder / f"dl16-{key}.so", folder / f"dl16-{key}{FAILED_SUFFIX}")


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    if done.returncode != 0:
        raise _BuildFailed(command, done.returncode, done.stderr or done.stdout)


def _compile(cc: str, target: Path) -> None:
    """Build the library into ``target`` (atomically: a concurrent process never loads a
    half-written file). Without OpenMP where the compiler says it lacks it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "dl16.c"
        src.write_text(source(), encoding="utf-8")
        out = Path(tmp) / target.name
        command = [cc, *FLAGS, "-o", str(out), str(src)]
        try:
            _run(command)
        except _BuildFailed as exc:
            if not re.search(r"openmp|gomp|\bomp\b", exc.stderr, re.I):
                raise
            _run([c for c in command if c != OPENMP_FLAG])  # one thread
        os.replace(out, target)


def first_line(stderr: str, returncode: int | None) -> str:
    """The compiler's message in one line: its first line that says error, else its last."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"\berror\b", line, re.I)]
    line = (errors or lines or [f"exit code {returncode}"])[0 if errors else -1]
    return line if len(line) <= 300 else line[:297] + "..."


def _write_record(plan: _Plan, exc: _BuildFailed) -> bool:
    """The failure's record (JSON, written atomically); False when the folder is not writable
    (a sandboxed worker: the next process tries again)."""
    record = {
        "compiler": plan.compiler,
        "command": exc.command,
        "returncode": exc.returncode,
        "message": first_line(exc.stderr, exc.returncode),
        "stderr": exc.stderr[-20_000:],
        "flags": list(FLAGS),
        "source_sha256": hashlib.sha256(source().encode()).hexdigest(),
        "written": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    try:
        plan.record.parent.mkdir(parents=True, exist_ok=True)
        partial = plan.record.with_name(f".{plan.record.name}.{os.getpid()}")
        partial.write_text(json.dumps(record, indent=2), encoding="utf-8")
        os.replace(partial, plan.record)
        return True
    except OSError as err:
        log.info("could not write the build failure record %s: %s", plan.record, err)
        return False


def read_record(path: Path) -> dict[str, object] | None:
    """A failure record's fields, None when it is absent or unreadable (then it is ignored)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _failed(plan: _Plan, message: str, recorded: bool, when: str = "") -> LibraryState:
    where = f"recorded in {plan.record}" if recorded else "not recorded"
    log.warning(
        "native DL16 kernels not built: %s failed%s: %s (%s; the torch ops compute the same "
        "values, slower; %s)",
        plan.compiler,
        when,
        message,
        where,
        _RETRY,
    )
    return LibraryState(
        "failed", plan.library, plan.record if recorded else None, plan.compiler, message
    )


def _open(plan: _Plan) -> tuple[ctypes.CDLL | None, LibraryState]:
    """Load the library of ``plan``, building it first when it is not built and no record says
    the build fails; warns once (per process and build) when it cannot."""
    if plan.compiler is None and not plan.library.exists():
        named = settings.c_compiler()
        message = f"CC={named} is not on PATH" if named else "no C compiler on PATH (cc, gcc)"
        (log.warning if named else log.info)("native DL16 kernels not built: %s", message)
        return None, LibraryState("no compiler", None, None, None, message)
    if not plan.library.exists():
        record = read_record(plan.record)
        if record is not None:
            message = str(record.get("message", "?"))
            return None, _failed(plan, message, True, f" on {record.get('written', '?')}")
        try:
            if not _copy_built(plan):
                _compile(str(plan.compiler), plan.library)
        except _BuildFailed as exc:
            recorded = _write_record(plan, exc)
            return None, _failed(plan, first_line(exc.stderr, exc.returncode), recorded)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, _failed(plan, str(exc), False)
    try:
        lib = ctypes.CDLL(str(plan.library))
    except OSError as exc:
        log.warning("native DL16 kernels not loaded from %s: %s", plan.library, exc)
        return None, LibraryState("load failed", plan.library, None, plan.compiler, str(exc))
    _built[plan.key] = plan.library
    return lib, LibraryState("built", plan.library, None, plan.compiler, "")


# libraries this process loaded, by key (the hash of source, compiler and flags): a cache
# folder changed meanwhile gets a copy instead of another build of the same inputs
_built: dict[str, Path] = {}


def _copy_built(plan: _Plan) -> bool:
    """Copy the library of ``plan``'s key this process loaded from another folder; False when
    there is none (or it is gone)."""
    built = _built.get(plan.key)
    if built is None or not built.exists():
        return False
    plan.library.parent.mkdir(parents=True, exist_ok=True)
    partial = plan.library.with_name(f".{plan.library.name}.{os.getpid()}")
    shutil.copyfile(built, partial)
    os.replace(partial, plan.library)
    return True


_lock = threading.Lock()
_opened: dict[_Plan, tuple[ctypes.CDLL | None, LibraryState]] = {}


def _current() -> tuple[ctypes.CDLL | None, LibraryState]:
    if not settings.native_dl16():
        return None, LibraryState("disabled", None, None, None, "HFADAPT_NATIVE_DL16=0")
    plan = _plan()
    with _lock:
        if plan not in _opened:
            _opened[plan] = _open(plan)
        return _opened[plan]


def library() -> ctypes.CDLL | None:
    """The built library (built on first use), None when this process cannot have it: the
    kernels' loaders go through here, so their callers need no guard of their own."""
    return _current()[0]


def state() -> LibraryState:
    """Whether this process has the library, and why not (builds it if it is not built)."""
    return _current()[1]


def failure_records() -> list[Path]:
    """The build failure records in the cache folder (of any source, compiler or flags)."""
    folder = cache_dir()
    return sorted(folder.glob(f"dl16-*{FAILED_SUFFIX}")) if folder.is_dir() else []


def clear_failure_records() -> int:
    """Remove every build failure record (the next process tries to build again): how many."""
    removed = 0
    for path in failure_records():
        try:
            path.unlink()
            removed += 1
        except FileNotFoundError:
            pass
    return removed
