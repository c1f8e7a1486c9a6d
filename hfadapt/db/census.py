"""The failure census, one read-only query of runs.db: which failure fingerprints block which
models, ranked by the downloads they block. ``failures`` is what ``hfadapt failures`` shows and
what ``hfadapt draft --top K`` works from; ``scope_runs`` picks the runs any report covers (a
sweep's, or the latest run of every model); ``get_sweep``, ``latest_sweep`` and
``list_sweeps`` read the recorded sweeps."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Table, select
from sqlalchemy.engine import Engine

from hfadapt import verdicts
from hfadapt.db.engine import describe, session
from hfadapt.db.tables import DONE, HubModel, Run, Sweep
from hfadapt.errors import NotFoundError
from hfadapt.options import EvidenceLevel

__all__ = [
    "BLOCKER_VERDICTS",
    "Blocker",
    "FailureFingerprint",
    "ModelRun",
    "blockers",
    "census",
    "failure_groups",
    "failures",
    "get_sweep",
    "latest_sweep",
    "list_sweeps",
    "resolve_sweep",
    "scope_runs",
    "unfingerprinted",
]

# Verdicts that block a model before any device rule is reached: listed beside the fingerprints.
BLOCKER_VERDICTS = (verdicts.CUSTOM_CODE, verdicts.LOAD_FAILED)
CONFIRMED_LEVELS = (EvidenceLevel.WEIGHTS.value, EvidenceLevel.CONFIG.value)


@dataclass
class ModelRun:
    """One model's run in the scope of a report, with what the crawl says about the model."""

    model_id: str
    verdict: str
    reason: str
    model_type: str
    downloads: int
    rank: int | None
    fingerprints: list[str]
    violations: list[dict[str, Any]]
    adapters: list[str]
    reference_supported: bool | None
    evidence_level: str | None = None  # weights | config | architecture; None = unknown
    run_id: int | None = None
    translated_from: str | None = None  # the family of a remote-code model judged natively
    # applied adapters whose own rule still fired in the code they rewrite (they did nothing)
    ineffective: list[str] = field(default_factory=list)
    next_step: str = ""  # what the run said to do next ("" when it recorded nothing)
    no_adapters: bool = False  # judged without the registry's adapters (--no-adapters)
    # the largest share of a verdict bound its numbers used (evidence["margin"]["share"],
    # hfadapt.judge.margin); None: recorded before margins, judged before numbers, or NaN/inf
    bound_used: float | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == verdicts.PASS

    @property
    def confirmed(self) -> bool:
        """A pass that rests on the model's own weights or config: what headlines count."""
        return self.passed and self.evidence_level in CONFIRMED_LEVELS


