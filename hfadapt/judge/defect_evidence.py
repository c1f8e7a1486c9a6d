"""What a diagnosis records of the device defects that fired: the evidence entries, the
firings inside one module (localize), and the reason a structural run fails on a firing."""

from __future__ import annotations

from hfadapt.judge.diagnosis import Diagnosis
from hfadapt.judge.evidence_types import DefectEntry
from hfadapt.spyre.rules.lowering_report import LoweringReport

__all__ = ["defect_evidence", "defects_in", "structural_defect"]


def defect_evidence(report: LoweringReport) -> list[DefectEntry]:
    """The device defects that fired, one entry per defect: its id, source, effect, and the
    modules (with the ATen ops) where it fired."""
    out: dict[str, DefectEntry] = {}
    for f in report.defects:
        entry = out.setdefault(
            f.defect_id,
            {"defect_id": f.defect_id, "source": f.source, "effect": f.effect, "firings": []},
        )
        entry["firings"].append(
            {
                "module": f.module,
                "module_class": f.module_class,
                "op": f.op,
                "node": f.node,
                "shape": list(f.shape),
                "stride": list(f.stride),
                "dtype": f.dtype,
                "location": str(f.location) if f.location else None,
            }
        )
    return list(out.values())


def defects_in(report: LoweringReport, module: str) -> list[dict[str, object]]:
    """The firings inside ``module`` (or below it; "" is the whole model)."""
    return [
        {"defect_id": f.defect_id, "source": f.source, "module": f.module, "op": f.op}
        for f in report.defects
        if not module or f.module == module or f.module.startswith(module + ".")
    ]


def structural_defect(diag: Diagnosis, report: LoweringReport | None) -> str | None:
    """The reason a structural run fails when a device defect fired on the model's path (the
    first firing: defect, source, module), or None (a full run, or nothing fired)."""
    if not diag.structural or report is None or not report.defects:
        return None
    first = report.defects[0]
    where = first.module or "the model"
    others = len({f.defect_id for f in report.defects}) - 1
    more = f" (and {others} more defect(s))" if others > 0 else ""
    return (
        f"device defect {first.defect_id} fired in {where} ({first.op}){more}; source: "
        f"{first.source}. Seeded weights cannot show what it costs a trained model, so a "
        "structural run fails on it"
    )
