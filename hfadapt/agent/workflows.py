"""Where failures come from: one model (diagnosed now), one fingerprint (found in recorded
runs), or the K fingerprints that block the most downloads across recorded sweeps. Each
becomes FailureCases with example inputs captured from the model on the CPU."""

from __future__ import annotations

import copy
import os
import tempfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine
from sqlmodel import select

from hfadapt import verdicts
from hfadapt.agent.cases import FailureCase, capture_calls, from_violation, function_entry
from hfadapt.agent.defect_cases import defect_cases
from hfadapt.agent.options import DraftOptions
from hfadapt.agent.records import Recorder
from hfadapt.db.census import FailureFingerprint
from hfadapt.errors import UsageError
from hfadapt.judge.options import JudgeOptions
from hfadapt.options import Execution, Mode

if TYPE_CHECKING:
    from hfadapt.agent.loop import DraftOutcome


def _odd_inputs(inputs: dict[str, Any]) -> dict[str, object]:
    """A smaller batch of odd length cut from the probes, so proofs also see odd sizes."""
    out: dict[str, Any] = {}
    for k, v in inputs.items():
        out[k] = v[:3, :13] if hasattr(v, "dim") and v.dim() >= 2 else v
    return out


def cases_for_model(
    model_ref: str | os.PathLike[str],
    judge: JudgeOptions,
    *,
    workdir: Path,
    db: Any = None,
    record: bool = True,
) -> tuple[Any, list[FailureCase]]:
    """Diagnose the model as ``judge`` says (recording the run) and make one case per
    violation fingerprint. ``judge.adapters`` False drafts against the stock model (no
    registry adapters anywhere); ``judge.without_adapters`` are left out (the rest apply), in
    the diagnosis and in every proof on the model."""
    from hfadapt.agent.models import remember
    from hfadapt.judge.diagnose import diagnose
    from hfadapt.loading.loader import load_model
    from hfadapt.loading.probes import build_probes, model_inputs

    structural = judge.structural
    execution, profile, adapters = judge.execution, judge.profile, judge.adapters
    loaded = load_model(model_ref, judge.mode)
    if hasattr(loaded.config, "use_cache"):
        loaded.config.use_cache = False
    batch = build_probes(loaded)
    spec = {"ref": os.fspath(model_ref), "structural": structural}
    # the parent proves drafts on this very model: kept (a copy, before judging converts it)
    remember(spec, loaded.model, model_inputs(loaded.model, batch), batch.attention_mask)
    diag = diagnose(
        loaded,
        mode=judge.mode,
        dtype=judge.dtype_name,
        execution=execution,
        profile=profile,
        db=db,
        record=record,
        adapters=adapters,
        without_adapters=judge.without_adapters,
        localize_failures=judge.localize,
    )
    report = getattr(diag, "report", None)
    silent = report is not None and report.ok and diag.verdict == verdicts.VERIFICATION_FAILED
    if report is None or (report.ok and not (silent and diag.evidence.get("defects"))):
        return diag, []
    from hfadapt.agent.models import case_model

    stock = case_model(spec)
    inputs = stock.inputs
    cases: list[FailureCase] = []
    if silent:  # no violation: the device defects that fired are the failures
        return diag, _defect_cases(diag, stock, spec, judge, workdir)
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
        case.without_adapters = list(judge.without_adapters)
        if case.kind == "function" and case.target and v.location is not None:
            entry = function_entry(stock.model, inputs, v.location.file, v.location.function)
            case.evidence["failing_function"] = case.target
            case.target, case.call_site = entry if entry else (None, None)
        _capture_examples(case, stock.model, inputs, workdir)
        cases.append(case)
    return diag, cases


def _defect_cases(
    diag: Any, stock: Any, spec: dict[str, Any], judge: JudgeOptions, workdir: Path
) -> list[FailureCase]:
    """A case per silent device defect that fired (hfadapt.agent.defect_cases), its example
    calls captured as the device run makes them: with the case's other adapters (a host-built
    token_type_ids is a tensor where the stock call passes None)."""
    from hfadapt.agent.graph_proof import case_registry

    base = {"model": spec, "execution": judge.execution, "profile": judge.profile}
    found = defect_cases(
        diag.evidence,
        stock.model,
        divergence=getattr(diag, "divergence", None),
        base=base,
    )
    for case in found:
        case.evidence.update(model=diag.model_id, verdict=diag.verdict, reason=diag.reason)
        case.registry = "default" if judge.adapters else "none"
        case.without_adapters = list(judge.without_adapters)
        adapted = copy.deepcopy(stock.model)
        case_registry(case, None).apply(adapted)
        _capture_examples(case, adapted, stock.inputs, workdir)
    return found


def _capture_examples(case: FailureCase, model: Any, inputs: Any, workdir: Path) -> None:
    """The target's calls in the stock model on the CPU (an odd-sized cut of the probes, then
    the probes), saved for the equivalence proof as the case's example file."""
    if not case.target:
        return
    path = workdir / f"{case.fingerprint}.pt"
    try:
        if capture_calls(model, [_odd_inputs(inputs), inputs], case.target, path=path):
            case.example_file = str(path)
    except Exception as exc:  # no captured inputs: the draft's own example is used
        case.evidence["capture_error"] = f"{type(exc).__name__}: {exc}"[:300]


