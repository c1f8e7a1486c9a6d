"""The diff between two sweeps, labelled as PyTorch's benchmark harness labels accuracy
changes: PASS (passes in both), XFAIL (fails in both: an expected failure), FAIL (passed in
the baseline, fails now: a regression), IMPROVED (failed in the baseline, passes now). It says
when the two sweeps ran in different environments (package versions, the device's numeric
path): a verdict that moved may owe it to that, not to the model or an adapter."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sqlalchemy.engine import Engine

from hfadapt import verdicts
from hfadapt.db.census import ModelRun, scope_runs
from hfadapt.judge.environment import EnvChange, changes, describe_changes, unrecorded_keys
from hfadapt.sweep.store import sweep_environments

__all__ = [
    "FAIL",
    "IMPROVED",
    "LABELS",
    "PASS",
    "XFAIL",
    "DiffRow",
    "SweepDiff",
    "diff_sweeps",
    "label",
]

PASS, XFAIL, FAIL, IMPROVED = "PASS", "XFAIL", "FAIL", "IMPROVED"
LABELS = (PASS, XFAIL, FAIL, IMPROVED)


@dataclass
class DiffRow:
    model_id: str
    before: str
    after: str
    label: str
    downloads: int = 0


@dataclass
class SweepDiff:
    """This sweep against a baseline: one label per model both judged."""

    baseline: int
    current: int
    counts: dict[str, int]
    changed: list[DiffRow]  # FAIL and IMPROVED rows, most downloaded first
    only_current: int = 0
    only_baseline: int = 0
    # the environments the two sweeps' runs recorded (hfadapt.judge.environment): each key
    # whose values differ, baseline -> current, and the keys only one sweep recorded
    environment_changes: list[EnvChange] = field(default_factory=list)
    environment_unrecorded: list[str] = field(default_factory=list)
    environments: dict[str, int] = field(default_factory=dict)  # "baseline"/"current" -> distinct

    def environment_line(self) -> str:
        """``environments differ: transformers 5.24.0 -> 5.25.0, ...`` (baseline -> current),
        or "" when the two sweeps recorded the same environment (or one recorded none)."""
        parts = []
        if self.environment_changes:
            parts.append(
                f"environments differ (sweep {self.baseline} -> sweep {self.current}): "
                + describe_changes(self.environment_changes)
            )
        if self.environment_unrecorded:
            parts.append(
                "recorded by only one of the sweeps: " + ", ".join(self.environment_unrecorded)
            )
        return "; ".join(parts)


def label(before: str, after: str) -> str:
    """PyTorch benchmark-harness label of one model: PASS, XFAIL, FAIL (regressed), IMPROVED."""
    was, now = before == verdicts.PASS, after == verdicts.PASS
    if now:
        return PASS if was else IMPROVED
    return FAIL if was else XFAIL


def diff_sweeps(
    engine: Engine,
    current: int,
    baseline: int,
    runs: tuple[list[ModelRun], list[ModelRun]] | None = None,
) -> SweepDiff:
    """Label every model both sweeps judged; FAIL and IMPROVED rows listed. ``runs``: the two
    sweeps' model runs (current, baseline) when the caller has already read them."""
    if runs is None:
        runs = (scope_runs(engine, current)[1], scope_runs(engine, baseline)[1])
    now, before = runs
    old = {r.model_id: r for r in before}
    counts: Counter[str] = Counter({name: 0 for name in LABELS})
    changed: list[DiffRow] = []
    for r in now:
        prev = old.get(r.model_id)
        if prev is None:
            continue
        name = label(prev.verdict, r.verdict)
        counts[name] += 1
        if name in (FAIL, IMPROVED):
            changed.append(DiffRow(r.model_id, prev.verdict, r.verdict, name, r.downloads))
    changed.sort(key=lambda d: (d.label != FAIL, -d.downloads, d.model_id))
    shared = {r.model_id for r in now} & set(old)
    was, then = sweep_environments(engine, baseline), sweep_environments(engine, current)
    return SweepDiff(
        baseline=baseline,
        current=current,
        counts={name: counts[name] for name in LABELS},
        changed=changed,
        only_current=len(now) - len(shared),
        only_baseline=len(old) - len(shared),
        environment_changes=changes(was, then),
        environment_unrecorded=unrecorded_keys(was, then),
        environments={"baseline": len(was), "current": len(then)},
    )
