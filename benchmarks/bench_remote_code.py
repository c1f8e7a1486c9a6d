"""How much of the bundled snapshot's remote-code share native translations move, and what still
blocks the rest, from the sweep plan alone (no device run; about a minute).

    python benchmarks/bench_remote_code.py [--sweep DB] [--out FILE]

Plans a structural sweep over the snapshot's custom-code rows (prefilter applied, as a crawl
does): rows judged as their native translation per family, their downloads (share of all
downloads and of the custom-code downloads), and the fields that keep the others custom_code.
``--sweep DB`` also runs that sweep (real worker, simulated device; ~10 minutes on 2 shared
cores: 6 units of work) into DB and adds its verdicts. ``main()`` returns every number.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from typing import Any

from machine import report_machine


def _records() -> list[Any]:
    from hfadapt.hub import prefilter
    from hfadapt.hub.crawl import snapshot_records

    recs = [r for r in snapshot_records() if r.is_custom_code]
    prefilter.apply(recs)
    return recs


def plan_numbers() -> dict[str, Any]:
    from hfadapt.db.tables import HubModel
    from hfadapt.hub.snapshot import read_snapshot
    from hfadapt.sweep.plan import plan_sweep

    every = sum(r.downloads for r in read_snapshot())
    recs = _records()
    downloads = {r.id: r.downloads for r in recs}
    models = [
        HubModel(id=r.id, downloads=r.downloads, model_type=r.model_type, is_custom_code=True,
                 config_class=r.config_class, excluded_reason=r.excluded_reason)
        for r in recs
    ]  # fmt: skip
    start = time.perf_counter()
    plan = plan_sweep(models, mode="structural")
    seconds = time.perf_counter() - start
    families: Counter[str] = Counter()
    family_downloads: Counter[str] = Counter()
    for model_id, evidence in plan.translated.items():
        families[evidence["family"]] += 1
        family_downloads[evidence["family"]] += downloads[model_id]
    blockers: Counter[str] = Counter()
    blocker_downloads: Counter[str] = Counter()
    for row in plan.direct:
        found = re.search(r"no native translation \(([^:]+):", row["reason"])
        key = found.group(1) if found else row["verdict"]
        blockers[key] += 1
        blocker_downloads[key] += downloads[row["model_id"]]
    moved = sum(family_downloads.values())
    custom = sum(downloads.values())
    return {
        "custom_code_rows": len(recs),
        "custom_code_downloads": custom,
        "all_downloads": every,
        "translated_rows": len(plan.translated),
        "translated_downloads": moved,
        "translated_share_of_all": round(moved / every, 6),
        "translated_share_of_custom_code": round(moved / custom, 6),
        "units": len(plan.units),
        "families": {f: [families[f], family_downloads[f]] for f in families},
        "still_custom_code_by_blocker": {k: [blockers[k], blocker_downloads[k]] for k in blockers},
        "planning_seconds": round(seconds, 1),
    }


def sweep_numbers(db: str) -> dict[str, Any]:
    from hfadapt.db.engine import get_engine
    from hfadapt.hub.catalog import save_crawl, start_crawl
    from hfadapt.report.coverage import build_report
    from hfadapt.sweep.run import SweepOptions, run_sweep

    engine = get_engine(db)
    crawl_id = start_crawl(engine, source="snapshot", limit=None)
    save_crawl(engine, crawl_id, _records(), source="snapshot")
    options = SweepOptions(workers=1, resume=False, offline=True, timeout=1200)
    result = run_sweep(engine, options)
    report = build_report(engine, sweep_id=result.sweep_id)
    return {
        "sweep_seconds": result.seconds,
        "verdicts": result.counts,
        "translated": result.translated,
        "translated_per_family": report.translated,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", help="also run the sweep into this database")
    parser.add_argument("--out", help="write the numbers as JSON here")
    args = parser.parse_args(argv)
    report_machine("before")
    numbers = plan_numbers()
    if args.sweep:
        numbers["sweep"] = sweep_numbers(args.sweep)
    text = json.dumps(numbers, indent=2, default=str)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    report_machine("after")
    return numbers


if __name__ == "__main__":
    main(sys.argv[1:])
