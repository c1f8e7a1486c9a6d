"""The RoPE families of the bundled snapshot's top N on the simulated device: a structural,
compiled sweep into a scratch database, then every model of a RoPE model type counted by
verdict with its downloads, beside the environment the runs recorded (transformers, kernels).
transformers 5.25 with ``kernels`` had 36 of the top 300 (33.3M downloads) flip from pass to
fail while the RoPE adapters reported themselves applied; this is the check that they are
back (about a minute and a half on 2 cores).

    python benchmarks/bench_rope_families.py [--top 300] [--db PATH]

``main()`` returns every number."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from machine import report_machine

# model types whose bundled adapters rewrite rotary embeddings (adapters/rope.py's ROPE_FORMS)
ROPE_TYPES = frozenset(
    [
        "qwen3",
        "gemma3_text",
        "modernbert",
        "nomic_bert",
        "qwen2",
        "mistral",
        "llama",
        "gte",
        "jina_embeddings_v3",
        "eurobert",
        "gemma2",
        "qwen3_vl",  # judged as its text model, qwen3_vl_text (hfadapt.loading.translate)
        "qwen3_vl_text",
    ]
)


def _sweep(db: Path, top: int) -> float:
    start = time.perf_counter()
    argv = [sys.executable, "-m", "hfadapt", "sweep", "--top", str(top), "--db", str(db)]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=dict(os.environ))
    return time.perf_counter() - start


def count(db: Path) -> dict[str, Any]:
    """Verdicts of the RoPE-family rows of the newest sweep, and every row's downloads."""
    from sqlalchemy import select

    from hfadapt.db.engine import get_engine, session
    from hfadapt.db.tables import HubModel, Run

    engine = get_engine(str(db))
    with session(engine, write=False) as sess:
        columns = (Run.model_id, Run.model_type, Run.verdict, Run.versions, HubModel.downloads)
        joined = select(*columns).join(  # type: ignore[call-overload]
            HubModel, HubModel.id == Run.model_id, isouter=True
        )
        rows = sess.execute(joined).all()
    verdicts: Counter[str] = Counter()
    downloads: Counter[str] = Counter()
    failing: list[str] = []
    versions: dict[str, str] = {}
    for model_id, model_type, verdict, recorded, dl in rows:
        if model_type in ROPE_TYPES:
            verdicts[verdict] += 1
            downloads[verdict] += dl or 0
            if verdict not in ("pass", "custom_code", "skipped"):
                failing.append(model_id)
            versions = recorded or versions
    every = sum(dl or 0 for *_, dl in rows)
    return {
        "models": len(rows),
        "downloads": every,
        "rope_verdicts": dict(verdicts),
        "rope_downloads": dict(downloads),
        "rope_pass_share": downloads["pass"] / every if every else 0.0,
        "rope_failing": failing,
        "environment": {k: versions.get(k) for k in ("transformers", "kernels", "torch")},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=300)
    parser.add_argument(
        "--db", type=Path, default=None, help="scratch database (default: a temp file)"
    )
    args = parser.parse_args(argv)
    report_machine("before")
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "runs.db"
        seconds = _sweep(db, args.top)
        numbers = count(db)
    numbers["sweep_seconds"] = round(seconds, 1)
    report_machine("after")
    print(json.dumps(numbers, indent=1))
    v, d = numbers["rope_verdicts"], numbers["rope_downloads"]
    print(
        f"RoPE families in the top {args.top}: {v.get('pass', 0)} pass "
        f"({d.get('pass', 0) / 1e6:.1f}M downloads, {numbers['rope_pass_share']:.1%} of the "
        f"top {args.top}'s), {len(numbers['rope_failing'])} fail; not judged: "
        f"custom_code {v.get('custom_code', 0)}, skipped {v.get('skipped', 0)}; "
        f"on {numbers['environment']}"
    )
    return numbers


if __name__ == "__main__":
    main()
