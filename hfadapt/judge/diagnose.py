"""Diagnose one model: load it (real weights, or structurally), run the CPU fp32 reference twice
(it must be deterministic), apply registry adapters, run the simulated Spyre device, judge the
numbers, localize a numeric failure to its first divergent module, and record one ``Run`` row
with the full evidence. ``diagnose`` is what ``hfadapt diagnose`` calls."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from hfadapt import verdicts
from hfadapt.errors import (
    CustomCodeError,
    HfadaptError,
    InputError,
    ModelNotFoundError,
    SpyreLoweringError,
    SpyreUnsupportedModelError,
    UsageError,
)
from hfadapt.hub.resolve import HubOptions
from hfadapt.judge.defect_evidence import defect_evidence, defects_in, structural_defect
from hfadapt.judge.diagnosis import (
    Diagnosis,
    Phases,
    device_warnings_recorded,
    next_step,
    report_of_error,
    versions_of,
    write_run,
)
from hfadapt.judge.evidence import level_of_source
from hfadapt.judge.load import LoadedModel
from hfadapt.judge.loader import load_model
from hfadapt.judge.localize import localize
from hfadapt.judge.metrics import compare, last_hidden, token_mask
from hfadapt.judge.probes import build_probes, model_inputs
from hfadapt.options import DType, Execution, Mode
from hfadapt.spyre.profile import AUTO_DTYPE

if TYPE_CHECKING:
    from hfadapt.adapters.registry import Registry

Runner = Callable[..., Any]

__all__ = [
    "Diagnosis",
    "apply_adapters",
    "build_probes",
    "check_adapter_names",
    "default_runner",
    "diagnose",
    "last_hidden",
    "load_model",
]


def default_runner() -> Runner:
    """The real device runner, imported on first use (it pulls in the simulated device)."""
    from hfadapt.spyre.runner import run_on_device

    return run_on_device


def apply_adapters(
    model: torch.nn.Module, without: Sequence[str] = (), registry: Registry | None = None
) -> tuple[list[str], list[str]]:
    """THE adapter hook point: apply every matching adapter of ``registry`` (default: the
    discovered one) to this model instance (the device copy only), except those named in
    ``without``. Returns (adapter names applied, adapter load errors); a broken adapter never
    stops a diagnosis."""
    from hfadapt.adapters.registry import default_registry

    chosen = registry if registry is not None else default_registry()
    try:
        handle = chosen.apply(model, exclude=tuple(without))
    except Exception as exc:
        return [], [
            f"adapters not applied: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        ]
    return list(handle.names), [f"{e.path}: {e.error}" for e in chosen.errors]


def _device_dtype(
    diag: Diagnosis, dtype: str | None, model_type: str | None, profile: str | None
) -> str:
    """The dtype the device runs this model in: the one asked for, or the profile's dtype for
    the model's family. Recorded on the diagnosis with the rule and source that chose it."""
    from hfadapt.spyre.profile import load_profile

    family, why = load_profile(profile).family_dtype(model_type)
    chosen = family if dtype in (None, AUTO_DTYPE) else str(dtype)
    diag.dtype = chosen
    diag.evidence["dtype_policy"] = {**why, "dtype": chosen, "overridden": chosen != family}
    return chosen


def _check_options(mode: str, dtype: str | None, execution: str) -> None:
    Mode.parse(mode, "mode")
    if dtype not in (None, AUTO_DTYPE):
        DType.parse(dtype, "dtype")
    Execution.parse(execution, "execution")


def check_adapter_names(names: Sequence[str], registry: Registry | None = None) -> tuple[str, ...]:
    """The adapter names of ``without_adapters``, each one the registry knows (UsageError for
    one it does not: a misspelt name would silently leave every adapter applied)."""
    wanted = tuple(dict.fromkeys(str(n).strip() for n in names))
    if not wanted:
        return ()
    from hfadapt.adapters.registry import default_registry

    known = {a.name for a in (registry if registry is not None else default_registry()).adapters}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UsageError(
            f"no adapter named {unknown[0]!r} (--without-adapter); see 'hfadapt adapters list'"
        )
    return wanted