def top_fingerprints(engine: Engine, k: int | None) -> list[FailureFingerprint]:
    """The K fingerprints blocking the most downloads: the failure census of
    ``hfadapt failures`` (the newest sweep, or the latest run of every model)."""
    from hfadapt.db.census import failures

    ranked = failures(engine, top=k)
    if not ranked:
        from hfadapt.db.engine import describe

        raise UsageError(
            f"no failure fingerprints recorded in {describe(engine)}: run a sweep (or "
            "'hfadapt diagnose MODEL') first, or draft for one model with 'hfadapt draft MODEL'"
        )
    return ranked


def models_for_fingerprint(engine: Engine, fingerprint: str) -> tuple[str, list[str]]:
    """(full fingerprint, models whose latest run has it, most downloaded first); a unique
    prefix is enough."""
    ranked = top_fingerprints(engine, None)
    hits = [b for b in ranked if b.fingerprint.startswith(fingerprint)]
    if not hits:
        raise UsageError(f"no recorded run has fingerprint {fingerprint!r}")
    if len({b.fingerprint for b in hits}) > 1:
        raise UsageError(
            f"fingerprint prefix {fingerprint!r} is ambiguous: {', '.join(b.fingerprint for b in hits[:5])}"
        )
    return hits[0].fingerprint, hits[0].models


def cases_by_model(entries: list[FailureFingerprint]) -> dict[str, list[str]]:
    """Which fingerprints to work on per model (each fingerprint on its first model)."""
    plan: dict[str, list[str]] = defaultdict(list)
    for e in entries:
        if e.models:
            plan[e.models[0]].append(e.fingerprint)
    return dict(plan)


@dataclass(frozen=True)
class DraftTarget:
    """One model to draft on: the fingerprints wanted there (None: every one it fails with
    now) and how it is judged to find them."""

    model: str
    fingerprints: list[str] | None
    judge: JudgeOptions


def plan_drafts(
    engine: Engine,
    judge: JudgeOptions,
    *,
    model: str | None = None,
    fingerprint: str | None = None,
    top: int | None = None,
    mode: Mode | None = None,
    execution: Execution | None = None,
) -> list[DraftTarget]:
    """What to draft for, from exactly one of ``model`` (diagnosed when drafting, as
    ``judge`` says), ``fingerprint`` (a recorded one, on its most downloaded model) or ``top``
    (the K fingerprints blocking the most downloads, each on its first model). A recorded
    fingerprint is looked for in the mode and execution its model's latest run had (so that it
    occurs again), or in ``mode`` and ``execution`` when they are given (a model diagnosed
    now: ``judge``'s, compiled by default as ``diagnose`` judges)."""
    if sum(x is not None for x in (model, fingerprint, top)) != 1:
        raise UsageError("give exactly one of model, fingerprint or top")
    if model is not None:
        how = judge.but(mode=mode or judge.mode, execution=execution or judge.execution)
        return [DraftTarget(model, None, how)]
    if top is not None:
        if top < 1:
            raise UsageError(f"top must be at least 1 (got {top})")
        wanted = cases_by_model(top_fingerprints(engine, top))
    else:
        assert fingerprint is not None
        full, models = models_for_fingerprint(engine, fingerprint)
        wanted = {models[0]: [full]}
    targets = []
    for ref, fingerprints in wanted.items():
        recorded = recorded_run(engine, ref)
        how = judge.but(mode=Mode.FULL)
        if recorded is not None:
            mode_then, execution_then, left_out_then = recorded
            how = judge.but(mode=mode_then, execution=execution_then)
            if not judge.without_adapters:  # what the recorded run left out, left out again
                how = how.but(without_adapters=left_out_then)
        if mode:
            how = how.but(mode=mode)
        if execution:
            how = how.but(execution=execution)
        targets.append(DraftTarget(ref, fingerprints, how))
    return targets


def draft_targets(
    targets: list[DraftTarget],
    client: Any,
    options: DraftOptions,
    *,
    recorder: Recorder,
    db: Engine,
    note: Callable[[str], None],
) -> list[DraftOutcome]:
    """Draft for every target's failures, in order; stops when the endpoint fails (the next
    failure would meet the same endpoint). ``note`` hears what is being done and skipped."""
    from hfadapt.agent.loop import ENDPOINT_ERROR, draft_adapter

    outcomes: list[DraftOutcome] = []
    with tempfile.TemporaryDirectory(prefix="hfadapt-draft-") as work:
        for target in targets:
            diag, cases = cases_for_model(target.model, target.judge, workdir=Path(work), db=db)
            cases, missing = wanted_cases(cases, target.fingerprints)
            if missing:
                note(
                    f"{target.model}: fingerprint(s) {', '.join(missing)} did not occur now "
                    f"({diag.verdict})"
                )
            if not cases:
                note(f"{target.model}: nothing to draft ({diag.verdict}: {diag.reason})")
                continue
            for case in cases:
                note(
                    f"drafting for {case.fingerprint} ({case.rule_id}, {case.op}) in "
                    f"{target.model} ..."
                )
                outcome = draft_adapter(
                    case, client, options, recorder=recorder, model_id=target.model
                )
                outcomes.append(outcome)
                if outcome.outcome == ENDPOINT_ERROR:
                    note(f"stopped: {outcome.reason}")
                    return outcomes
    return outcomes


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
