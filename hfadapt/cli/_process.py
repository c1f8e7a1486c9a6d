"""The ``hfadapt`` command's own process: the cyclic garbage collector's settings, and leaving
without the interpreter's teardown.

Python's defaults (a young collection every 700 allocations, a full one every 100 young ones
give or take) are sized for small heaps. A diagnose holds about 500,000 long-lived objects
from torch, transformers, sympy and Dynamo, and each full collection walks all of them: 8 full
collections took 1.3 s of a 9 s diagnose of all-MiniLM-L6-v2 (benchmarks/bench_diagnose.py;
a bare ``import torch, transformers, sentence_transformers`` spends 0.8 s the same way).

- ``tune()`` (at the start of every command): young collections every 200,000 allocations,
  older generations after 30 of the younger (mypy's settings, for the same reason): cycles
  are still collected, far less often.
- ``settle()`` (once a command has imported what it runs on): the objects alive then (modules,
  classes, functions) move to the permanent generation, so no later collection walks them.
  They stay alive until the process exits, as imported modules do anyway.

Leaving (``leave``, what the console script and ``python -m hfadapt`` end with): once the
command has returned, its databases are closed and the exit handlers have run (logging, temporary
folders, multiprocessing), the output is flushed and the process ends with ``os._exit``. The
interpreter's own teardown would then only free memory the OS takes back anyway, one object at a
time: for a process that imported torch and Dynamo that is 0.8 s (1.3 s for a bare ``import
torch, transformers, sentence_transformers``). While another thread still runs, it exits the
normal way, which waits for it.

Only the command's own process: the library (``hfadapt.load`` in a user's program) never
touches the collector or the exit, ``hfadapt.cli.main`` (what tests call in their own process)
exits normally, and sweep workers are spawned with Python's defaults.
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


def leave(code: int) -> NoReturn:
    """End the process with ``code`` after the exit handlers and a flush, without the
    interpreter's teardown (see the module doc)."""
    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_handlers is None or threading.active_count() > 1:
        sys.exit(code)  # another Python, or a thread to wait for: the normal way
    run_handlers()
    for stream in (sys.stdout, sys.stderr):
        # a reader that closed the pipe: nothing left to show
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


__all__ = ["leave", "settle", "tune"]
