"""The cyclic garbage collector's settings for the ``hfadapt`` command's own process.

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

Only the command's own process: the library (``hfadapt.load`` in a user's program) never
touches the collector, and sweep workers are spawned with Python's defaults.
"""

from __future__ import annotations

import gc

YOUNG = 200_000
OLDER = 30


def tune() -> None:
    """Collect less often (see the module doc)."""
    gc.set_threshold(YOUNG, OLDER, OLDER)


def settle() -> None:
    """Exempt every object alive now from later collections (see the module doc)."""
    gc.freeze()


__all__ = ["settle", "tune"]
