"""The Run rows of one unit of work: the representative's row with its full evidence (and
where it was judged), and one row per other member sharing its verdict and metrics and
pointing at it. A unit recorded by an earlier session of a resumed sweep lends its verdict the
same way."""

from __future__ import annotations

from typing import Any

from hfadapt.db.tables import utcnow
from hfadapt.judge.evidence import level_of_source
from hfadapt.judge.evidence_types import Evidence, SweepEvidence, read_evidence
from hfadapt.options import EvidenceLevel
from hfadapt.sweep.plan import Unit
from hfadapt.sweep.worker import Outcome

__all__ = ["SHARED", "member_rows", "unit_rows"]

# Columns a member's row shares with its representative's (the verdict and its evidence).
SHARED = (
    "verdict",
    "reason",
    "mode",
    "execution",
    "dtype",
    "min_token_cosine",
    "mean_token_cosine",
    "pooled_cosine",
    "max_abs_diff",
    "has_nan",
    "has_inf",
    "violations",
    "fallbacks",
    "adapters",
    "fingerprints",
    "divergence",
    "versions",
    "profile_version",
)


def _member_level(template: dict[str, object], source: str | None) -> str | None:
    """A member's evidence level: its *own* config's (never ``weights``: its weights did not
    run), once the representative's run got as far as loading (else unknown)."""
    if template.get("evidence_level") is None:
        return None
    level = level_of_source(source)
    if level is None:
        return None
    return EvidenceLevel.CONFIG.value if level == EvidenceLevel.WEIGHTS else level.value


def member_rows(
    unit: Unit,
    todo: list[str],
    template: dict[str, Any],
    rep: str,
    types: dict[str, Any],
    sources: dict[str, str | None] | None = None,
) -> list[dict[str, Any]]:
    """One row per member in ``todo``: the representative's verdict and metrics, the member's
    own evidence level and config source (``sources``: model id -> config source)."""
    sources = sources or {}
    shared = {k: template.get(k) for k in SHARED}
    sweep_ev: SweepEvidence = {
        "role": "member",
        "representative": rep,
        "unit": unit.key,
        "models": len(unit.members),
    }
    earlier = read_evidence(template.get("evidence")).get("sweep") or SweepEvidence()
    rep_run = earlier.get("representative_run") or (
        template.get("id") if earlier.get("role") == "representative" else None
    )
    if rep_run:
        sweep_ev["representative_run"] = rep_run
    now = utcnow()
    return [
        {
            **shared,
            "model_id": model_id,
            "model_type": types.get(model_id) or template.get("model_type"),
            "signature": unit.signature or template.get("signature"),
            "evidence_level": _member_level(template, sources.get(model_id)),
            "evidence": Evidence(sweep=sweep_ev.copy(), config_source=sources.get(model_id)),
            "started_at": now,
            "finished_at": now,
        }
        for model_id in todo
    ]


def unit_rows(
    unit: Unit,
    todo: list[str],
    out: Outcome,
    types: dict[str, Any],
    sources: dict[str, str | None] | None = None,
) -> list[dict[str, object]]:
    """The rows of a freshly judged unit: the representative first (full evidence), then
    every other member pointing at it."""
    rep = unit.representative
    row = dict(out.row)
    row.update(model_id=rep, representative=True)
    row.setdefault("verdict", out.verdict)
    row.setdefault("reason", out.reason)
    row["model_type"] = row.get("model_type") or types.get(rep)
    if unit.signature and not row.get("signature"):
        row["signature"] = unit.signature
    evidence = read_evidence(row.get("evidence"))
    if not evidence.get("config_source") and sources:
        evidence["config_source"] = sources.get(rep)  # as planned, when the run did not say
    sweep_ev: SweepEvidence = {
        "role": "representative",
        "representative": rep,
        "unit": unit.key,
        "models": len(unit.members),
        "worker_pid": out.pid,
        "seconds": out.seconds,
        "worker_peak_rss_mb": out.peak_rss_mb,
    }
    if out.node is not None:  # judged on a Ray cluster: which machine and node
        sweep_ev.update({"worker_host": out.host, "worker_node": out.node})
    if unit.signature and row.get("signature") and row["signature"] != unit.signature:
        sweep_ev["planned_signature"] = unit.signature
    evidence["sweep"] = sweep_ev
    row["evidence"] = evidence
    members = [m for m in todo if m != rep]
    return [row, *member_rows(unit, members, row, rep, types, sources)]
