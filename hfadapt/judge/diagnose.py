"""Diagnose one model: load it (real weights, or structurally), run the CPU fp32 reference twice
(it must be deterministic), apply registry adapters, run the simulated Spyre device, judge the
numbers, localize a numeric failure to its first divergent module, and record one ``Run`` row
with the full evidence. ``diagnose`` is what ``hfadapt diagnose`` calls; the phases are in
:mod:`hfadapt.judge.phases`."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hfadapt import verdicts
from hfadapt.errors import InputError, UsageError, did_you_mean
from hfadapt.hub.resolve import HubOptions
from hfadapt.judge import phases as judging
from hfadapt.judge.diagnosis import Diagnosis, Phases, next_step, versions_of, write_run
from hfadapt.judge.metrics import last_hidden
from hfadapt.judge.options import JudgeOptions, dtype_option
from hfadapt.judge.phases import Runner, apply_adapters, default_runner
from hfadapt.loading.load import LoadedModel
from hfadapt.loading.loader import load_model
from hfadapt.loading.probes import build_probes
from hfadapt.options import DType, Execution, Mode
from hfadapt.spyre.numerics.host_state import pinned

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from hfadapt.adapters.registry import Registry
    from hfadapt.spyre.rules.profile import Profile

__all__ = [
    "Diagnosis",
    "apply_adapters",
    "build_probes",
    "check_adapter_names",
    "default_runner",
    "diagnose",
    "judge_here",
    "last_hidden",
    "load_model",
]


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
        hint = did_you_mean(unknown[0], known)
        raise UsageError(
            f"no adapter named {unknown[0]!r} (--without-adapter){hint}; "
            "see 'hfadapt adapters list'"
        )
    return wanted


@dataclasses.dataclass(frozen=True)
class _RunInputs:
    """What a run takes besides its options: the device runner, the adapters to apply, a given
    config.json (structural) with its source label, and which caches it may use."""

    runner: Runner | None = None
    registry: Registry | None = None
    config: dict[str, Any] | None = None
    config_source: str | None = None
    reuse_reference: bool = False
    caches: bool = True


def diagnose(
    model_ref: str | os.PathLike[str] | LoadedModel,
    *,
    mode: Mode | str = Mode.FULL,
    dtype: DType | str | None = None,
    execution: Execution | str = Execution.COMPILE,
    adapters: bool = True,
    without_adapters: Sequence[str] = (),
    trust_remote_code: bool = False,
    profile: str | None = None,
    db: str | Engine | None = None,
    runner: Runner | None = None,
    record: bool = True,
    localize_failures: bool = True,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    local_files_only: bool = False,
    unsafe_no_isolation: bool = False,
    registry: Registry | None = None,
    config: dict[str, object] | None = None,
    config_source: str | None = None,
    reuse_reference: bool = True,
    caches: bool = True,
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

    ``reuse_reference``: read and write the CPU reference cache
    (:mod:`hfadapt.judge.reference_cache`; ``HFADAPT_REFERENCE_CACHE=0`` turns it off
    everywhere); a sweep passes False. ``caches=False``: this run skips it and the compile
    cache too (``--no-cache``). The run's evidence says what each cache gave ("caches").

    ``trust_remote_code=True``: the model's own code runs only in the OS sandbox: the whole
    judging happens in a sandboxed worker (:mod:`hfadapt.judge.sandboxed`) and comes back as
    validated data; IsolationUnavailableError (exit 2) where bubblewrap cannot isolate it,
    unless ``unsafe_no_isolation=True``. A custom ``runner``, ``registry`` or ``config`` cannot
    cross into the sandbox (UsageError).

    Raises UsageError for bad options, ModelNotFoundError when there is no model to judge, and
    ProfileError for an unknown profile; every other outcome is a verdict in the Diagnosis.
    """
    options = JudgeOptions(
        mode=Mode.parse(mode, "mode"),
        execution=Execution.parse(execution, "execution"),
        dtype=dtype_option(dtype),
        profile=profile,
        adapters=adapters,
        without_adapters=tuple(without_adapters),
        localize=localize_failures,
        trust_remote_code=trust_remote_code,
        unsafe_no_isolation=unsafe_no_isolation,
    )
    inputs = _RunInputs(runner, registry, config, config_source, reuse_reference, caches)
    options = _checked_options(options, inputs)
    path = os.fspath(cache_dir) if cache_dir is not None else None
    hub = HubOptions(revision, token, path, local_files_only)
    return _diagnose_and_record(model_ref, options, db, record=record, hub=hub, inputs=inputs)


