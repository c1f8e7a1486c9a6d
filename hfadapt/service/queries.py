"""What ``hfadapt serve`` answers, read from the results database as plain JSON-ready dicts:
one model's status (its latest run as ``hfadapt show`` prints it, hfadapt.report.card) with its
history across cycles, the recorded sweeps a page at a time, two sweeps' comparison
(hfadapt.service.compare), and the dashboard's series (coverage per cycle, the latest cycle's
regressions, failure fingerprints by downloads). Nothing here writes.

Stored JSON is read as it is: a value of the wrong type (an old, hand-edited or hostile row)
is shown as absent, never raised on."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlmodel import col

from hfadapt import verdicts
from hfadapt.db.census import census, get_sweep, scope_runs
from hfadapt.db.engine import describe, session
from hfadapt.db.tables import DONE, Cycle, CycleDraft, Run, Sweep
from hfadapt.errors import NotFoundError, UsageError
from hfadapt.judge.evidence import level_label
from hfadapt.report.card import model_card
from hfadapt.report.diff import label
from hfadapt.service.compare import compare_sweeps
from hfadapt.service.drafting import ACCEPTED

__all__ = ["MAX_PAGE", "Results"]

MAX_PAGE = 200  # rows of one page of a list
MAX_OFFSET = 10_000_000
FINGERPRINTS_SHOWN = 20


def _when(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _counts(value: object) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


def _changes(value: object) -> list[dict[str, Any]]:
    """The stored regressions of a cycle's summary (hfadapt.service.compare.Change dicts)."""
    rows = value if isinstance(value, list) else []
    out = []
    for row in rows:
        if not isinstance(row, dict) or not isinstance(row.get("model_id"), str):
            continue
        out.append(
            {
                "model_id": row["model_id"],
                "before": str(row.get("before") or ""),
                "after": str(row.get("after") or ""),
                "reason": str(row.get("reason") or ""),
                "downloads": row["downloads"] if isinstance(row.get("downloads"), int) else 0,
            }
        )
    return out


def check_page(limit: int, offset: int) -> None:
    """UsageError unless 1 <= limit <= MAX_PAGE and 0 <= offset <= MAX_OFFSET."""
    if not 1 <= limit <= MAX_PAGE:
        raise UsageError(f"limit must be between 1 and {MAX_PAGE} (got {limit})")
    if not 0 <= offset <= MAX_OFFSET:
        raise UsageError(f"offset must be between 0 and {MAX_OFFSET:,} (got {offset})")


