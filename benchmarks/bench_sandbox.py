"""What the bubblewrap sandbox costs each drafting attempt: starting ``bwrap`` (hfadapt's own
arguments, limits and environment: ``hfadapt.isolation.spawn``) around ``true``, against the same
``true`` started without isolation, interleaved.

    python benchmarks/bench_sandbox.py [--runs 9]"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import report_machine, spread


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from hfadapt.isolation import Limits, collect, sandbox_env, spawn, unavailable_reason

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args(argv)
    why = unavailable_reason()
    if why is not None:
        raise SystemExit(f"no sandbox here: {why}")
    report_machine("before")
    times: dict[str, list[float]] = {"bwrap": [], "plain": []}
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "in"
        inputs.mkdir()
        for _ in range(args.runs):
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
    print("`true` in hfadapt's bubblewrap sandbox vs started plainly (same limits, environment)")
    for name, values in times.items():
        print(f"  {name:6} {spread([v * 1e3 for v in values], 'ms', 1)}")
    report_machine("after")
    return times


if __name__ == "__main__":
    main()
