"""What hfadapt adds to ``import torch``: the simulated device registers itself through torch's
``torch.backends`` entry point, so every process in an environment with hfadapt pays for it.

    python benchmarks/bench_import.py [--runs 15]

Each run is a fresh ``python -c "import torch"``, interleaved: with the device's autoload (the
default) and without it (``HFADAPT_SPYRE_AUTOLOAD=0``). Printed: wall and CPU time of each
(median, min, max), the difference of the medians, and whether the autoload left Dynamo
unimported (it imports it only once something else does). ``main()`` returns the numbers.

Another build's figure: from a folder outside both checkouts (the current folder comes first
on ``sys.path``), ``PYTHONPATH=OTHER_CHECKOUT python /path/to/benchmarks/bench_import.py``."""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from machine import byte_compile, report_machine, spread

CHILD = "import sys, torch; print('torch._dynamo' in sys.modules)"


def one_run(autoload: bool) -> tuple[float, float, bool]:
    env = dict(os.environ, HFADAPT_SPYRE_AUTOLOAD="1" if autoload else "0")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stdout.strip() == "True"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    opts = parser.parse_args(argv)
    report_machine("before")
    print(byte_compile())
    one_run(True), one_run(False)  # warm the page cache for both
    runs: dict[bool, list[tuple[float, float, bool]]] = {True: [], False: []}
    for _ in range(opts.runs):
        for autoload in (True, False):
            runs[autoload].append(one_run(autoload))
    result: dict[str, Any] = {}
    for autoload, name in ((True, "with the device"), (False, "HFADAPT_SPYRE_AUTOLOAD=0")):
        walls = [r[0] for r in runs[autoload]]
        cpus = [r[1] for r in runs[autoload]]
        dynamo = any(r[2] for r in runs[autoload])
        print(f"import torch, {name}")
        print(f"  wall {spread(walls)}")
        print(f"  CPU  {spread(cpus)}")
        print(f"  Dynamo imported: {'yes' if dynamo else 'no'}")
        result[name] = {
            "wall": statistics.median(walls),
            "cpu": statistics.median(cpus),
            "dynamo": dynamo,
        }
    wall = result["with the device"]["wall"] - result["HFADAPT_SPYRE_AUTOLOAD=0"]["wall"]
    cpu = result["with the device"]["cpu"] - result["HFADAPT_SPYRE_AUTOLOAD=0"]["cpu"]
    print(f"the device adds: wall {wall * 1e3:+.0f} ms, CPU {cpu * 1e3:+.0f} ms (medians)")
    result["added_wall"], result["added_cpu"] = wall, cpu
    report_machine("after")
    return result


if __name__ == "__main__":
    main()
