"""What hfadapt's own processes save by their collector settings and their ending
(``hfadapt.own_process``): a process that imports what a sandboxed draft worker imports (torch,
Dynamo, ``torch.export``, transformers), with Python's collector or the tuned one, ending through
the interpreter's teardown or through ``own_process.end``.

    python benchmarks/bench_process.py [--runs 9]

Each run is a fresh ``python -c`` per variant, the four interleaved (the machine's speed drifts
from one minute to the next; neighbours share it). Printed per variant: wall and CPU time
(median, min, max), and inside the child the seconds its imports took; then what the tuned
collector saves of the imports and what skipping the teardown saves of the whole process, as
differences and ratios of the medians. ``main()`` returns the medians."""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from machine import byte_compile, report_machine, runs_and_threads, spread

IMPORTS = "import torch, torch._dynamo, torch.export, transformers"
CHILD = """
import time
from hfadapt import own_process
if {tuned}:
    own_process.tune()
start = time.perf_counter()
{imports}
print(time.perf_counter() - start, flush=True)
if {ended}:
    own_process.end(0)
"""
VARIANTS = {
    "default collector, teardown": (False, False),
    "tuned collector, teardown": (True, False),
    "default collector, end()": (False, True),
    "tuned collector, end()": (True, True),
}


def one_run(tuned: bool, ended: bool) -> tuple[float, float, float]:
    """(wall, CPU, the imports' seconds inside) of one fresh process."""
    code = CHILD.format(tuned=tuned, ended=ended, imports=IMPORTS)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, float(done.stdout.split()[0])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    opts = runs_and_threads(__doc__, runs=9).parse_args(argv)
    report_machine("before")
    print(byte_compile())
    for tuned, ended in VARIANTS.values():
        one_run(tuned, ended)  # warm the page cache for each
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in VARIANTS}
    for _ in range(opts.runs):
        for name, (tuned, ended) in VARIANTS.items():
            runs[name].append(one_run(tuned, ended))
    medians: dict[str, dict[str, float]] = {}
    for name, seen in runs.items():
        walls, cpus, imports = ([r[i] for r in seen] for i in range(3))
        print(f"{IMPORTS}: {name}")
        print(f"  wall    {spread(walls)}")
        print(f"  CPU     {spread(cpus)}")
        print(f"  imports {spread(imports)}")
        medians[name] = {
            "wall": statistics.median(walls),
            "cpu": statistics.median(cpus),
            "imports": statistics.median(imports),
        }
    default, tuned = medians["default collector, teardown"], medians["tuned collector, teardown"]
    ended, both = medians["default collector, end()"], medians["tuned collector, end()"]
    print(
        f"the tuned collector: imports {tuned['imports']:.3f} vs {default['imports']:.3f} s "
        f"({tuned['imports'] / default['imports']:.2f}x, {default['imports'] - tuned['imports']:.3f} s saved)"
    )
    print(
        f"end() instead of the teardown: wall {ended['wall']:.3f} vs {default['wall']:.3f} s "
        f"({default['wall'] - ended['wall']:.3f} s saved)"
    )
    print(
        f"both, as a sandboxed worker runs: wall {both['wall']:.3f} vs {default['wall']:.3f} s "
        f"({both['wall'] / default['wall']:.2f}x), CPU {both['cpu']:.3f} vs {default['cpu']:.3f} s"
    )
    report_machine("after")
    return medians


if __name__ == "__main__":
    main()
