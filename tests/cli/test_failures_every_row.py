"""``hfadapt failures`` lists every failing row: those with a fingerprint under it, every other
one (worker_crashed, worker_timeout, verification_failed, load_failed, custom_code, a lowering
failure without a fingerprint, skipped...) in one group per verdict, none left out, none twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli

from hfadapt.db.engine import get_engine

# model -> (verdict, fingerprints, downloads)
ROWS: dict[str, tuple[str, list[str], int]] = {
    "org/pass": ("pass", [], 900),
    "org/pow": ("lowering_failed", ["f1"], 800),
    "org/pow2": ("lowering_failed", ["f1", "f2"], 50),
    "org/oom": ("worker_crashed", [], 700),
    "org/segv": ("worker_crashed", [], 10),
    "org/hang": ("worker_timeout", [], 20),
    "org/drift": ("verification_failed", [], 600),
    "org/noload": ("load_failed", [], 500),
    "org/own": ("custom_code", [], 400),
    "org/nofp": ("lowering_failed", [], 300),
    "org/ref": ("reference_failed", [], 30),
    "org/huge": ("skipped", [], 5),
}


@pytest.fixture
def failing_db(tmp_path: Path) -> Path:
    from support.sweeps import store_crawl

    from hfadapt.hub.catalog import HubRecord
    from hfadapt.sweep.store import finish_sweep, open_sweep, write_rows

    db = tmp_path / "runs.db"
    engine = get_engine(str(db))
    store_crawl(
        engine, [HubRecord(id=m, downloads=d, model_type="bert") for m, (_, _, d) in ROWS.items()]
    )
    sweep, _ = open_sweep(
        engine, {}, resume=False, mode="structural", models=len(ROWS), units=len(ROWS)
    )
    assert sweep.id is not None
    rows: list[dict[str, Any]] = []
    for model, (verdict, fps, _) in ROWS.items():
        violations = [{"fingerprint": f, "rule_id": "op.pow", "op": "aten::pow"} for f in fps]
        rows.append({"model_id": model, "verdict": verdict, "reason": f"why {model}",
                     "model_type": "bert", "fingerprints": fps, "violations": violations})  # fmt: skip
    write_rows(engine, sweep.id, rows)
    finish_sweep(engine, sweep.id, seconds=1.0)
    engine.dispose()
    return db


def test_failures_lists_every_failing_row_once_by_fingerprint_or_verdict(
    failing_db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["failures", "--json", "--db", str(failing_db)], monkeypatch, capsys)
    assert code == 0, err
    data = json.loads(out)
    fingerprints = {e["fingerprint"]: e["models"] for e in data if "fingerprint" in e}
    groups = {e["group"]: e["models"] for e in data if "group" in e}
    print(f"\nfingerprints {fingerprints}\ngroups {groups}")
    assert fingerprints == {"f1": ["org/pow", "org/pow2"], "f2": ["org/pow2"]}, fingerprints
    expected = {
        "worker_crashed": ["org/oom", "org/segv"],  # most downloaded first
        "verification_failed": ["org/drift"],
        "load_failed": ["org/noload"],
        "custom_code": ["org/own"],
        "lowering_failed": ["org/nofp"],
        "reference_failed": ["org/ref"],
        "worker_timeout": ["org/hang"],
        "skipped": ["org/huge"],
    }
    assert groups == expected, groups
    listed = {m for ms in fingerprints.values() for m in ms} | {
        m for ms in groups.values() for m in ms
    }
    failing = {m for m, (v, _, _) in ROWS.items() if v != "pass"}
    assert listed == failing, (sorted(failing - listed), sorted(listed - failing))
    order = [e["group"] for e in data if "group" in e]
    assert order[:3] == ["worker_crashed", "verification_failed", "load_failed"], order


def test_failures_table_shows_each_verdict_group_with_an_example(
    failing_db: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["failures", "--db", str(failing_db)], monkeypatch, capsys)
    assert code == 0, err
    print(out, err)
    assert "failing without a fingerprint" in out, out
    for verdict, example in (("worker_crashed", "org/oom: why org/oom"),
                             ("verification_failed", "org/drift: why org/drift")):  # fmt: skip
        line = next((row for row in out.splitlines() if verdict in row), "")
        assert example in line, (verdict, line)
    assert "9 failing models without a fingerprint" in err, err
    assert "f1" in out and "org/pow" in out, out
