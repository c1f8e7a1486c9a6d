"""What one drafting attempt costs: the known-good solutions of a few agent-eval cases replayed
through the whole validation (``hfadapt agent-eval --reference``: policy, the sandbox, then the
proofs), each case in a fresh process, repeated; prints per-attempt seconds (median, min, max)
with the machine and its load.

    python benchmarks/bench_draft.py [--repeats 3] [--case NAME ...]

The same command runs on any hfadapt version that has ``agent-eval --reference``, so an older
checkout measured with this script gives the "before" of a change: run it from that checkout's
folder (the hfadapt imported is the one in the current directory)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

CASES = ("gelu-new-cube", "causal-mask-host", "softsign-pow-reciprocal")


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            model = next(
                (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model
            )
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, {model}; load average {load}"


def one_run(case: str) -> float:
    """Seconds of the single attempt agent-eval reports for ``case`` (in a fresh process)."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [sys.executable, "-c", "from hfadapt.cli import main; main()", "agent-eval",
             "--reference", "--json", "--case", case, "--db", f"{tmp}/runs.db"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "HFADAPT_HOME": tmp},
        )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(
            f"agent-eval --case {case} failed: {done.stderr.strip().splitlines()[-1:]}"
        )
    row = json.loads(done.stdout)["cases"][0]
    if row["outcome"] != "accepted":
        raise SystemExit(f"{case}: the reference solution was not accepted ({row['reason']})")
    return float(row["seconds"])


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--case", action="append", dest="cases")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    results: dict[str, list[float]] = {c: [] for c in args.cases or CASES}
    start = time.monotonic()
    for _ in range(args.repeats):  # interleaved: a slow phase of the machine hits every case
        for case in results:
            results[case].append(one_run(case))
    every = [s for runs in results.values() for s in runs]
    for case, runs in results.items():
        print(
            f"{case}: median {statistics.median(runs):.1f} s, min {min(runs):.1f}, max {max(runs):.1f}"
        )
    print(
        f"per attempt over {len(every)} runs: median {statistics.median(every):.1f} s, "
        f"min {min(every):.1f}, max {max(every):.1f} ({time.monotonic() - start:.0f} s in all)"
    )
    print(f"machine after: {machine()}")
    return results


if __name__ == "__main__":
    main()
