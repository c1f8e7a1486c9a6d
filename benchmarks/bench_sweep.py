"""Sweep speed on the bundled snapshot, structural mode, the real worker and simulated device.

    python benchmarks/bench_sweep.py [--top N] [--runs 1] [--workers 2] [--compare-top 300] [--out FILE] [--keep DIR]

Two measurements, each in a fresh database (under ``--keep DIR`` if given, else deleted):

1. the sweep of the top N models (default: all 10,000; ``--top 0`` skips it) with ``--workers``
   workers: wall time, CPU time of the driver and its workers (on a machine shared with other
   jobs, CPU time over the cores bounds what an idle machine would take), models per minute,
   dedupe factor (judged models per unit of work), units, verdict counts, the slowest units,
   and peak memory (ru_maxrss) of the driver and of a worker;
2. workers 1 against 2, side by side, on the top ``--compare-top`` models (0 to skip): the
   same units in both, so the speed-up is the pool's alone.

``main()`` returns every number as a dict (also written as JSON with ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import report_machine, spread


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # workers, once joined
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def sweep_once(
    db: Path,
    *,
    top: int | None,
    workers: int,
    timeout: float,
    memory_limit: int | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """One sweep into ``db``; its SweepResult as a dict, with wall and CPU time around it."""
    from hfadapt.db.engine import get_engine
    from hfadapt.sweep.run import SweepOptions, run_sweep

    engine = get_engine(str(db))
    last = [0.0]

    def progress(p: Any) -> None:
        if quiet or (time.monotonic() - last[0] < 15 and p.done < p.total):
            return
        last[0] = time.monotonic()
        eta = f"{p.eta:.0f}s" if p.eta is not None else "?"
        print(
            f"  {p.done:,}/{p.total:,} models, {p.units_done}/{p.units_total} units, {p.elapsed:.0f}s, eta {eta}",
            flush=True,
        )

    start, cpu_start = time.perf_counter(), _cpu()
    options = SweepOptions(
        top=top, workers=workers, timeout=timeout, memory_limit=memory_limit, resume=False
    )
    result = run_sweep(engine, options, progress=progress)
    wall, cpu = time.perf_counter() - start, _cpu() - cpu_start
    peaks = _worker_peaks(engine, result.sweep_id)
    engine.dispose()
    data = dict(vars(result))
    slowest = sorted(data.pop("unit_seconds").items(), key=lambda kv: -kv[1])[:10]
    data.update(
        wall_seconds=round(wall, 1),
        cpu_seconds=round(cpu, 1),
        models_per_minute=round(result.models_per_minute, 1),
        slowest_units=slowest,
        worker_peak_rss_mb_median=peaks[len(peaks) // 2] if peaks else None,
    )
    return data


def _worker_peaks(engine: Any, sweep_id: int) -> list[float]:
    """Each unit's worker peak RSS (the process's, so far), sorted."""
    from hfadapt.sweep.store import done_rows

    rows = done_rows(engine, sweep_id).values()
    found = [(r["evidence"] or {}).get("sweep", {}).get("worker_peak_rss_mb") for r in rows]
    return sorted(float(p) for p in found if p)


def _coverage(db: Path) -> dict[str, Any]:
    """The headline of ``hfadapt report`` for the sweep in ``db``: passes on a model's own
    config or weights (models, downloads, share of all downloads) and, apart, passes that rest
    on the model type's defaults."""
    from hfadapt.db.engine import get_engine
    from hfadapt.report.coverage import build_report

    engine = get_engine(str(db))
    rep = build_report(engine)
    engine.dispose()
    return {
        "models": rep.models,
        "passed": rep.passed,
        "passed_downloads_m": round(rep.passed_downloads / 1e6, 1),
        "pass_rate_downloads": round(rep.pass_rate_downloads, 3),
        "passed_architecture": rep.passed_architecture,
        "passed_architecture_downloads_m": round(rep.passed_architecture_downloads / 1e6, 1),
    }


def _full(args: argparse.Namespace, folder: Path, report: dict[str, Any]) -> None:
    print(f"sweep: top {args.top or 'all'}, {args.workers} workers, {args.runs} run(s)", flush=True)
    runs = []
    for i in range(args.runs):  # each into a fresh database
        runs.append(
            sweep_once(
                folder / f"full-{i}.db",
                top=args.top,
                workers=args.workers,
                timeout=args.timeout,
                memory_limit=args.memory_limit,
            )
        )
        print(f"  run {i + 1}: {runs[-1]['wall_seconds']:.0f} s", flush=True)
    full = runs[-1]
    report["sweep"] = full
    report["sweep_wall_seconds"] = [r["wall_seconds"] for r in runs]
    print(f"  wall {spread(report['sweep_wall_seconds'], 's', 0)}", flush=True)
    print(
        f"  {full['models']:,} models in {full['wall_seconds']:.0f} s ({full['wall_seconds'] / 60:.1f} min), "
        f"CPU {full['cpu_seconds']:.0f} s: {full['models_per_minute']:,.0f} models/min; {full['units']} units, "
        f"dedupe factor {full['dedupe_factor']}; peak RSS driver {full['driver_peak_rss_mb']:.0f} MB, "
        f"worker {full['worker_peak_rss_mb']:.0f} MB (median over units {full['worker_peak_rss_mb_median'] or 0:.0f} MB)",
        flush=True,
    )
    print(f"  verdicts: {full['counts']}", flush=True)
    report["coverage"] = _coverage(folder / f"full-{args.runs - 1}.db")
    print(f"  coverage (hfadapt report): {report['coverage']}", flush=True)
    print(f"  slowest units: {full['slowest_units'][:5]}", flush=True)


def _compare(args: argparse.Namespace, folder: Path, report: dict[str, Any]) -> None:
    side: dict[str, Any] = {}
    for workers in (1, 2):
        print(f"top {args.compare_top}, {workers} worker(s)", flush=True)
        run = sweep_once(
            folder / f"w{workers}.db",
            top=args.compare_top,
            workers=workers,
            timeout=args.timeout,
            memory_limit=args.memory_limit,
            quiet=True,
        )
        side[str(workers)] = run
        print(
            f"  {run['wall_seconds']:.1f} s (CPU {run['cpu_seconds']:.0f} s), {run['units']} units, "
            f"{run['models_per_minute']:,.0f} models/min",
            flush=True,
        )
    speedup = (
        side["1"]["wall_seconds"] / side["2"]["wall_seconds"] if side["2"]["wall_seconds"] else 0.0
    )
    same = side["1"]["counts"] == side["2"]["counts"]
    report["workers_1_vs_2"] = {
        "top": args.compare_top,
        "runs": side,
        "speedup": round(speedup, 2),
        "same_counts": same,
    }
    print(f"  speed-up with 2 workers: {speedup:.2f}x; same verdict counts: {same}", flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument(
        "--top", type=int, default=None, help="models to sweep (default: all; 0: skip)"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--runs", type=int, default=1, help="sweeps of the top N, each fresh")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument(
        "--compare-top", type=int, default=300, help="models for workers 1 vs 2 (0: skip)"
    )
    parser.add_argument(
        "--memory-limit",
        type=int,
        default=10240,
        help="MB per worker, the same for 1 and 2 workers (default 10240: what two workers get here)",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep the databases in this folder")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report: dict[str, Any] = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    report_machine("before")
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        if args.top != 0:
            _full(args, folder, report)
        if args.compare_top:
            _compare(args, folder, report)
    report["load_average"] = os.getloadavg()
    report_machine("after")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2, default=str))
    return report


if __name__ == "__main__":
    main()