@dataclass
class Results:
    """The read side of one results database (its engine must only read:
    hfadapt.service.database.open_results). A finished sweep never changes, so its failure
    census is computed once and kept."""

    engine: Engine
    _census: dict[int, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return describe(self.engine)

    # ---- one model ----

    def model(self, model_id: str) -> dict[str, Any]:
        """The model's latest run (verdict, evidence level, adapters, violations, next step:
        hfadapt.report.card) and ``history``, its verdict in each completed cycle that judged
        it, oldest first, each labelled against the one before (PASS, XFAIL, FAIL, IMPROVED).
        NotFoundError when no run of it is recorded."""
        card = model_card(self.engine, model_id)
        card["history"] = self.history(card["model_id"])
        card["regressed"] = bool(card["history"]) and card["history"][-1]["label"] == "FAIL"
        return card

    def history(self, model_id: str) -> list[dict[str, Any]]:
        stmt = (
            select(
                col(Cycle.id),
                col(Cycle.finished_at),
                col(Run.sweep_id),
                col(Run.id),
                col(Run.verdict),
                col(Run.evidence_level),
                col(Run.reason),
            )
            .join(Run, col(Run.sweep_id) == col(Cycle.sweep_id))
            .where(col(Run.model_id) == model_id, col(Cycle.status) == DONE)
            .order_by(col(Cycle.id))
        )
        out: list[dict[str, Any]] = []
        with session(self.engine, write=False) as sess:
            for cycle_id, finished, sweep_id, run_id, verdict, level, reason in sess.execute(stmt):
                before = out[-1]["verdict"] if out else None
                out.append(
                    {
                        "cycle": cycle_id,
                        "finished_at": _when(finished),
                        "sweep": sweep_id,
                        "run": run_id,
                        "verdict": verdict,
                        "evidence_level": level_label(level),
                        "reason": reason or "",
                        "label": label(before, verdict) if before is not None else None,
                    }
                )
        return out

    # ---- sweeps ----

    def sweeps(self, limit: int = 50, offset: int = 0) -> dict[str, object]:
        """One page of the recorded sweeps, newest first, each with the cycle that ran it."""
        check_page(limit, offset)
        page = select(Sweep).order_by(col(Sweep.id).desc()).limit(limit).offset(offset)
        with session(self.engine, write=False) as sess:
            total = sess.execute(select(func.count()).select_from(Sweep)).scalar_one()
            rows = list(sess.execute(page).scalars())
            ids = [r.id for r in rows]
            owners = dict(
                sess.execute(
                    select(col(Cycle.sweep_id), col(Cycle.id)).where(col(Cycle.sweep_id).in_(ids))
                ).all()
            )
        items = [
            {
                "id": r.id,
                "cycle": owners.get(r.id),
                "status": r.status,
                "mode": r.mode,
                "execution": r.execution,
                "top": r.top,
                "models": r.models,
                "counts": _counts(r.counts),
                "seconds": r.seconds,
                "started_at": _when(r.started_at),
                "finished_at": _when(r.finished_at),
            }
            for r in rows
        ]
        return {"total": total, "limit": limit, "offset": offset, "items": items}

    def diff(self, sweep_id: int, other: int) -> dict[str, object]:
        """Sweep ``sweep_id`` against the baseline ``other``, as a cycle compares them;
        NotFoundError naming a sweep that is not recorded."""
        for wanted in (sweep_id, other):
            if get_sweep(self.engine, wanted) is None:
                raise NotFoundError(f"no sweep {wanted} in {self.where}")
        return compare_sweeps(self.engine, sweep_id, other).to_dict()

    # ---- cycles ----

    def cycle_drafts(self, cycle_id: int, limit: int = 50, offset: int = 0) -> dict[str, object]:
        """What ``hfadapt cycle --draft`` recorded for cycle ``cycle_id`` (``cycle_draft``):
        the totals over all its rows (fingerprints tried, each outcome, attempts, tokens, the
        accepted adapters) and one page of the rows, most downloads blocked first.
        NotFoundError when the cycle is not recorded; a cycle that drafted nothing (no
        ``--draft``, or no new fingerprint) has no rows."""
        check_page(limit, offset)
        draft = col(CycleDraft.cycle_id) == cycle_id
        with session(self.engine, write=False) as sess:
            cycle = sess.get(Cycle, cycle_id)
            if cycle is None:
                raise NotFoundError(f"no cycle {cycle_id} in {self.where}")
            by_outcome = dict(
                sess.execute(
                    select(col(CycleDraft.outcome), func.count())
                    .where(draft)
                    .group_by(col(CycleDraft.outcome))
                ).all()
            )
            attempts, tokens_in, tokens_out = sess.execute(
                select(
                    func.coalesce(func.sum(CycleDraft.attempts), 0),
                    func.coalesce(func.sum(CycleDraft.tokens_in), 0),
                    func.coalesce(func.sum(CycleDraft.tokens_out), 0),
                ).where(draft)
            ).one()
            page = (
                select(CycleDraft)
                .where(draft)
                .order_by(col(CycleDraft.downloads).desc(), col(CycleDraft.fingerprint))
                .limit(limit)
                .offset(offset)
            )
            rows = list(sess.execute(page).scalars())
        outcomes = {str(k): int(v) for k, v in by_outcome.items()}
        items = [
            {
                "fingerprint": r.fingerprint,
                "model_id": r.model_id,
                "downloads": r.downloads,
                "outcome": r.outcome,
                "agent_outcome": r.agent_outcome,
                "reason": r.reason or "",
                "attempts": r.attempts,
                "tokens_in": r.tokens_in,
                "tokens_out": r.tokens_out,
                "seconds": r.seconds,
                "session_id": r.session_id,
                "adapter_path": r.adapter_path,
                "created_at": _when(r.created_at),
            }
            for r in rows
        ]
        return {
            "cycle": cycle_id,
            "status": cycle.status,
            "sweep": cycle.sweep_id,
            "fingerprints": sum(outcomes.values()),
            "outcomes": outcomes,
            "accepted": outcomes.get(ACCEPTED, 0),
            "attempts": int(attempts),
            "tokens": int(tokens_in) + int(tokens_out),
            "total": sum(outcomes.values()),
            "limit": limit,
            "offset": offset,
            "items": items,
        }

    # ---- cycles: the dashboard's series ----

    def coverage(self) -> list[dict[str, Any]]:
        """Each completed cycle, oldest first: when, its sweep, how many models passed of how
        many judged, and how many regressed against the cycle before."""
        stmt = (
            select(
                col(Cycle.id),
                col(Cycle.finished_at),
                col(Cycle.sweep_id),
                col(Cycle.regressions),
                col(Sweep.counts),
            )
            .join(Sweep, col(Sweep.id) == col(Cycle.sweep_id))
            .where(col(Cycle.status) == DONE)
            .order_by(col(Cycle.id))
        )
        out = []
        with session(self.engine, write=False) as sess:
            for cycle_id, finished, sweep_id, regressions, counts in sess.execute(stmt):
                tally = _counts(counts)
                judged = sum(tally.values())
                passed = tally.get(verdicts.PASS, 0)
                out.append(
                    {
                        "cycle": cycle_id,
                        "finished_at": _when(finished),
                        "sweep": sweep_id,
                        "models": judged,
                        "passed": passed,
                        "share": passed / judged if judged else 0.0,
                        "regressions": regressions,
                    }
                )
        return out

    def latest_cycle(self) -> dict[str, Any] | None:
        """The newest completed cycle: its sweep, baseline, regressions (most downloaded
        first, as the cycle recorded them) and the counts of its comparison; None when no
        cycle completed."""
        stmt = (
            select(Cycle)
            .where(col(Cycle.status) == DONE, col(Cycle.sweep_id).is_not(None))
            .order_by(col(Cycle.id).desc())
            .limit(1)
        )
        with session(self.engine, write=False) as sess:
            row = sess.execute(stmt).scalars().first()
        if row is None:
            return None
        summary = row.summary if isinstance(row.summary, dict) else {}
        regressions = sorted(
            _changes(summary.get("regressions")), key=lambda c: (-c["downloads"], c["model_id"])
        )
        env = summary.get("environment_line")
        return {
            "cycle": row.id,
            "sweep": row.sweep_id,
            "finished_at": _when(row.finished_at),
            "baseline_cycle": row.baseline_cycle_id,
            "baseline_sweep": row.baseline_sweep_id,
            "regressions": regressions,
            "counts": _counts(summary.get("counts")),
            "new_failures": len(_changes(summary.get("new_failures"))),
            "environment_line": env if isinstance(env, str) else "",
        }

    def fingerprints(self, sweep_id: int, top: int = FINGERPRINTS_SHOWN) -> list[dict[str, Any]]:
        """The failure fingerprints of sweep ``sweep_id`` by the downloads they block."""
        if sweep_id not in self._census:
            sweep, runs = scope_runs(self.engine, sweep_id)
            found = [
                {
                    "fingerprint": f.fingerprint,
                    "downloads": f.downloads,
                    "models": f.count,
                    "examples": f.models[:3],
                    "rule_id": f.rule_id,
                    "op": f.op,
                    "share": f.share,
                }
                for f in census(runs, top)
            ]
            if sweep is None or sweep.status != DONE:
                return found  # still changing: not kept
            self._census[sweep_id] = found
        return self._census[sweep_id]

    def counts(self) -> dict[str, object]:
        """What the health check reports: cycles completed, the newest one, sweeps, runs."""
        with session(self.engine, write=False) as sess:
            cycles = sess.execute(
                select(func.count(), func.max(Cycle.id)).where(col(Cycle.status) == DONE)
            ).one()
            sweeps = sess.execute(select(func.count()).select_from(Sweep)).scalar_one()
        return {"cycles": cycles[0], "latest_cycle": cycles[1], "sweeps": sweeps}
