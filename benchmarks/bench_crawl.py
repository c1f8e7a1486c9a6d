"""``hfadapt crawl --offline``: the bundled snapshot of the top 10,000 into a fresh runs.db.

    python benchmarks/bench_crawl.py [--runs 5]

Each run is a fresh ``hfadapt crawl --offline --json`` process into a new database: the
command's wall time (interpreter start and imports included) and the crawl's own seconds (what
the command reports), as median, min and max."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import report_machine, spread


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    report_machine("before")
    hfadapt = str(Path(sys.executable).with_name("hfadapt"))
    walls: list[float] = []
    inside: list[float] = []
    kept = 0
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            db = str(Path(tmp) / f"runs-{i}.db")
            start = time.perf_counter()
            done = subprocess.run(
                [hfadapt, "crawl", "--offline", "--json", "--db", db],
                capture_output=True,
                text=True,
                check=True,
            )
            walls.append(time.perf_counter() - start)
            data = json.loads(done.stdout)
            inside.append(float(data["seconds"]))
            kept = int(data["kept"])
    print(f"hfadapt crawl --offline, bundled snapshot ({kept:,} models kept), fresh runs.db each")
    print(f"  command wall  {spread(walls, 's', 2)}")
    print(f"  in the crawl  {spread(inside, 's', 2)}")
    report_machine("after")
    return {"command_s": walls, "crawl_s": inside}


if __name__ == "__main__":
    main()
