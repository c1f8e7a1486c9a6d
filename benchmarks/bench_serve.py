"""Model lookup latency of ``hfadapt serve`` on a year of weekly cycles.

    python benchmarks/bench_serve.py [--top 1000] [--cycles 52] [--requests 200] [--keep DIR]

1. generates a results database: ``--cycles`` completed cycles (default 52: a year of weekly
   ones), each a sweep of the ``--top`` models (rows written through hfadapt's own tables:
   sweeps, runs with violations and fingerprints on failures, cycles whose summary is
   hfadapt.service.compare's comparison with the cycle before); about 12 % of the models
   fail, and a few flip each week;
2. starts ``hfadapt serve`` on it as a real process (a free 127.0.0.1 port);
3. times ``--requests`` lookups ``GET /api/models/{id}`` over one keep-alive connection, the
   ids spread over the ranking (each answer: the latest run's card and its history across
   every cycle), after one warm-up request, and the dashboard's ``/`` a few times.

Prints median, min and max (target: a model lookup under 50 ms); ``main()`` returns them.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from machine import report_machine, spread

TARGET_MS = 50.0


def _fails(model: int, week: int) -> bool:
    """Whether model ``model`` fails in week ``week``: ~12 % always, a few flip for a week."""
    digest = int(hashlib.sha1(f"{model}".encode()).hexdigest(), 16)
    flip = int(hashlib.sha1(f"{model}:{week}".encode()).hexdigest(), 16) % 97 == 0
    return (digest % 8 == 0) != flip


def generate(db: Path, *, top: int, cycles: int) -> dict[str, Any]:
    """Write ``cycles`` weekly cycles of ``top`` models into a new database at ``db``."""
    from hfadapt.db.engine import get_engine, session
    from hfadapt.db.tables import DONE, Cycle, HubModel, Run, Sweep
    from hfadapt.service.compare import compare_sweeps

    started = time.perf_counter()
    engine = get_engine(str(db))
    ids = [f"org{m % 97}/model-{m}" for m in range(top)]
    with session(engine) as sess:
        for rank, model in enumerate(ids, 1):
            sess.add(HubModel(id=model, rank=rank, downloads=10_000_000 // rank, model_type="bert"))
    first = datetime.now(UTC) - timedelta(weeks=cycles)
    previous: int | None = None
    for week in range(cycles):
        when = first + timedelta(weeks=week)
        with session(engine) as sess:
            sweep = Sweep(key=f"week{week}", status=DONE, models=top, finished_at=when,
                          started_at=when, mode="structural", top=top)  # fmt: skip
            sess.add(sweep)
            sess.flush()
            assert sweep.id is not None
            counts: dict[str, int] = {}
            for m, model in enumerate(ids):
                failed = _fails(m, week)
                verdict = "lowering_failed" if failed else "pass"
                counts[verdict] = counts.get(verdict, 0) + 1
                fp = f"{m % 23:012x}"
                violation = {"fingerprint": fp, "rule_id": "dtype.cast", "op": "aten::_to_copy",
                             "message": "cast from int32 to bool on the device",
                             "location": {"file": "transformers/masking_utils.py", "line": 835,
                                          "function": "_preprocess_mask_arguments"}}  # fmt: skip
                sess.add(Run(
                    model_id=model, sweep_id=sweep.id, verdict=verdict, mode="structural",
                    execution="compile", evidence_level="config", model_type="bert",
                    reason="[structural] InductorError: cast from int32 to bool" if failed
                    else "[structural] min token cos 0.99999", signature=f"{m:016x}",
                    fingerprints=[fp] if failed else [], violations=[violation] if failed else [],
                    adapters=["gelu-exact-host", "layer-norm-unfused"],
                    versions={"torch": "2.13.0+cpu", "transformers": "5.25.0"},
                    started_at=when, finished_at=when,
                ))  # fmt: skip
            sweep.counts = counts
            sess.add(sweep)
            sweep_id = sweep.id
        summary = compare_sweeps(engine, sweep_id, previous).to_dict() if previous else None
        with session(engine) as sess:
            sess.add(Cycle(
                key="{}", status=DONE, sweep_id=sweep_id, baseline_sweep_id=previous,
                summary=summary, regressions=len(summary["regressions"]) if summary else 0,
                started_at=when, finished_at=when,
            ))  # fmt: skip
        previous = sweep_id
    engine.dispose()
    return {"seconds": time.perf_counter() - started, "runs": top * cycles, "ids": ids,
            "bytes": db.stat().st_size}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _timed(conn: http.client.HTTPConnection, path: str) -> tuple[float, int, bytes]:
    started = time.perf_counter()
    conn.request("GET", path)
    answer = conn.getresponse()
    body = answer.read()
    return (time.perf_counter() - started) * 1000, answer.status, body


def measure(db: Path, ids: list[str], *, requests: int) -> dict[str, Any]:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "hfadapt", "serve", "--port", str(port), "--db", str(db)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
                first_ms, status, _ = _timed(conn, "/api/healthz")
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"serve did not start: {server.communicate()[1]}") from None
                time.sleep(0.2)
        step = max(1, len(ids) // requests)
        chosen = [ids[(i * step) % len(ids)] for i in range(requests)]
        cold_ms, status, body = _timed(conn, f"/api/models/{chosen[0]}")
        history = len(json.loads(body)["history"])
        lookups = []
        for model in chosen:
            ms, status, body = _timed(conn, f"/api/models/{model}")
            assert status == 200, (model, status, body[:200])
            lookups.append(ms)
        pages = [_timed(conn, "/")[0] for _ in range(5)]
    finally:
        server.terminate()
        server.communicate(timeout=30)
    return {"cold_ms": cold_ms, "lookups_ms": lookups, "dashboard_ms": pages,
            "history_entries": history, "healthz_ms": first_ms}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--top", type=int, default=1000)
    parser.add_argument("--cycles", type=int, default=52)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--keep", type=Path, help="write the database here (kept)")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    report_machine("before")
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench_serve_"))
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "year.db"
    db.unlink(missing_ok=True)
    made = generate(db, top=args.top, cycles=args.cycles)
    print(f"database: {args.cycles} cycles x {args.top} models = {made['runs']:,} runs, "
          f"{made['bytes'] / 2**20:.0f} MiB, generated in {made['seconds']:.0f} s")  # fmt: skip
    found = measure(db, made["ids"], requests=args.requests)
    lookups = found["lookups_ms"]
    print(f"model lookup (GET /api/models/{{id}}, {found['history_entries']} cycles of history "
          f"each): {spread(lookups, 'ms', 2)}; first request {found['cold_ms']:.1f} ms")  # fmt: skip
    print(f"dashboard (GET /): {spread(found['dashboard_ms'], 'ms', 1)}")
    verdict = "meets" if sorted(lookups)[len(lookups) // 2] < TARGET_MS else "misses"
    print(f"target: median under {TARGET_MS:.0f} ms: {verdict}")
    report_machine("after")
    if args.keep is None:
        for extra in ("", "-wal", "-shm"):
            Path(f"{db}{extra}").unlink(missing_ok=True)
        folder.rmdir()
    return {**found, "runs": made["runs"], "bytes": made["bytes"]}


if __name__ == "__main__":
    main()