@dataclass
class FailureFingerprint:
    """One failure fingerprint and what it blocks (most downloaded models first)."""

    fingerprint: str
    downloads: int
    models: list[str] = field(default_factory=list)
    violation: dict[str, Any] = field(default_factory=dict)
    share: float = 0.0  # of the downloads of every model in scope

    @property
    def count(self) -> int:
        return len(self.models)

    @property
    def rule_id(self) -> str:
        return str(self.violation.get("rule_id", ""))

    @property
    def op(self) -> str:
        return str(self.violation.get("op", ""))

    @property
    def site(self) -> str:
        loc = self.violation.get("location") or {}
        if not isinstance(loc, dict) or not loc.get("file"):
            return ""
        parts = str(loc["file"]).replace("\\", "/").split("/")
        anchor = next(
            (i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")), None
        )
        path = "/".join(parts[anchor + 1 :] if anchor is not None else parts[-3:])
        return f"{path}:{loc.get('line', '?')} in {loc.get('function', '?')}"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(count=self.count, rule_id=self.rule_id, op=self.op, site=self.site)
        return data


def get_sweep(engine: Engine, sweep_id: int) -> Sweep | None:
    with session(engine, write=False) as sess:
        return sess.get(Sweep, sweep_id)


def list_sweeps(engine: Engine) -> list[Sweep]:
    """Every recorded sweep, newest first."""
    stmt = select(Sweep).order_by(Sweep.id.desc())  # type: ignore[union-attr]
    with session(engine, write=False) as sess:
        return list(sess.execute(stmt).scalars())


def latest_sweep(engine: Engine, *, finished: bool = False) -> Sweep | None:
    """The newest sweep (only finished ones when asked), or None."""
    stmt = select(Sweep).order_by(Sweep.id.desc()).limit(1)  # type: ignore[union-attr]
    if finished:
        stmt = stmt.where(Sweep.status == DONE)  # type: ignore[arg-type]
    with session(engine, write=False) as sess:
        return sess.execute(stmt).scalars().first()


def resolve_sweep(engine: Engine, sweep_id: int | None) -> Sweep | None:
    if sweep_id is None:
        return latest_sweep(engine)
    found = get_sweep(engine, sweep_id)
    if found is None:
        raise NotFoundError(f"no sweep {sweep_id} in {describe(engine)} (see `hfadapt sweeps`)")
    return found


def _list(value: Any) -> list[Any]:
    """A stored JSON list, or [] for anything else (an old, hand-edited or hostile row)."""
    return value if isinstance(value, list) else []


def _family(evidence: object) -> str | None:
    translated = evidence.get("translated_from") if isinstance(evidence, dict) else None
    family = translated.get("family") if isinstance(translated, dict) else None
    return family if isinstance(family, str) else None


def _recorded(evidence: object, key: str, default: object) -> Any:
    """One value of a run's evidence, of the default's type, or the default."""
    value = evidence.get(key) if isinstance(evidence, dict) else None
    return value if isinstance(value, type(default)) else default


def _bound_used(evidence: object) -> float | None:
    margin = evidence.get("margin") if isinstance(evidence, dict) else None
    share = margin.get("share") if isinstance(margin, dict) else None
    if not isinstance(share, (int, float)) or isinstance(share, bool):
        return None
    return float(share) if math.isfinite(share) and share >= 0 else None


def _ineffective(evidence: object) -> list[str]:
    found = evidence.get("adapters_ineffective") if isinstance(evidence, dict) else None
    names = [d.get("adapter") for d in _list(found) if isinstance(d, dict)]
    return [n for n in names if isinstance(n, str)]


def scope_runs(engine: Engine, sweep_id: int | None = None) -> tuple[Sweep | None, list[ModelRun]]:
    """The runs a report covers: those of ``sweep_id`` (default: the newest sweep), or, in a
    database without sweeps, the latest run of every model."""
    sweep = resolve_sweep(engine, sweep_id)
    run: Table = Run.__table__  # type: ignore[attr-defined]
    hub: Table = HubModel.__table__  # type: ignore[attr-defined]
    cols = [run.c.model_id, run.c.verdict, run.c.reason, run.c.model_type, run.c.fingerprints]
    cols += [run.c.violations, run.c.adapters, hub.c.downloads, hub.c.rank, hub.c.model_type]
    cols += [hub.c.reference_supported, run.c.evidence_level, run.c.id, run.c.evidence]
    stmt = select(*cols).select_from(run.outerjoin(hub, hub.c.id == run.c.model_id))
    if sweep is not None:
        stmt = stmt.where(run.c.sweep_id == sweep.id)
    latest: dict[str, ModelRun] = {}
    with session(engine, write=False) as sess:
        for r in sess.execute(stmt.order_by(run.c.id)):
            latest[r[0]] = ModelRun(
                model_id=r[0],
                verdict=r[1],
                reason=r[2] or "",
                model_type=r[3] or r[9] or "(none)",
                downloads=int(r[7] or 0),
                rank=r[8],
                fingerprints=[str(f) for f in _list(r[4])],
                violations=[v for v in _list(r[5]) if isinstance(v, dict)],
                adapters=[str(a) for a in _list(r[6])],
                reference_supported=r[10],
                evidence_level=r[11],
                run_id=r[12],
                translated_from=_family(r[13]),
                ineffective=_ineffective(r[13]),
                next_step=_recorded(r[13], "next_step", ""),
                no_adapters=_recorded(r[13], "no_adapters", False) is True,
                bound_used=_bound_used(r[13]),
            )
    return sweep, list(latest.values())


def census(runs: list[ModelRun], top: int | None = None) -> list[FailureFingerprint]:
    """Fingerprints of the failing runs, by downloads blocked, then models, then id."""
    total = sum(r.downloads for r in runs) or 1
    found: dict[str, FailureFingerprint] = {}
    for r in runs:
        if r.passed:
            continue
        for fp in dict.fromkeys(r.fingerprints):
            entry = found.setdefault(fp, FailureFingerprint(fp, 0))
            entry.downloads += r.downloads
            entry.models.append(r.model_id)
            if not entry.violation:
                entry.violation = next((v for v in r.violations if v.get("fingerprint") == fp), {})
    downloads = {r.model_id: r.downloads for r in runs}
    for entry in found.values():
        entry.models.sort(key=lambda m: (-downloads.get(m, 0), m))
        entry.share = entry.downloads / total
    ranked = sorted(found.values(), key=lambda f: (-f.downloads, -f.count, f.fingerprint))
    return ranked[:top] if top is not None else ranked


@dataclass
class Blocker:
    """A verdict that stops models before the device (custom_code, load_failed), with the
    models it blocks (most downloaded first) and their downloads."""

    verdict: str
    downloads: int = 0
    models: list[str] = field(default_factory=list)
    share: float = 0.0  # of the downloads of every model in scope
    example_reason: str = ""

    @property
    def count(self) -> int:
        return len(self.models)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["count"] = self.count
        return data


def blockers(runs: list[ModelRun]) -> list[Blocker]:
    """One group per blocking verdict present (custom_code, load_failed), by downloads."""
    total = sum(r.downloads for r in runs) or 1
    groups: dict[str, Blocker] = {}
    for r in sorted(runs, key=lambda r: (-r.downloads, r.model_id)):
        if r.verdict not in BLOCKER_VERDICTS:
            continue
        group = groups.setdefault(r.verdict, Blocker(r.verdict))
        group.downloads += r.downloads
        group.models.append(r.model_id)
        if not group.example_reason:
            group.example_reason = r.reason.removeprefix("[structural] ")[:200]
    for group in groups.values():
        group.share = group.downloads / total
    return sorted(groups.values(), key=lambda b: (-b.downloads, -b.count, b.verdict))


def failures(
    engine: Engine, *, sweep_id: int | None = None, top: int | None = None
) -> list[FailureFingerprint]:
    """The failure census of a sweep (default: the newest): what ``hfadapt failures`` shows and
    what ``hfadapt draft --top K`` works from. Each entry has the fingerprint, the models it
    blocks (most downloaded first), their downloads, and one violation dict as evidence."""
    _, runs = scope_runs(engine, sweep_id)
    return census(runs, top)


def unfingerprinted(runs: list[ModelRun]) -> list[Blocker]:
    """Every failing run that no fingerprint lists (custom_code, load_failed, worker_crashed,
    worker_timeout, verification_failed, reference_failed, unsupported_model, skipped, a
    lowering failure without one), one group per verdict, by downloads."""
    total = sum(r.downloads for r in runs) or 1
    groups: dict[str, Blocker] = {}
    for r in sorted(runs, key=lambda r: (-r.downloads, r.model_id)):
        if r.passed or r.fingerprints:
            continue
        group = groups.setdefault(r.verdict, Blocker(r.verdict))
        group.downloads += r.downloads
        group.models.append(r.model_id)
        if not group.example_reason:
            group.example_reason = r.reason.removeprefix("[structural] ")[:200]
    for group in groups.values():
        group.share = group.downloads / total
    return sorted(groups.values(), key=lambda b: (-b.downloads, -b.count, b.verdict))


def failure_groups(
    engine: Engine, *, sweep_id: int | None = None, top: int | None = None
) -> tuple[list[FailureFingerprint], list[Blocker]]:
    """The fingerprints (as ``failures``) and, beside them, every failing run no fingerprint
    lists, grouped by verdict (``unfingerprinted``): what ``hfadapt failures`` shows, so no
    failing row is hidden."""
    _, runs = scope_runs(engine, sweep_id)
    return census(runs, top), unfingerprinted(runs)
