"""What a sweep found, as numbers: the failure census (fingerprints by the models and
downloads they block), pass rates by count and by downloads per model_type, cumulative
downloads covered against rank, each adapter's impact, agreement with hf-adapters'
``is_supported``, and the diff between two sweeps labelled as PyTorch's benchmark harness
labels accuracy changes (PASS, XFAIL, FAIL, IMPROVED). ``hfadapt.report.html`` draws it."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from hfadapt import verdicts
from hfadapt.db.census import (
    Blocker,
    FailureFingerprint,
    ModelRun,
    blockers,
    census,
    failures,
    resolve_sweep,
    scope_runs,
)
from hfadapt.db.engine import describe
from hfadapt.errors import UsageError
from hfadapt.report.charts import shorten
from hfadapt.report.diff import (
    FAIL,
    IMPROVED,
    LABELS,
    PASS,
    XFAIL,
    DiffRow,
    SweepDiff,
    diff_sweeps,
    label,
)
from hfadapt.report.models import LevelRow, ModelRow, by_evidence, model_rows
from hfadapt.sweep.store import Sweep

# The census and the diff live in their own modules; this one re-exports them for callers.
__all__ = [
    "FAIL",
    "IMPROVED",
    "LABELS",
    "PASS",
    "TYPE_COLUMNS",
    "XFAIL",
    "AdapterImpact",
    "Agreement",
    "DiffRow",
    "FailureFingerprint",
    "Report",
    "SweepDiff",
    "build_report",
    "diff_sweeps",
    "failures",
    "label",
    "scope_runs",
]

CHART_POINTS = 400  # the cumulative curve is sampled to this many ranks (every rank if fewer)


@dataclass
class Agreement:
    """Our verdict (pass or not) against hf-adapters' is_supported, over models that have it."""

    both_yes: int = 0
    both_no: int = 0
    only_ours: int = 0  # we pass, hf-adapters says unsupported
    only_theirs: int = 0  # hf-adapters says supported, we do not pass
    unknown: int = 0  # no is_supported value (not from the snapshot)
    only_ours_models: list[str] = field(default_factory=list)
    only_theirs_models: list[str] = field(default_factory=list)

    @property
    def compared(self) -> int:
        return self.both_yes + self.both_no + self.only_ours + self.only_theirs

    @property
    def rate(self) -> float:
        return (self.both_yes + self.both_no) / self.compared if self.compared else 0.0


@dataclass
class AdapterImpact:
    """One adapter in a report's scope. ``applied``: passing models whose run applied it.
    ``unblocked``: those of them that failed on the device (lowering or verification) in
    another recorded run of the same mode without this adapter: the adapter (with whatever
    else changed between the runs) is what made them pass. Applying is not unblocking: an
    adapter applies wherever its target class occurs, needed or not."""

    name: str
    applied: int = 0
    applied_downloads: int = 0
    unblocked: int = 0
    unblocked_downloads: int = 0


@dataclass
class TypeRow:
    """One model_type: ``passed`` counts passes on the models' own weights or config only;
    ``passed_architecture`` the passes that rest on the type's defaults (shapes unchecked)."""

    model_type: str
    models: int
    passed: int
    downloads: int
    passed_downloads: int
    passed_architecture: int = 0
    passed_unknown: int = 0
    passed_architecture_downloads: int = 0


# The headings of a TypeRow table, in the terminal and in the HTML report alike.
TYPE_COLUMNS = (
    "model_type",
    "models",
    "pass",
    "arch. pass",
    "pass rate",
    "downloads",
    "pass rate (downloads)",
)


@dataclass
class Report:
    """Everything ``hfadapt report`` shows (see module doc). ``passed`` and the pass rates
    count only passes on a model's own weights or config; passes that rest on the model type's
    defaults (``architecture``) or on nothing recorded (``unknown``) are counted beside them."""

    db: str
    sweep: dict[str, Any] | None
    models: int
    passed: int
    downloads: int
    passed_downloads: int
    verdicts: list[tuple[str, int, int]]  # verdict, models, downloads
    by_model_type: list[TypeRow]
    cumulative: list[tuple[int, float, float]]  # rank, share of downloads (all), (passing)
    fingerprints: list[FailureFingerprint]
    adapters: list[AdapterImpact]
    agreement: Agreement
    diff: SweepDiff | None = None
    # adapters recorded as applied without effect (their rule still fired in the code they
    # rewrite): adapter, models, downloads; most downloads first
    ineffective: list[tuple[str, int, int]] = field(default_factory=list)
    other_failures: list[tuple[str, str, int, int]] = field(default_factory=list)
    by_evidence: list[LevelRow] = field(default_factory=list)
    passed_architecture: int = 0
    passed_architecture_downloads: int = 0
    passed_unknown: int = 0
    passed_unknown_downloads: int = 0
    blockers: list[Blocker] = field(default_factory=list)
    model_rows: list[ModelRow] = field(default_factory=list)
    # remote-code models judged as their native translation: family, models, downloads, passed
    translated: list[tuple[str, int, int, int]] = field(default_factory=list)

    @property
    def pass_rate(self) -> float:
        return self.passed / self.models if self.models else 0.0

    @property
    def pass_rate_downloads(self) -> float:
        return self.passed_downloads / self.downloads if self.downloads else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fingerprints"] = [f.to_dict() for f in self.fingerprints]
        data["blockers"] = [b.to_dict() for b in self.blockers]
        data.update(pass_rate=self.pass_rate, pass_rate_downloads=self.pass_rate_downloads)
        data["agreement"].update(compared=self.agreement.compared, rate=self.agreement.rate)
        return data


