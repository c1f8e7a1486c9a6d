"""What the bubblewrap sandbox costs each drafting attempt: starting ``bwrap`` (hfadapt's own
arguments, limits and environment: ``hfadapt.isolation.spawn``) around ``true``, against the same
``true`` started without isolation, interleaved.

``--parent-gib G``: then again while this process holds G GiB it has written (as a drafting
command holds its model). ``spawn`` sets the limits, stages the mounts and drops to nobody in
the child between fork and exec (``preexec_fn``), so Python forks the whole parent rather than
vforking it: a launch costs time in proportion to the parent's memory.

    python benchmarks/bench_sandbox.py [--runs 9] [--parent-gib 4]"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import report_machine, spread


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from hfadapt.isolation import unavailable_reason

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--parent-gib", type=float, default=0.0)
    args = parser.parse_args(argv)
    why = unavailable_reason()
    if why is not None:
        raise SystemExit(f"no sandbox here: {why}")
    report_machine("before")
    times = _launches(args.runs)
    print("`true` in hfadapt's bubblewrap sandbox vs started plainly (same limits, environment)")
    for name, values in times.items():
        print(f"  {name:6} {spread([v * 1e3 for v in values], 'ms', 1)}")
    if args.parent_gib > 0:
        light = {name: statistics.median(values) for name, values in times.items()}
        ballast = b"\x01" * int(args.parent_gib * 2**30)  # written: every page is the process's
        times = _launches(args.runs)
        del ballast
        print(f"the same while this process holds {args.parent_gib:g} GiB")
        for name, values in times.items():
            ratio = statistics.median(values) / light[name]
            print(f"  {name:6} {spread([v * 1e3 for v in values], 'ms', 1)}; {ratio:.1f}x")
    report_machine("after")
    return times


def _launches(runs: int) -> dict[str, list[float]]:
    """Seconds to start and collect ``true``, sandboxed and plainly, ``runs`` times each."""
    from hfadapt.isolation import Limits, collect, sandbox_env, spawn

    times: dict[str, list[float]] = {"bwrap": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "in"
        inputs.mkdir()
        for _ in range(runs):
            for name, isolate in (("bwrap", True), ("plain", False)):
                start = time.perf_counter()
                proc = spawn(
                    ["true"], inputs=inputs, env=sandbox_env(), limits=Limits(),
                    isolate=isolate, cwd=inputs,
                )  # fmt: skip
                done = collect(proc, 30.0)
                times[name].append(time.perf_counter() - start)
                if done.code != 0:
                    raise SystemExit(f"{name}: true exited {done.code}: {done.stderr_tail}")
    return times


if __name__ == "__main__":
    main()
