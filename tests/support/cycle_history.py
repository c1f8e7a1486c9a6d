"""A small results database of three completed weekly cycles (tests/service's ``history_db``),
written through hfadapt's own tables and its cycle comparison (hfadapt.service.compare)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from hfadapt.db.engine import get_engine, session
from hfadapt.db.tables import DONE, Cycle, HubModel, Run, Sweep, utcnow
from hfadapt.service.compare import compare_sweeps

__all__ = ["FINGERPRINT", "HISTORY", "HOSTILE", "write_history"]

HOSTILE = "evil/<script>alert(1)</script>"
# model -> its verdict in cycles 1, 2, 3 (and downloads): org/alpha regresses in cycle 3,
# org/beta improves in cycle 2, org/delta fails throughout with one fingerprint
HISTORY = {
    "org/alpha": (("pass", "pass", "lowering_failed"), 9_000),
    "org/beta": (("lowering_failed", "pass", "pass"), 5_000),
    "org/gamma": (("pass", "pass", "pass"), 3_000),
    "org/delta": (("lowering_failed",) * 3, 2_000),
    HOSTILE: (("pass", "pass", "verification_failed"), 10),
}
FINGERPRINT = "f00dfeedf00d"


def _run(model: str, verdict: str, sweep_id: int) -> Run:
    failed = verdict != "pass"
    violation = {"fingerprint": FINGERPRINT, "rule_id": "dtype.cast", "op": "aten::_to_copy",
                 "message": "cast from int32 to bool on the device"}  # fmt: skip
    return Run(
        model_id=model, sweep_id=sweep_id, verdict=verdict, mode="structural",
        execution="compile", evidence_level="config",
        reason=f"[structural] {verdict} in sweep {sweep_id}" if failed else "min token cos 0.9999",
        fingerprints=[FINGERPRINT] if failed else [], violations=[violation] if failed else [],
        adapters=["gelu-exact-host"], finished_at=utcnow(),
    )  # fmt: skip


def write_history(path: Path) -> Path:
    """A new runs.db at ``path`` with three completed cycles over the models of HISTORY."""
    engine = get_engine(str(path))
    start = utcnow() - timedelta(weeks=3)
    with session(engine) as sess:
        for rank, (model, (_, downloads)) in enumerate(HISTORY.items(), 1):
            sess.add(HubModel(id=model, rank=rank, downloads=downloads, model_type="bert"))
    for number in range(3):
        with session(engine) as sess:
            counts: dict[str, int] = {}
            for _, (verdicts, _) in HISTORY.items():
                counts[verdicts[number]] = counts.get(verdicts[number], 0) + 1
            sweep = Sweep(key=f"s{number}", status=DONE, models=len(HISTORY), counts=counts,
                          finished_at=start + timedelta(weeks=number))  # fmt: skip
            sess.add(sweep)
            sess.flush()
            assert sweep.id is not None
            for model, (verdicts, _) in HISTORY.items():
                sess.add(_run(model, verdicts[number], sweep.id))
            sweep_id = sweep.id
        baseline = sweep_id - 1 if number else None
        summary = compare_sweeps(engine, sweep_id, baseline).to_dict() if baseline else None
        with session(engine) as sess:
            sess.add(Cycle(
                key="{}", status=DONE, sweep_id=sweep_id, baseline_sweep_id=baseline,
                baseline_cycle_id=number if number else None, summary=summary,
                regressions=len(summary["regressions"]) if summary else 0,
                finished_at=start + timedelta(weeks=number),
            ))  # fmt: skip
    engine.dispose()
    return path