# ---- the numbers -----------------------------------------------------------------------------


def _cumulative(runs: list[ModelRun]) -> list[tuple[int, float, float]]:
    ranked = sorted(runs, key=lambda r: (r.rank is None, r.rank or 0, -r.downloads))
    total = sum(r.downloads for r in ranked) or 1
    points: list[tuple[int, float, float]] = []
    n = len(ranked)
    keep = (
        {round(n ** (i / CHART_POINTS)) for i in range(CHART_POINTS + 1)}
        if n > CHART_POINTS
        else None
    )
    seen = passed = 0
    for i, r in enumerate(ranked, start=1):
        seen += r.downloads
        passed += r.downloads if r.confirmed else 0
        if keep is None or i in keep or i == n:
            points.append((i, seen / total, passed / total))
    return points


def _agreement(runs: list[ModelRun]) -> Agreement:
    agree = Agreement()
    ordered = sorted(runs, key=lambda r: (-r.downloads, r.model_id))
    for r in ordered:
        if r.reference_supported is None:
            agree.unknown += 1
        elif r.passed and r.reference_supported:
            agree.both_yes += 1
        elif not r.passed and not r.reference_supported:
            agree.both_no += 1
        elif r.passed:
            agree.only_ours += 1
            agree.only_ours_models.append(r.model_id)
        else:
            agree.only_theirs += 1
            agree.only_theirs_models.append(r.model_id)
    return agree


def _by_type(runs: list[ModelRun]) -> list[TypeRow]:
    rows: dict[str, TypeRow] = {}
    for r in runs:
        row = rows.setdefault(r.model_type, TypeRow(r.model_type, 0, 0, 0, 0))
        row.models += 1
        row.downloads += r.downloads
        if r.confirmed:
            row.passed += 1
            row.passed_downloads += r.downloads
        elif r.passed and r.evidence_level == "architecture":
            row.passed_architecture += 1
            row.passed_architecture_downloads += r.downloads
        elif r.passed:
            row.passed_unknown += 1
    return sorted(rows.values(), key=lambda t: (-t.models, -t.downloads, t.model_type))


# Failures an adapter can turn into a pass: the device refused or miscomputed the model.
DEVICE_FAILURES = (
    verdicts.LOWERING_FAILED,
    verdicts.VERIFICATION_FAILED,
    verdicts.UNSUPPORTED_MODEL,
)


def _adapters(engine: Engine, runs: list[ModelRun]) -> list[AdapterImpact]:
    """Per adapter: the passing models it was applied to, and the ones it unblocked (see
    AdapterImpact), with their downloads; most unblocked downloads first."""
    impact: dict[str, AdapterImpact] = {}
    passing = {r.model_id: r for r in runs if r.passed and r.adapters}
    without = _device_failures_elsewhere(engine, passing)
    for model_id, r in passing.items():
        for name in dict.fromkeys(r.adapters):
            row = impact.setdefault(name, AdapterImpact(name))
            row.applied += 1
            row.applied_downloads += r.downloads
            if any(name not in others for others in without.get(model_id, [])):
                row.unblocked += 1
                row.unblocked_downloads += r.downloads
    return sorted(
        impact.values(),
        key=lambda a: (-a.unblocked_downloads, -a.unblocked, -a.applied_downloads, a.name),
    )


