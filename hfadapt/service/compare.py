"""What changed since the last completed cycle: the labels of hfadapt.report.diff (PASS, XFAIL,
FAIL, IMPROVED) over the models both sweeps judged, and beside them what a weekly reader asks
for: the regressions with their new reason, models new to the ranking (and which of those
fail), failure fingerprints not seen before, and the environment changes the two sweeps' runs
recorded (hfadapt.judge.environment, as ``hfadapt report --against`` shows them)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from hfadapt import verdicts
from hfadapt.db.census import ModelRun, scope_runs
from hfadapt.report.diff import FAIL, IMPROVED, diff_sweeps

__all__ = ["Change", "CycleComparison", "compare_sweeps"]


@dataclass
class Change:
    """One model whose verdict moved, or that is new to the ranking."""

    model_id: str
    before: str | None  # None: not in the baseline's ranking
    after: str
    reason: str = ""
    downloads: int = 0


@dataclass
class CycleComparison:
    baseline_sweep: int
    current_sweep: int
    counts: dict[str, int]  # PASS, XFAIL, FAIL, IMPROVED over the models both judged
    regressions: list[Change]  # passed in the baseline, fail now
    new_passes: list[Change]  # failed in the baseline, pass now
    new_models: list[Change]  # new to the ranking (any verdict)
    new_failures: list[Change]  # new to the ranking, and failing
    new_fingerprints: list[str]  # failure fingerprints no baseline run had
    dropped: int = 0  # models the baseline judged that are out of the ranking now
    environment_changes: list[str] = field(default_factory=list)  # "transformers 5.24.0 -> 5.25.0"
    environment_line: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _change(run: ModelRun, before: str | None) -> Change:
    return Change(run.model_id, before, run.verdict, run.reason, run.downloads)


def compare_sweeps(engine: Engine, current: int, baseline: int) -> CycleComparison:
    """The comparison of sweep ``current`` with sweep ``baseline`` (see module doc)."""
    _, now = scope_runs(engine, current)
    _, before = scope_runs(engine, baseline)
    diff = diff_sweeps(engine, current, baseline, runs=(now, before))  # each sweep read once
    old = {r.model_id: r for r in before}
    by_id = {r.model_id: r for r in now}
    moved = {FAIL: [], IMPROVED: []}  # type: dict[str, list[Change]]
    for row in diff.changed:
        moved[row.label].append(_change(by_id[row.model_id], row.before))
    new_models = [_change(r, None) for r in now if r.model_id not in old]
    new_models.sort(key=lambda c: (-c.downloads, c.model_id))
    seen = {f for r in before for f in r.fingerprints}
    fresh = {f for r in now if r.verdict != verdicts.PASS for f in r.fingerprints} - seen
    return CycleComparison(
        baseline_sweep=baseline,
        current_sweep=current,
        counts=diff.counts,
        regressions=moved[FAIL],
        new_passes=moved[IMPROVED],
        new_models=new_models,
        new_failures=[c for c in new_models if c.after != verdicts.PASS],
        new_fingerprints=sorted(fresh),
        dropped=diff.only_baseline,
        environment_changes=[str(c) for c in diff.environment_changes],
        environment_line=diff.environment_line(),
    )
