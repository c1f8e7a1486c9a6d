"""The sandbox process: ``python -m hfadapt.agent.sandbox_worker JOB.json``. Imports the heavy
libraries, then limits itself (address space, CPU time, file size, no core dumps), installs an
audit hook that refuses processes, sockets and writes outside its folder, and only then loads
the draft and runs the job's steps, one JSON line each in ``results.jsonl``."""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from typing import Any

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


def _vm_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _limit(job: dict[str, Any]) -> None:
    budget = int(job.get("memory_mb", 3072)) * 1024 * 1024
    # Address space = what the imports already mapped + the draft's budget.
    resource.setrlimit(resource.RLIMIT_AS, (_vm_bytes() + budget, _vm_bytes() + budget))
    cpu = int(job.get("cpu_seconds", 185))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024 * 1024, 64 * 1024 * 1024))


def _guard(*writable: str) -> None:
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


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:800]


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as fh:
        job = json.load(fh)
    results = open(job["results_path"], "a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def emit(record: dict[str, Any]) -> None:
        results.write(json.dumps(record, default=str) + "\n")
        results.flush()

    import torch  # heavy imports first: their address space is not the draft's budget

    torch.set_num_threads(int(job.get("threads", 1)))
    if job.get("import_transformers", True):
        import transformers  # noqa: F401

    from hfadapt.agent import steps

    _limit(job)
    _guard(job["output_dir"], os.environ.get("TMPDIR", ""))
    ctx = steps.Context(job)
    for name in job["steps"]:
        emit({"start": name})
        start = time.monotonic()
        try:
            status, summary, output = steps.STEPS[name](ctx)
        except MemoryError:
            status, summary, output = (
                "fail",
                f"exceeded the memory limit of {job.get('memory_mb')} MB (MemoryError)",
                {},
            )
        except Exception as exc:  # the draft's failure is the step's finding
            tb = traceback.format_exc().strip().splitlines()[-12:]
            status, summary, output = "fail", _one_line(exc), {"traceback": "\n".join(tb)}
        emit(
            {
                "step": name,
                "status": status,
                "summary": summary,
                "output": output,
                "seconds": round(time.monotonic() - start, 3),
            }
        )
        if status not in ("pass", "skip"):
            break
    results.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