def _reference(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        first = last_hidden(model(**inputs)).detach().clone()
        second = last_hidden(model(**inputs)).detach().clone()
    return first, second


def _not_deterministic(first: torch.Tensor, second: torch.Tensor) -> str | None:
    if (
        first.shape == second.shape
        and torch.equal(first.nan_to_num(), second.nan_to_num())
        and torch.equal(first.isnan(), second.isnan())
    ):
        return None
    if first.shape != second.shape:
        return f"two CPU fp32 runs gave shapes {tuple(first.shape)} and {tuple(second.shape)}"
    diff = float((first - second).abs().nan_to_num(nan=float("inf")).max())
    changed = int((first != second).sum())
    return (
        f"the CPU fp32 reference is not deterministic: two identical runs differ in {changed} values "
        f"(max |diff| {diff:.4g}); dropout left on, or a nondeterministic op"
    )


def _worst_rows(metrics: Any, mask: torch.Tensor) -> list[int]:
    """The probe rows to replay when localizing: the worst sentence, and the most padded one."""
    rows = [int(metrics.worst_token[0])] if metrics.worst_token else []
    rows.append(int(mask.sum(dim=1).argmin()))
    return sorted(set(rows))


def diagnose(
    model_ref: str | os.PathLike[str] | LoadedModel,
    *,
    mode: str = "full",
    dtype: str | None = None,
    execution: str = "compile",
    adapters: bool = True,
    without_adapters: Sequence[str] = (),
    trust_remote_code: bool = False,
    profile: str | None = None,
    db: Any = None,
    runner: Runner | None = None,
    record: bool = True,
    localize_failures: bool = True,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    local_files_only: bool = False,
    unsafe_no_isolation: bool = False,
    registry: Registry | None = None,
    config: dict[str, Any] | None = None,
    config_source: str | None = None,
) -> Diagnosis:
    """Judge one model on the simulated Spyre device and record the run (see module doc).

    ``model_ref``: a local folder, a Hub id (HF cache, or downloaded when the Hub is reachable),
    or an already loaded ``LoadedModel``. ``db``: a database URL/path or an Engine (default:
    ``$HFADAPT_DB`` or ./runs.db); ``record=False`` writes nothing. ``runner``: the device runner
    (default ``hfadapt.spyre.runner.run_on_device``). ``revision``, ``token``, ``cache_dir`` and
    ``local_files_only`` mean what they mean to ``from_pretrained``.

    ``execution``: "compile" (the default: hf-adapters judges on the card through
    torch.compile) or "eager". ``dtype``: fp16, bf16 or fp32; None (or "auto") takes the
    profile's dtype for the model's family (bf16 for Gemma and T5, fp16 otherwise), recorded
    with its source in the evidence ("dtype_policy"). ``without_adapters``: names of registry
    adapters to leave out (the rest apply), to see what an adapter buys; recorded in the
    evidence ("without_adapters"). ``registry``: the adapters to apply (default: the
    discovered registry, hfadapt.adapters.registry.default_registry()).

    ``config``: the model's config.json as a dict, judged structurally instead of a config
    hfadapt would find for ``model_ref`` (a Hub id, named in the run); ``config_source`` says
    where it came from, a source label such as ``structural:crawl`` (default
    ``structural:given``), which sets the run's evidence level.

    ``trust_remote_code=True``: the model's own code runs only in the OS sandbox: the whole
    judging happens in a sandboxed worker (:mod:`hfadapt.judge.sandboxed`) and comes back as
    validated data; IsolationUnavailableError (exit 2) where bubblewrap cannot isolate it,
    unless ``unsafe_no_isolation=True``. A custom ``runner``, ``registry`` or ``config`` cannot
    cross into the sandbox (UsageError).

    Raises UsageError for bad options, ModelNotFoundError when there is no model to judge, and
    ProfileError for an unknown profile; every other outcome is a verdict in the Diagnosis.
    """
    from hfadapt.spyre.profile import load_profile

    _check_options(mode, dtype, execution)
    if config is not None and mode != "structural":
        raise UsageError("config= builds a structural model: it needs mode='structural'")
    without = check_adapter_names(without_adapters, registry) if adapters else ()
    prof = load_profile(profile)
    # Open the database first: a read-only or corrupt --db fails before minutes of work.
    engine = _engine(db) if record else None
    hub = HubOptions(
        revision=revision,
        token=token,
        cache_dir=os.fspath(cache_dir) if cache_dir is not None else None,
        local_files_only=local_files_only,
    )
    try:
        if trust_remote_code and not isinstance(model_ref, LoadedModel):
            from hfadapt.judge import sandboxed

            if registry is not None or config is not None:
                raise UsageError(
                    "registry= and config= stay in this process: they cannot cross into the "
                    "sandbox that trust_remote_code=True judges in"
                )

            return sandboxed.judge_and_record(model_ref, engine, mode=mode, dtype=dtype, execution=execution,
                              adapters=adapters, profile=profile, runner=runner, hub=hub,
                              localize_failures=localize_failures, without_adapters=without,
                              unsafe_no_isolation=unsafe_no_isolation)  # fmt: skip
        return _diagnose(model_ref, prof, engine, mode=mode, dtype=dtype, execution=execution,
                         adapters=adapters, trust_remote_code=trust_remote_code, profile=profile,
                         runner=runner, localize_failures=localize_failures, hub=hub,
                         without_adapters=without, registry=registry,
                         config=config, config_source=config_source)  # fmt: skip
    finally:
        if engine is not None and engine is not db:
            engine.dispose()


def judge_here(
    model_ref: str, prof: Any, *, profile: str | None, hub: HubOptions, **options: Any
) -> Diagnosis:
    """Judge with the model's own code in THIS process, unrecorded: only the sandboxed worker
    (:mod:`hfadapt.judge.sandboxed`) calls it, inside the sandbox."""
    return _diagnose(model_ref, prof, None, trust_remote_code=True, profile=profile,
                     runner=None, hub=hub, **options)  # fmt: skip


def _engine(db: Any) -> Any:
    from sqlalchemy.engine import Engine

    from hfadapt.db import engine as store

    return db if isinstance(db, Engine) else store.get_engine(db)


def _diagnose(
    model_ref: str | os.PathLike[str] | LoadedModel,
    prof: Any,
    engine: Any,
    *,
    mode: str,
    dtype: str | None,
    execution: str,
    adapters: bool,
    trust_remote_code: bool,
    profile: str | None,
    runner: Runner | None,
    localize_failures: bool,
    hub: HubOptions | None = None,
    without_adapters: Sequence[str] = (),
    registry: Registry | None = None,
    config: dict[str, Any] | None = None,
    config_source: str | None = None,
) -> Diagnosis:
    phases = Phases()
    ref_name = model_ref.model_id if isinstance(model_ref, LoadedModel) else os.fspath(model_ref)
    diag = Diagnosis(
        model_id=ref_name,
        verdict=verdicts.LOAD_FAILED,
        reason="",
        mode=mode,
        execution=execution,
        dtype=dtype if dtype not in (None, AUTO_DTYPE) else prof.family_dtype(None)[0],
        structural=mode == "structural",
        versions=versions_of(prof),
        profile_name=prof.name,
        profile_version=prof.version,
        timings=phases.seconds,
    )

    verdict, reason, error = _judge(
        diag, phases, model_ref, mode=mode, dtype=dtype, execution=execution, adapters=adapters,
        trust_remote_code=trust_remote_code, profile=profile, runner=runner, localize_failures=localize_failures,
        hub=hub, without_adapters=tuple(without_adapters), registry=registry, config=config,
        config_source=config_source,
    )  # fmt: skip
    diag.verdict = verdict
    diag.reason = ("[structural] " if diag.structural else "") + reason
    if error is not None:
        diag.error = type(error).__name__
        diag.exit_code = 2 if isinstance(error, InputError) else 1
    else:
        diag.exit_code = 0 if verdict == verdicts.PASS else 1
    diag.next_step = next_step(diag)
    diag.finished()
    if engine is not None:
        with phases("store"):
            diag.run_id = write_run(diag, engine)
    return diag


Outcome = tuple[str, str, BaseException | None]  # verdict, reason, the error that decided it


def _one_line(exc: BaseException, limit: int = 300) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"


def _judge(
    diag: Diagnosis,
    phases: Phases,
    model_ref: str | os.PathLike[str] | LoadedModel,
    *,
    mode: str,
    dtype: str | None,
    execution: str,
    adapters: bool,
    trust_remote_code: bool,
    profile: str | None,
    runner: Runner | None,
    localize_failures: bool,
    hub: HubOptions | None = None,
    without_adapters: tuple[str, ...] = (),
    registry: Registry | None = None,
    config: dict[str, Any] | None = None,
    config_source: str | None = None,
) -> Outcome:
    """The phases of a diagnosis, each timed; the first that decides the verdict returns it."""
    with phases("load"):
        try:
            loaded = load_model(
                model_ref, mode, trust_remote_code=trust_remote_code, hub=hub, config=config,
                config_source=config_source,
            )  # fmt: skip
        except ModelNotFoundError:
            raise
        except CustomCodeError as exc:
            return verdicts.CUSTOM_CODE, exc.one_line(), exc
        except HfadaptError as exc:
            return verdicts.LOAD_FAILED, exc.one_line(), exc
        except Exception as exc:  # transformers raising on a model it cannot build
            return verdicts.LOAD_FAILED, _one_line(exc), exc
    diag.model_id = loaded.model_id
    diag.structural = loaded.structural or mode == "structural"
    diag.mode = "structural" if diag.structural else "full"
    diag.model_type = loaded.model_type
    diag.revision = loaded.revision
    diag.config_source = loaded.source
    level = level_of_source(loaded.source)
    diag.evidence_level = level.value if level is not None else None
    dtype = _device_dtype(diag, dtype, loaded.model_type, profile)
    diag.evidence.update(
        source=loaded.source, notes=list(loaded.notes), pooling=loaded.pooling.describe()
    )
    if loaded.path is not None:  # a config held in memory has no folder
        diag.evidence["path"] = loaded.path
    if loaded.translated_from:
        diag.evidence["translated_from"] = loaded.translated_from
    diag.set_signature(loaded)
    model, config = loaded.model, loaded.config
    if hasattr(config, "use_cache"):
        config.use_cache = False  # decoder embedding models: no KV cache in one forward

    with phases("probes"):
        try:
            batch = build_probes(loaded)
            inputs = model_inputs(model, batch)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # e.g. a composite (vision + text) config with no usable vocab_size: no text probe
            return verdicts.LOAD_FAILED, f"no probe inputs for this model: {_one_line(exc)}", None
        mask = batch.attention_mask.bool()
    diag.evidence["probes"] = batch.describe()

    with phases("reference"):
        try:
            reference, again = _reference(model, inputs)
        except Exception as exc:
            return (
                verdicts.REFERENCE_FAILED,
                f"the CPU fp32 reference raised {_one_line(exc)}",
                None,
            )
    problem = _not_deterministic(reference, again)
    mask = token_mask(reference, mask)  # one vector per sequence (DPR): one "token" each
    if problem is None and not bool(torch.isfinite(reference[mask]).all()):
        problem = "the CPU fp32 reference itself holds NaN or inf on real tokens"
    if problem:
        return verdicts.REFERENCE_FAILED, problem, None

    with phases("adapters"):
        device_model = copy.deepcopy(model)
        prepare = partial(apply_adapters, without=without_adapters, registry=registry)
        applied, adapter_errors = prepare(device_model) if adapters else ([], [])
    diag.adapters = applied
    if without_adapters:
        diag.evidence["without_adapters"] = list(without_adapters)
    if adapter_errors:
        diag.evidence["adapter_errors"] = adapter_errors

    run_device = runner or default_runner()
    torch_dtype = getattr(torch, DType.parse(dtype, "dtype").torch_name)
    with phases("device"), device_warnings_recorded(diag):
        try:
            run = run_device(
                device_model,
                inputs,
                execution=execution,
                dtype=torch_dtype,
                profile=profile,
                collect=True,
            )
        except SpyreUnsupportedModelError as exc:
            diag.evidence["rule_id"] = exc.rule_id
            return verdicts.UNSUPPORTED_MODEL, exc.one_line(), None
        except SpyreLoweringError as exc:
            diag.report = exc.report or report_of_error(exc, diag)
            return verdicts.LOWERING_FAILED, exc.one_line(), None
        except (
            NotImplementedError
        ) as exc:  # an eager op the device cannot run, raised as torch-spyre does
            return verdicts.LOWERING_FAILED, " ".join(str(exc).split())[:300], None
        finally:
            del device_model
    diag.report = run.report
    if run.report is not None and run.report.defects:
        diag.evidence["defects"] = defect_evidence(run.report)
    diag.evidence["device_seconds"] = round(float(getattr(run, "seconds", 0.0) or 0.0), 4)
    if run.report is not None and not run.report.ok:
        return verdicts.LOWERING_FAILED, run.report.summary(), None

    with phases("metrics"):
        metrics = compare(reference, last_hidden(run.outputs), mask, loaded.pooling)
    diag.metrics = metrics
    # Random weights cannot be trusted to show how much a silent defect costs (a defect that
    # wrecks the real model can leave a random one at cosine 0.99): in a structural run a
    # firing on the model's path fails it, whatever the numbers say.
    fired = structural_defect(diag, run.report)
    if fired is None and metrics.passed:
        return verdicts.PASS, f"{metrics.summary()} (>= {metrics.threshold})", None

    if localize_failures:
        # a device defect exists only in compiled graphs: replay compiled to see it
        replay = execution if diag.evidence.get("defects") else "eager"
        diag.evidence["localize_execution"] = replay
        with phases("localize"), device_warnings_recorded(diag):
            try:
                diag.divergence = localize(
                    model,
                    inputs,
                    runner=run_device,
                    dtype=torch_dtype,
                    profile=profile,
                    rows=_worst_rows(metrics, mask),
                    prepare=prepare if adapters else None,
                    execution=replay,
                )
                if diag.divergence is not None and run.report is not None:
                    diag.divergence.defects = defects_in(run.report, diag.divergence.module)
            except Exception as exc:  # localizing is evidence, never a reason to lose the verdict
                diag.evidence["localize_error"] = _one_line(exc)
    return verdicts.VERIFICATION_FAILED, fired or metrics.failure(), None