def _ineffective(runs: list[ModelRun]) -> list[tuple[str, int, int]]:
    """Adapters runs recorded as applied without effect, with their models and downloads."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in runs:
        for name in dict.fromkeys(r.ineffective):
            counts[name][0] += 1
            counts[name][1] += r.downloads
    return sorted(((n, m, d) for n, (m, d) in counts.items()), key=lambda t: (-t[2], -t[1], t[0]))


def _device_failures_elsewhere(
    engine: Engine, passing: dict[str, ModelRun]
) -> dict[str, list[set[str]]]:
    """model id -> the adapter sets of its other runs that failed on the device, in the mode
    of its passing run."""
    from sqlalchemy import select

    from hfadapt.db.engine import session
    from hfadapt.db.tables import Run

    if not passing:
        return {}
    table = Run.__table__  # type: ignore[attr-defined]
    stmt = select(table.c.id, table.c.model_id, table.c.mode, table.c.verdict, table.c.adapters)
    ids = list(passing)
    rows: list[Any] = []
    with session(engine, write=False) as sess:
        for start in range(0, len(ids), 500):  # SQLite's bound-parameter limit
            rows += sess.execute(stmt.where(table.c.model_id.in_(ids[start : start + 500]))).all()
    modes = {row[0]: row[2] for row in rows}
    out: dict[str, list[set[str]]] = defaultdict(list)
    for run_id, model_id, mode, verdict, adapters in rows:
        here = passing[model_id]
        if run_id == here.run_id or verdict not in DEVICE_FAILURES:
            continue
        if mode != modes.get(here.run_id):
            continue
        names = adapters if isinstance(adapters, list) else []
        out[model_id].append({str(a) for a in names})
    return out


def _other_failures(runs: list[ModelRun], top: int = 15) -> list[tuple[str, str, int, int]]:
    """Failures without a fingerprint, grouped by verdict and the start of their reason."""
    groups: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for r in runs:
        if r.passed or r.fingerprints:
            continue
        reason = r.reason.removeprefix("[structural] ")
        if r.verdict == verdicts.CUSTOM_CODE:
            blocker = re.search(r"no native translation \(([^:]+): ([^:\s]+)", reason)
            what = ""
            if blocker:  # the field; for an unmapped class, the class too
                what = f"; not translated: {blocker.group(1)}"
                if blocker.group(1) in ("config_class", "auto_map.AutoConfig"):
                    what += f" {blocker.group(2)}"
            reason = "needs the repository's own code" + what
        key = (r.verdict, shorten(reason, 90))
        groups[key][0] += 1
        groups[key][1] += r.downloads
    ranked = sorted(groups.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))
    return [(v, reason, n, d) for (v, reason), (n, d) in ranked[:top]]


def _translated(runs: list[ModelRun]) -> list[tuple[str, int, int, int]]:
    """Per family: models judged as their native translation, their downloads, how many pass."""
    fams: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for r in runs:
        if r.translated_from:
            fams[r.translated_from][0] += 1
            fams[r.translated_from][1] += r.downloads
            fams[r.translated_from][2] += int(r.passed)
    return sorted(((f, *v) for f, v in fams.items()), key=lambda t: (-t[2], t[0]))  # type: ignore[misc]


def build_report(
    engine: Engine, *, sweep_id: int | None = None, against: int | None = None, top: int = 20
) -> Report:
    """The report of a sweep (default: the newest; without sweeps, every model's latest run),
    with a diff against sweep ``against`` when given."""
    sweep, runs = scope_runs(engine, sweep_id)
    if not runs:
        raise UsageError(f"no runs to report in {describe(engine)}: run `hfadapt sweep` first")
    per_verdict: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in runs:
        per_verdict[r.verdict][0] += 1
        per_verdict[r.verdict][1] += r.downloads
    diff = None
    if against is not None:
        if sweep is None or sweep.id is None:
            raise UsageError("against compares two sweeps; this database has none")
        if against == sweep.id:
            raise UsageError(
                f"against={against} is the sweep being reported: name another sweep to diff with"
            )
        resolve_sweep(engine, against)
        diff = diff_sweeps(engine, sweep.id, against)
    passed = [r for r in runs if r.confirmed]
    arch = [r for r in runs if r.passed and r.evidence_level == "architecture"]
    unknown = [
        r for r in runs if r.passed and not r.confirmed and r.evidence_level != "architecture"
    ]
    return Report(
        db=describe(engine),
        sweep=_sweep_info(sweep),
        models=len(runs),
        passed=len(passed),
        downloads=sum(r.downloads for r in runs),
        passed_downloads=sum(r.downloads for r in passed),
        verdicts=sorted(
            ((v, n, d) for v, (n, d) in per_verdict.items()), key=lambda t: (-t[1], t[0])
        ),
        by_model_type=_by_type(runs),
        cumulative=_cumulative(runs),
        fingerprints=census(runs, top),
        adapters=_adapters(engine, runs),
        ineffective=_ineffective(runs),
        agreement=_agreement(runs),
        diff=diff,
        other_failures=_other_failures(runs),
        by_evidence=by_evidence(runs),
        passed_architecture=len(arch),
        passed_architecture_downloads=sum(r.downloads for r in arch),
        passed_unknown=len(unknown),
        passed_unknown_downloads=sum(r.downloads for r in unknown),
        blockers=blockers(runs),
        model_rows=model_rows(runs),
        translated=_translated(runs),
    )


def _sweep_info(sweep: Sweep | None) -> dict[str, object] | None:
    if sweep is None:
        return None
    keys = (
        "id",
        "status",
        "mode",
        "execution",
        "dtype",
        "top",
        "model_type",
        "executor",
        "workers",
    )
    info: dict[str, Any] = {k: getattr(sweep, k) for k in keys}
    info.update(
        models=sweep.models,
        units=sweep.units,
        judged=sweep.judged,
        seconds=sweep.seconds,
        started_at=sweep.started_at.isoformat() if sweep.started_at else None,
        finished_at=sweep.finished_at.isoformat() if sweep.finished_at else None,
        profile=(sweep.options or {}).get("profile"),
    )
    return info
