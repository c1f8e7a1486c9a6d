"""What a cycle costs beyond its sweep: the comparison with the last cycle and the report.

    python benchmarks/bench_cycle.py [--top 30] [--workers 1] [--synthetic 10000] [--repeat 5]

1. ``--top N`` (0 skips it): two real cycles on a fresh database (bundled snapshot, the real
   worker, structural mode), the second compared with the first; for the second: its crawl,
   sweep and comparison seconds as the cycle measured them, and the HTML report against the
   first (hfadapt.report.coverage + html, what ``--html`` writes) timed beside them;
   the overhead is (comparison + report) / sweep;
2. ``--synthetic N`` (0 skips it): the comparison and the report alone on two generated sweeps
   of N models each (benchmarks/bench_serve.py's generator), ``--repeat`` times: the part of
   a 10,000-model cycle that is not its sweep, to set against the sweep's own time
   (benchmarks/bench_sweep.py).

Prints median, min and max; ``main()`` returns the numbers.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import report_machine, spread


def _report_seconds(engine: Any, sweep_id: int, against: int) -> float:
    from hfadapt.report.coverage import build_report
    from hfadapt.report.html import render_html

    started = time.perf_counter()
    render_html(build_report(engine, sweep_id=sweep_id, against=against))
    return time.perf_counter() - started


def real_cycles(folder: Path, *, top: int, workers: int) -> dict[str, Any]:
    from hfadapt.db.engine import get_engine
    from hfadapt.service.cycle import CycleOptions, run_cycle
    from hfadapt.sweep.options import SweepOptions

    engine = get_engine(str(folder / "cycles.db"))
    options = CycleOptions(sweep=SweepOptions(top=top, workers=workers), offline=True)
    first = run_cycle(engine, options)
    second = run_cycle(engine, options)
    assert second.comparison is not None
    report = _report_seconds(engine, second.sweep.sweep_id, first.sweep.sweep_id)
    engine.dispose()
    extra = second.compare_seconds + report
    return {
        "first_s": first.seconds, "crawl_s": second.crawl_seconds, "sweep_s": second.sweep_seconds,
        "compare_s": second.compare_seconds, "report_s": report,
        "overhead": extra / second.sweep_seconds, "total_s": second.seconds,
    }  # fmt: skip


def synthetic(folder: Path, *, models: int, repeat: int) -> dict[str, Any]:
    from bench_serve import generate

    from hfadapt.db.engine import get_engine
    from hfadapt.service.compare import compare_sweeps

    db = folder / "synthetic.db"
    made = generate(db, top=models, cycles=2)
    engine = get_engine(str(db))
    compares, reports = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        comp = compare_sweeps(engine, 2, 1)
        compares.append(time.perf_counter() - started)
        reports.append(_report_seconds(engine, 2, 1))
    engine.dispose()
    return {"generate_s": made["seconds"], "compare_s": compares, "report_s": reports,
            "regressions": len(comp.regressions)}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--synthetic", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    report_machine("before")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench_cycle_") as tmp:
        if args.top:
            real = out["real"] = real_cycles(Path(tmp), top=args.top, workers=args.workers)
            print(f"cycle over the top {args.top} (second of two, workers {args.workers}): "
                  f"crawl {real['crawl_s']:.1f} s, sweep {real['sweep_s']:.1f} s, comparison "
                  f"{real['compare_s']:.3f} s, HTML report {real['report_s']:.3f} s: "
                  f"comparison + report = {100 * real['overhead']:.2f} % of the sweep")  # fmt: skip
        if args.synthetic:
            syn = out["synthetic"] = synthetic(Path(tmp), models=args.synthetic, repeat=args.repeat)
            print(f"two generated sweeps of {args.synthetic:,} models "
                  f"({syn['regressions']} regressions): comparison {spread(syn['compare_s'])}; "
                  f"HTML report {spread(syn['report_s'])}")  # fmt: skip
    report_machine("after")
    return out


if __name__ == "__main__":
    main()
