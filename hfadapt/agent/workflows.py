"""Where failures come from: one model (diagnosed now), one fingerprint (found in recorded
runs), or the K fingerprints that block the most downloads across recorded sweeps. Each
becomes FailureCases with example inputs captured from the model on the CPU."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import select

from hfadapt.agent.cases import FailureCase, capture_calls, from_violation
from hfadapt.errors import UsageError


@dataclass
class BlockingFingerprint:
    fingerprint: str
    downloads: int
    models: list[str] = field(default_factory=list)
    violation: dict[str, Any] = field(default_factory=dict)


def _odd_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """A smaller batch of odd length cut from the probes, so proofs also see odd sizes."""
    out: dict[str, Any] = {}
    for k, v in inputs.items():
        out[k] = v[:3, :13] if hasattr(v, "dim") and v.dim() >= 2 else v
    return out


def cases_for_model(
    model_ref: str | os.PathLike[str],
    *,
    workdir: Path,
    structural: bool = True,
    execution: str = "eager",
    profile: str | None = None,
    db: Any = None,
    record: bool = True,
    adapters: bool = True,
    without_adapters: tuple[str, ...] = (),
) -> tuple[Any, list[FailureCase]]:
    """Diagnose the model (recording the run) and make one case per violation fingerprint.
    ``adapters=False`` drafts against the stock model (no registry adapters anywhere);
    ``without_adapters`` leaves those registry adapters out (the rest apply), in the diagnosis
    and in every proof on the model."""
    from hfadapt.agent.models import remember
    from hfadapt.judge.diagnose import _load, build_probes, diagnose
    from hfadapt.judge.probes import model_inputs

    loaded = _load(model_ref, "structural" if structural else "full", False)
    if hasattr(loaded.config, "use_cache"):
        loaded.config.use_cache = False
    batch = build_probes(loaded)
    spec = {"ref": os.fspath(model_ref), "structural": structural}
    # the parent proves drafts on this very model: kept (a copy, before judging converts it)
    remember(spec, loaded.model, model_inputs(loaded.model, batch), batch.attention_mask)
    diag = diagnose(
        loaded,
        mode="structural" if structural else "full",
        execution=execution,
        profile=profile,
        db=db,
        record=record,
        adapters=adapters,
        without_adapters=without_adapters,
        localize_failures=False,
    )
    report = getattr(diag, "report", None)
    if report is None or report.ok:
        return diag, []
    from hfadapt.agent.models import case_model

    stock = case_model(spec)
    inputs = stock.inputs
    cases: list[FailureCase] = []
    seen: set[str] = set()
    for v in report.violations:
        fp = v.fingerprint()
        if fp in seen or v.kind == "model":
            continue  # config-level rules (alignment) have no code to rewrite
        seen.add(fp)
        case = from_violation(
            v,
            model=spec,
            execution=execution,
            profile=profile,
            evidence={"model": loaded.model_id, "verdict": diag.verdict},
        )
        case.registry = "default" if adapters else "none"
        case.without_adapters = list(without_adapters) if adapters else []
        if case.target:
            path = workdir / f"{fp}.pt"
            try:
                if capture_calls(
                    stock.model, [_odd_inputs(inputs), inputs], case.target, path=path
                ):
                    case.example_file = str(path)
            except Exception as exc:  # no captured inputs: the draft's own example is used
                case.evidence["capture_error"] = f"{type(exc).__name__}: {exc}"[:300]
        cases.append(case)
    return diag, cases


def top_fingerprints(engine: Engine, k: int) -> list[BlockingFingerprint]:
    """The K fingerprints whose models (latest run each) sum to the most downloads."""
    from hfadapt.db.engine import describe, session
    from hfadapt.db.tables import HubModel, Run

    with session(engine, write=False) as s:
        runs = list(s.exec(select(Run).order_by(Run.id)))  # type: ignore[arg-type]
        downloads = {m.id: m.downloads for m in s.exec(select(HubModel))}
    latest: dict[str, Any] = {}
    for run in runs:
        latest[run.model_id] = run  # later rows win
    blocked: dict[str, BlockingFingerprint] = {}
    for run in latest.values():
        for fp in run.fingerprints or []:
            entry = blocked.setdefault(str(fp), BlockingFingerprint(str(fp), 0))
            entry.downloads += int(downloads.get(run.model_id, 0) or 0)
            entry.models.append(run.model_id)
            if not entry.violation:
                entry.violation = next(
                    (
                        v
                        for v in run.violations or []
                        if isinstance(v, dict) and v.get("fingerprint") == fp
                    ),
                    {},
                )
    if not blocked:
        raise UsageError(
            f"no failure fingerprints recorded in {describe(engine)}: run a sweep (or "
            "'hfadapt diagnose MODEL') first, or draft for one model with 'hfadapt draft MODEL'"
        )
    for entry in blocked.values():
        entry.models.sort(key=lambda m: -int(downloads.get(m, 0) or 0))
    ranked = sorted(blocked.values(), key=lambda b: (-b.downloads, -len(b.models), b.fingerprint))
    return ranked[:k]


def models_for_fingerprint(engine: Engine, fingerprint: str) -> tuple[str, list[str]]:
    """(full fingerprint, models whose latest run has it, most downloaded first); a unique
    prefix is enough."""
    ranked = top_fingerprints(engine, 10**9)
    hits = [b for b in ranked if b.fingerprint.startswith(fingerprint)]
    if not hits:
        raise UsageError(f"no recorded run has fingerprint {fingerprint!r}")
    if len({b.fingerprint for b in hits}) > 1:
        raise UsageError(
            f"fingerprint prefix {fingerprint!r} is ambiguous: {', '.join(b.fingerprint for b in hits[:5])}"
        )
    return hits[0].fingerprint, hits[0].models


def cases_by_model(entries: list[BlockingFingerprint]) -> dict[str, list[str]]:
    """Which fingerprints to work on per model (each fingerprint on its first model)."""
    plan: dict[str, list[str]] = defaultdict(list)
    for e in entries:
        if e.models:
            plan[e.models[0]].append(e.fingerprint)
    return dict(plan)


def plan_drafts(
    engine: Engine,
    *,
    model: str | None = None,
    fingerprint: str | None = None,
    top: int | None = None,
) -> dict[str, list[str] | None]:
    """What to draft for: model -> the fingerprints wanted on it (None: every one it fails
    with now). From exactly one of ``model`` (diagnosed when drafting), ``fingerprint`` (a
    recorded one, on its most downloaded model) or ``top`` (the K fingerprints blocking the
    most downloads, each on its first model)."""
    if sum(x is not None for x in (model, fingerprint, top)) != 1:
        raise UsageError("give exactly one of model, fingerprint or top")
    if top is not None:
        if top < 1:
            raise UsageError(f"top must be at least 1 (got {top})")
        return dict(cases_by_model(top_fingerprints(engine, top)))
    if fingerprint is not None:
        full, models = models_for_fingerprint(engine, fingerprint)
        return {models[0]: [full]}
    assert model is not None
    return {model: None}


def recorded_run(engine: Engine, model_id: str) -> tuple[str, str, tuple[str, ...]] | None:
    """(mode, execution, adapters left out) of the model's latest recorded run: what a draft
    for its recorded fingerprints uses, so that they occur again (a structural sweep's need no
    weights; a fingerprint found without an adapter needs that adapter left out again)."""
    from hfadapt.db.engine import session
    from hfadapt.db.tables import Run

    with session(engine, write=False) as s:
        run = s.exec(
            select(Run).where(Run.model_id == model_id).order_by(Run.id.desc()).limit(1)  # type: ignore[union-attr]
        ).first()
    if run is None:
        return None
    evidence = run.evidence if isinstance(run.evidence, dict) else {}
    left_out = evidence.get("without_adapters") or ()
    names = tuple(str(n) for n in left_out) if isinstance(left_out, list) else ()
    return run.mode, run.execution, names


def wanted_cases(
    cases: list[FailureCase], wanted: list[str] | None
) -> tuple[list[FailureCase], list[str]]:
    """The cases whose fingerprint is wanted (every case for None), and the wanted
    fingerprints that did not occur among them."""
    if wanted is None:
        return cases, []
    kept = [c for c in cases if c.fingerprint in wanted]
    return kept, sorted(set(wanted) - {c.fingerprint for c in kept})
