"""Two hand-made sweeps over seven models, for the report and the commands that read it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.sweeps import store_crawl

# Seven models (downloads 2,000 in all) judged by two sweeps; tests/test_report_*.py derive every
# number they assert from this table by hand: model -> (downloads, model_type, is_supported,
# sweep 1 (verdict, fingerprints, adapters), sweep 2 (verdict, fingerprints, adapters)).
REPORT_MODELS: dict[
    str,
    tuple[
        int, str, bool | None, tuple[str, list[str], list[str]], tuple[str, list[str], list[str]]
    ],
] = {
    "m/one": (1000, "bert", True, ("pass", [], ["a1"]), ("pass", [], ["a1"])),
    "m/two": (500, "bert", True, ("lowering_failed", ["F1"], []), ("pass", [], ["a2"])),
    "m/three": (
        300,
        "bert",
        False,
        ("lowering_failed", ["F1", "F2"], []),
        ("lowering_failed", ["F1", "F2"], []),
    ),
    "m/four": (100, "qwen3", True, ("pass", [], ["a1", "a2"]), ("lowering_failed", ["F3"], [])),
    "m/five": (60, "qwen3", False, ("verification_failed", [], []), ("pass", [], [])),
    "m/six": (30, "mpnet", None, ("lowering_failed", ["F2"], []), ("lowering_failed", ["F2"], [])),
    "m/seven": (10, "mpnet", False, ("custom_code", [], []), ("custom_code", [], [])),
}


# Evidence levels of the report runs (both sweeps); every other model has "config". m/five's
# pass in sweep 2 rests on its model type's defaults, so no headline counts it.
REPORT_LEVELS = {"m/five": "architecture", "m/six": "weights"}


def _violation(fp: str) -> dict[str, object]:
    site = "/venv/lib/python3.11/site-packages/transformers/models/bert/modeling_bert.py"
    return {
        "fingerprint": fp,
        "rule_id": f"rule.{fp}",
        "op": f"aten::op_{fp.lower()}",
        "message": "refused",
        "location": {"file": site, "line": 42, "function": "forward"},
    }


@pytest.fixture
def report_engine(tmp_path: Path) -> Iterator[object]:
    """A database with REPORT_MODELS crawled and judged by sweep 1 (baseline) and sweep 2."""
    from hfadapt.db.engine import get_engine
    from hfadapt.hub.catalog import HubRecord
    from hfadapt.sweep.store import finish_sweep, open_sweep, write_rows

    engine = get_engine(str(tmp_path / "report.db"))
    records = [
        HubRecord(
            id=m,
            downloads=d,
            model_type=t,
            reference_supported=ref,
            library="sentence-transformers",
        )
        for m, (d, t, ref, _, _) in REPORT_MODELS.items()
    ]
    store_crawl(engine, records)
    for index in (3, 4):
        sweep, _ = open_sweep(
            engine, {"n": index}, resume=False, mode="structural", models=7, units=7
        )
        rows = []
        for m, spec in REPORT_MODELS.items():
            verdict, fps, adapters = spec[index]
            level = REPORT_LEVELS.get(m, "config")
            rows.append({"model_id": m, "verdict": verdict, "reason": f"{verdict} of {m}", "model_type": spec[1],
                         "evidence_level": level,
                         "fingerprints": fps, "violations": [_violation(fp) for fp in fps], "adapters": adapters,
                         "evidence": {"sweep": {"role": "representative"}}})  # fmt: skip
        assert sweep.id is not None
        write_rows(engine, sweep.id, rows)
        finish_sweep(engine, sweep.id, seconds=1.0)
    yield engine
    engine.dispose()
