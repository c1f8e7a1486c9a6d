"""hfadapt's own processes (the ``hfadapt`` command, sweep workers, sandboxed workers): the
cyclic garbage collector's settings, and ending without the interpreter's teardown.

Python's defaults (a young collection every 700 allocations, a full one every 100 young ones
give or take) are sized for small heaps. A diagnose holds about 500,000 long-lived objects
from torch, transformers, sympy and Dynamo, and each full collection walks all of them: 8 full
collections took 1.3 s of a 9 s diagnose of all-MiniLM-L6-v2 (benchmarks/bench_diagnose.py).
Importing torch, Dynamo, ``torch.export`` and transformers takes 1.79 s with Python's defaults
and 1.51 s with ``tune()`` (benchmarks/bench_process.py).

- ``tune()`` (before the heavy imports): young collections every 200,000 allocations, older
  generations after 30 of the younger (mypy's settings, for the same reason): cycles are
  still collected, far less often.
- ``settle()`` (once a process has imported what it runs on): the objects alive then
  (modules, classes, functions) move to the permanent generation, so no later collection walks
  them. They stay alive until the process exits, as imported modules do anyway.
- ``collect()`` (a sweep worker, after each unit): one full collection, so what a unit left in
  reference cycles (a model, its graphs) is freed before the next unit rather than on the
  collector's rarer schedule; the memory a worker holds between units stays what it was with
  Python's defaults.

Ending: the interpreter's teardown frees, one object at a time, memory the OS takes back
anyway: 0.67 s of a process that imported torch, Dynamo, ``torch.export`` and transformers
(bench_process.py; with both, such a process takes 1.56 s where it took 2.51 s).

- ``leave(code)`` (the command, a sweep worker): the exit handlers run (logging, temporary
  folders, multiprocessing's own), the output is flushed and the process ends with
  ``os._exit``. While a thread that is not a daemon still runs it exits the normal way, which
  waits for that thread, as the interpreter would.
- ``end(code)`` (a sandboxed worker, once its results are written): the output is flushed and
  the process ends; no exit handler runs, so nothing the untrusted code registered runs after
  its results, and no thread it started keeps the sandbox alive until its time limit.

Only hfadapt's own processes: the library (``hfadapt.load`` in a user's program) never touches
the collector or the exit, and ``hfadapt.cli.main`` (what tests call in their own process)
exits normally.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
import threading
from typing import NoReturn

YOUNG = 200_000
OLDER = 30


def tune() -> None:
    """Collect less often (see the module doc)."""
    gc.set_threshold(YOUNG, OLDER, OLDER)


def settle() -> None:
    """Exempt every object alive now from later collections (see the module doc)."""
    gc.freeze()


def collect() -> int:
    """One full collection now (see the module doc); how many objects it found unreachable."""
    return gc.collect()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        # a reader that closed the pipe: nothing left to show
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()


def _threads_to_wait_for() -> bool:
    main = threading.main_thread()
    return any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate())


def leave(code: int) -> NoReturn:
    """End the process with ``code`` after the exit handlers and a flush, without the
    interpreter's teardown (see the module doc)."""
    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_handlers is None or _threads_to_wait_for():
        sys.exit(code)  # another Python, or a thread to wait for: the normal way
    run_handlers()
    _flush()
    os._exit(code)


def end(code: int) -> NoReturn:
    """End a sandboxed worker with ``code`` after a flush: no exit handler, no thread waited
    for, no teardown (see the module doc)."""
    _flush()
    os._exit(code)


__all__ = ["collect", "end", "leave", "settle", "tune"]