def _checked_options(options: JudgeOptions, inputs: _RunInputs) -> JudgeOptions:
    """``options`` with its adapter names checked against the registry the run applies
    (UsageError for an unknown one, or for a config given to a judging that is not structural)."""
    if inputs.config is not None and not options.structural:
        raise UsageError("config= builds a structural model: it needs mode='structural'")
    without = check_adapter_names(options.without_adapters, inputs.registry)
    return options.but(without_adapters=without)


def _diagnose_and_record(
    model_ref: str | os.PathLike[str] | LoadedModel,
    options: JudgeOptions,
    db: str | Engine | None,
    *,
    record: bool,
    hub: HubOptions,
    inputs: _RunInputs,
) -> Diagnosis:
    from hfadapt.spyre.rules.profile import load_profile

    prof = load_profile(options.profile)
    # Open the database first: a read-only or corrupt --db fails before minutes of work.
    engine = _engine(db) if record else None
    try:
        if options.trust_remote_code and not isinstance(model_ref, LoadedModel):
            from hfadapt.judge import sandboxed

            if inputs.registry is not None or inputs.config is not None:
                raise UsageError(
                    "registry= and config= stay in this process: they cannot cross into the "
                    "sandbox that trust_remote_code=True judges in"
                )
            runner = inputs.runner
            return sandboxed.judge_and_record(model_ref, engine, options, runner=runner, hub=hub)
        return _diagnose(model_ref, options, prof, engine, hub=hub, inputs=inputs)
    finally:
        if engine is not None and engine is not db:
            engine.dispose()


def judge_here(model_ref: str, options: JudgeOptions, hub: HubOptions) -> Diagnosis:
    """Judge with the model's own code in THIS process, unrecorded: only the sandboxed worker
    (:mod:`hfadapt.judge.sandboxed`) calls it, inside the sandbox."""
    from hfadapt.spyre.rules.profile import load_profile

    trusted = options.but(trust_remote_code=True)
    return _diagnose(model_ref, trusted, load_profile(options.profile), None, hub=hub)


def _engine(db: str | Engine | None) -> Engine:
    from sqlalchemy.engine import Engine

    from hfadapt.db import engine as store

    return db if isinstance(db, Engine) else store.get_engine(db)


@pinned()  # exact float32 on the host, whatever the caller set (hfadapt.spyre.numerics.host_state)
def _diagnose(
    model_ref: str | os.PathLike[str] | LoadedModel,
    options: JudgeOptions,
    prof: Profile,
    engine: Engine | None,
    *,
    hub: HubOptions | None = None,
    inputs: _RunInputs = _RunInputs(),
) -> Diagnosis:
    phases = Phases()
    ref_name = model_ref.model_id if isinstance(model_ref, LoadedModel) else os.fspath(model_ref)
    diag = Diagnosis(
        model_id=ref_name,
        verdict=verdicts.LOAD_FAILED,
        reason="",
        mode=options.mode.value,
        execution=options.execution.value,
        dtype=options.dtype.value if options.dtype else prof.family_dtype(None)[0],
        structural=options.mode == Mode.STRUCTURAL,
        versions=versions_of(prof),
        profile_name=prof.name,
        profile_version=prof.version,
        timings=phases.seconds,
    )
    runner, registry = inputs.runner, inputs.registry
    state = judging.Judging(options, diag, phases, hub=hub, runner=runner, registry=registry)
    state.use_caches = inputs.caches
    if (
        inputs.reuse_reference and inputs.caches and not options.trust_remote_code
    ):  # own code: never
        from hfadapt.judge.reference_cache import default_cache

        state.reference_cache = default_cache()
    verdict, reason, error = judging.judge(state, model_ref, inputs.config, inputs.config_source)
    diag.versions = versions_of(prof)  # again: the numeric path the device took, not a guess
    diag.verdict = verdict
    diag.reason = ("[structural] " if diag.structural else "") + reason
    if error is not None:
        diag.error = type(error).__name__
        diag.exit_code = 2 if isinstance(error, InputError) else 1
    else:
        diag.exit_code = 0 if verdict == verdicts.PASS else 1
    if not options.adapters:  # the next step says to run with them first
        diag.evidence["no_adapters"] = True
    diag.next_step = next_step(diag)
    diag.finished()
    if engine is not None:
        with phases("store"):
            diag.run_id = write_run(diag, engine)
    return diag
