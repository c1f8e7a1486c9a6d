"""The phases of one diagnosis, each timed and each one function, in order: load the model,
build the probes, run the CPU fp32 reference twice (it must be deterministic), apply the
adapters to a device copy, run the simulated device, judge the numbers, and localize a numeric
failure to its first divergent module. A phase either decides the verdict (it returns an
``Outcome``) or leaves what it found on the ``Judging`` for the next one. What the reference
and compile caches gave the run is recorded in its evidence (``caches``)."""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hfadapt import verdicts
from hfadapt.errors import (
    CustomCodeError,
    HfadaptError,
    HubUnreachableError,
    ModelNotFoundError,
    SpyreLoweringError,
    SpyreOpNotImplementedError,
    SpyreUnsupportedModelError,
    StandInTooLargeError,
)
from hfadapt.hub.resolve import HubOptions
from hfadapt.judge.adapter_effect import ineffective_adapters
from hfadapt.judge.defect_evidence import defect_evidence, defects_in, structural_defect
from hfadapt.judge.device_runner import DeviceResult, Runner, default_runner
from hfadapt.judge.diagnosis import Diagnosis, Phases, device_warnings_recorded, report_of_error
from hfadapt.judge.evidence import level_of_source
from hfadapt.judge.evidence_types import CachesEvidence
from hfadapt.judge.localize import localize
from hfadapt.judge.margin import margin_of
from hfadapt.judge.metrics import Metrics, compare, last_hidden, token_mask
from hfadapt.judge.options import JudgeOptions
from hfadapt.judge.pipeline_judging import (
    attach_heads,
    evidence_of,
    heads_for,
    judge_heads,
    pipeline_inputs,
    with_heads,
)
from hfadapt.judge.reference_cache import ReferenceCache, reference_key
from hfadapt.judge.task_judging import judge_each_task, task_adapters
from hfadapt.loading.heads import BuiltHeads
from hfadapt.loading.load import LoadedModel
from hfadapt.loading.loader import load_model
from hfadapt.loading.probes import build_probes, model_inputs

if TYPE_CHECKING:
    from hfadapt.adapters.registry import Registry

__all__ = ["Judging", "Outcome", "Runner", "apply_adapters", "default_runner", "judge"]

Outcome = tuple[str, str, BaseException | None]  # verdict, reason, the error that decided it

_PACKAGE = Path(__file__).resolve().parents[1]  # the hfadapt package's folder


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
        return [], [f"adapters not applied: {_one_line(exc, 200)}"]
    return list(handle.names), [f"{e.path}: {e.error}" for e in chosen.errors]


@dataclass
class Judging:
    """One diagnosis in progress: what was asked, and what each phase found so far."""

    options: JudgeOptions
    diag: Diagnosis
    phases: Phases
    hub: HubOptions | None = None
    runner: Runner | None = None
    registry: Registry | None = None
    loaded: LoadedModel | None = None
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    mask: torch.Tensor | None = None
    reference: torch.Tensor | None = None
    device_model: torch.nn.Module | None = None
    dtype: torch.dtype = torch.float16
    reference_cache: ReferenceCache | None = None  # None: the reference is always computed
    use_caches: bool = True  # False: neither cache is read or written (--no-cache)
    reference_use: str = "off"  # what the reference cache gave: off, unkeyed, hit:/miss:<key>
    heads: BuiltHeads | None = None  # the modules after the transformer (modules.json), built

    @property
    def model(self) -> LoadedModel:
        assert self.loaded is not None, "the load phase comes first"
        return self.loaded

    @property
    def real_tokens(self) -> torch.Tensor:
        assert self.mask is not None, "the probes phase comes first"
        return self.mask

    def prepare(self, model: torch.nn.Module) -> tuple[list[str], list[str]]:
        """Apply this diagnosis's adapters to ``model`` (the device copy, or a replay's)."""
        return apply_adapters(model, self.options.without_adapters, self.registry)


def _one_line(exc: BaseException, limit: int = 300) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:limit]}"


def judge(
    j: Judging,
    model_ref: str | os.PathLike[str] | LoadedModel,
    config: dict[str, object] | None = None,
    config_source: str | None = None,
) -> Outcome:
    """The phases in order; the first that decides the verdict returns it. The caches each
    run used go into its evidence: ``caches`` = {"reference": "off" | "unkeyed" |
    "hit:<key>" | "miss:<key>", "compile": "off" | {"hits", "misses", "stored": [<key>...],
    "unkeyed", "rejected"}} (keys by their first 12 hex digits), "skipped": true with
    ``use_caches`` False."""
    from hfadapt.spyre.compile import cache as compile_cache

    with compile_cache.skipped(not j.use_caches), compile_cache.recording() as used:
        try:
            return _phases(j, model_ref, config, config_source)
        finally:
            caches: CachesEvidence = {"reference": j.reference_use, "compile": used.to_dict()}
            if not j.use_caches:
                caches["skipped"] = True
            j.diag.evidence["caches"] = caches


def _phases(
    j: Judging,
    model_ref: str | os.PathLike[str] | LoadedModel,
    config: dict[str, object] | None,
    config_source: str | None,
) -> Outcome:
    """The phases themselves (see ``judge``)."""
    decided = load(j, model_ref, config, config_source) or probes(j)
    if decided is not None:
        return decided
    with j.phases("load"):
        lora, decided = task_adapters(j.diag, j.model)
    if decided is not None:
        return decided
    if lora is not None:  # jina v3's task LoRA: once per task (hfadapt.judge.task_judging)
        return judge_each_task(j.diag, j.model, lora, lambda loaded: _judged(j, loaded))
    return _judged(j, j.model)


def _judged(j: Judging, loaded: LoadedModel) -> Outcome:
    """The reference, adapters, device and numbers phases on ``loaded``."""
    j.loaded = loaded
    decided = reference(j)
    if decided is not None:
        return decided
    adapters(j)
    decided, run = device(j)
    if decided is not None:
        return decided
    assert run is not None, "a device phase that decided nothing returns its run"
    return numbers(j, run)


def load(
    j: Judging,
    model_ref: str | os.PathLike[str] | LoadedModel,
    config: dict[str, object] | None,
    config_source: str | None,
) -> Outcome | None:
    """Load the model (or build its structural stand-in) and record where it came from."""
    options = j.options
    with j.phases("load"):
        try:
            j.loaded = load_model(
                model_ref,
                options.mode,
                trust_remote_code=options.trust_remote_code,
                hub=j.hub,
                config=config,
                config_source=config_source,
            )
        except (ModelNotFoundError, HubUnreachableError):  # not the model's verdict: said, not kept
            raise
        except CustomCodeError as exc:
            return verdicts.CUSTOM_CODE, exc.one_line(), exc
        except StandInTooLargeError as exc:  # no stand-in fits the judge's memory budget
            return verdicts.SKIPPED, exc.one_line(), exc
        except HfadaptError as exc:
            return verdicts.LOAD_FAILED, exc.one_line(), exc
        except Exception as exc:  # transformers raising on a model it cannot build
            return verdicts.LOAD_FAILED, _one_line(exc), exc
    _describe_loaded(j)
    with j.phases("load"):  # the heads after the transformer: part of loading the model
        j.heads = heads_for(j.model)
    j.diag.evidence["pipeline"] = evidence_of(j.heads)
    return None


def _describe_loaded(j: Judging) -> None:
    """What the diagnosis records of the loaded model, and the device dtype it runs in."""
    diag, loaded = j.diag, j.model
    diag.model_id = loaded.model_id
    diag.structural = loaded.structural or j.options.structural
    diag.mode = "structural" if diag.structural else "full"
    diag.model_type = loaded.model_type
    diag.revision = loaded.revision
    diag.config_source = loaded.source
    level = level_of_source(loaded.source)
    diag.evidence_level = level.value if level is not None else None
    j.dtype = _device_dtype(diag, j.options, loaded.model_type)
    diag.evidence.update(
        {"source": loaded.source, "notes": list(loaded.notes), "pooling": loaded.pooling.describe()}
    )
    if loaded.path is not None:  # a config held in memory has no folder
        diag.evidence["path"] = loaded.path
    if loaded.translated_from:
        diag.evidence["translated_from"] = loaded.translated_from
    diag.set_signature(loaded)
    if hasattr(loaded.config, "use_cache"):
        loaded.config.use_cache = False  # decoder embedding models: no KV cache in one forward


def _device_dtype(diag: Diagnosis, options: JudgeOptions, model_type: str | None) -> torch.dtype:
    """The dtype the device runs this model in: the one asked for, or the profile's dtype for
    the model's family. Recorded on the diagnosis with the rule and source that chose it."""
    from hfadapt.options import DType
    from hfadapt.spyre.rules.profile import load_profile

    family, why = load_profile(options.profile).family_dtype(model_type)
    chosen = family if options.dtype is None else options.dtype.value
    diag.dtype = chosen
    diag.evidence["dtype_policy"] = {
        "rule": why["rule"],
        "dtype": chosen,
        "family": why["family"],
        "source": why["source"],
        "note": why["note"],
        "overridden": chosen != family,
    }  # Profile.family_dtype's reasons, with the dtype chosen
    dtype: torch.dtype = getattr(torch, DType.parse(chosen, "dtype").torch_name)
    return dtype


def probes(j: Judging) -> Outcome | None:
    """The probe batch, as the model's own inputs."""
    with j.phases("probes"):
        try:
            batch = build_probes(j.model)
            j.inputs = model_inputs(j.model.model, batch)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # e.g. a composite (vision + text) config with no usable vocab_size: no text probe
            return verdicts.LOAD_FAILED, f"no probe inputs for this model: {_one_line(exc)}", None
        j.mask = batch.attention_mask.bool()
    j.diag.evidence["probes"] = batch.describe()
    return None


def reference(j: Judging) -> Outcome | None:
    """The CPU fp32 reference, twice: it must be deterministic and finite on real tokens. With
    a reference cache, a reference an earlier run computed and checked from the same weights,
    config, code and inputs is read instead (hfadapt.judge.reference_cache)."""
    model = j.model.model
    cache, key, again = j.reference_cache, None, None
    with j.phases("reference"):
        if cache is not None:
            key = reference_key(model, j.inputs)
            j.reference_use = "unkeyed" if key is None else f"miss:{key[:12]}"
        first = cache.load(key) if cache is not None and key is not None else None
        if first is not None:
            j.diag.evidence["reference"] = f"from the reference cache (entry {str(key)[:12]})"
            j.reference_use = f"hit:{str(key)[:12]}"
        else:
            try:
                with torch.inference_mode():
                    first = last_hidden(model(**j.inputs)).detach().clone()
                    again = last_hidden(model(**j.inputs)).detach().clone()
            except Exception as exc:
                why = f"the CPU fp32 reference raised {_one_line(exc)}"
                return verdicts.REFERENCE_FAILED, why, None
    problem = _not_deterministic(first, again) if again is not None else None
    j.mask = token_mask(first, j.real_tokens)  # one vector per sequence (DPR): one "token" each
    if problem is None and not bool(torch.isfinite(first[j.mask]).all()):
        problem = "the CPU fp32 reference itself holds NaN or inf on real tokens"
    if problem:
        return verdicts.REFERENCE_FAILED, problem, None
    if cache is not None and key is not None and again is not None:
        cache.store(key, first)  # checked: deterministic and finite
    j.reference = first
    return None


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


def adapters(j: Judging) -> None:
    """A device copy of the model, with the adapters applied (never a reason to stop)."""
    diag, options = j.diag, j.options
    with j.phases("adapters"):
        j.device_model = attach_heads(copy.deepcopy(j.model.model), j.heads)
        applied, errors = j.prepare(j.device_model) if options.adapters else ([], [])
    diag.adapters = applied
    if options.without_adapters:
        diag.evidence["without_adapters"] = list(options.without_adapters)
    if errors:
        diag.evidence["adapter_errors"] = errors


def device(j: Judging) -> tuple[Outcome | None, DeviceResult | None]:
    """The device copy on the simulated device: (a verdict it decided, or None; the run)."""
    diag, options = j.diag, j.options
    run_device = j.runner = j.runner or default_runner()
    assert j.device_model is not None, "the adapters phase comes first"
    with j.phases("device"), device_warnings_recorded(diag):
        try:
            run = run_device(
                j.device_model,
                pipeline_inputs(j.inputs, j.heads, j.dtype),
                execution=options.execution.value,
                dtype=j.dtype,
                profile=options.profile,
                collect=True,
            )
        except SpyreUnsupportedModelError as exc:
            diag.evidence["rule_id"] = exc.rule_id
            return (verdicts.UNSUPPORTED_MODEL, exc.one_line(), None), None
        except SpyreLoweringError as exc:
            diag.report = exc.report or report_of_error(exc, diag)
            adapters_took_effect(j)
            return (verdicts.LOWERING_FAILED, exc.one_line(), None), None
        except NotImplementedError as exc:  # an eager op the device cannot run (torch-spyre's)
            if raised_by_hfadapt(exc):  # hfadapt's own limit: a bug to report, not the model's
                raise
            return (verdicts.LOWERING_FAILED, " ".join(str(exc).split())[:300], None), None
        finally:
            j.device_model = None
    diag.report = run.report
    adapters_took_effect(j)
    if run.report is not None and run.report.defects:
        diag.evidence["defects"] = defect_evidence(run.report)
    diag.evidence["device_seconds"] = round(float(run.seconds or 0.0), 4)
    if run.report is not None and not run.report.ok:
        return (verdicts.LOWERING_FAILED, run.report.summary(), None), run
    return None, run


def raised_by_hfadapt(exc: BaseException) -> bool:
    """Whether a plain ``NotImplementedError`` was raised by hfadapt's own code (its innermost
    frame in the hfadapt package) rather than by torch, a model or the device's kernel table
    (``SpyreOpNotImplementedError``, the device's own verdict on an op)."""
    if isinstance(exc, SpyreOpNotImplementedError):
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)


def adapters_took_effect(j: Judging) -> None:
    """Record the applied adapters whose own rule still fired in the code they rewrite
    (``evidence["adapters_ineffective"]``): listed as applied, they did nothing there."""
    from hfadapt.adapters.registry import default_registry
    from hfadapt.spyre.rules.profile import load_profile

    diag = j.diag
    if not diag.adapters or diag.report is None:
        return
    try:
        registry = j.registry if j.registry is not None else default_registry()
        profile = load_profile(j.options.profile)
        defect_adapters = {d.id: d.adapter for d in profile.defects}
        found = ineffective_adapters(diag.report, diag.adapters, registry.adapters, defect_adapters)
    except Exception as exc:  # evidence, never a reason to lose the verdict
        diag.evidence["adapters_ineffective_error"] = _one_line(exc)
        return
    if found:
        diag.evidence["adapters_ineffective"] = [f.to_dict() for f in found]


def numbers(j: Judging, run: DeviceResult) -> Outcome:
    """The device's numbers against the reference decide: pass, or a verification failure
    (localized when asked)."""
    diag = j.diag
    assert j.reference is not None, "the reference phase comes first"
    with j.phases("metrics"):
        metrics = compare(j.reference, last_hidden(run.outputs), j.real_tokens, j.model.pooling)
        metrics.outputs = judge_heads(j.heads, j.model, j.reference, j.inputs, run.outputs)
    diag.metrics = metrics
    diag.evidence["margin"] = margin_of(metrics).to_dict()  # how close it came to its bounds
    if j.heads is not None:
        diag.evidence["pipeline"] = evidence_of(j.heads, metrics.outputs)
    # Random weights cannot be trusted to show how much a silent defect costs (a defect that
    # wrecks the real model can leave a random one at cosine 0.99): in a structural run a
    # firing on the model's path fails it, whatever the numbers say.
    fired = structural_defect(diag, run.report)
    if fired is None and metrics.passed:
        return verdicts.PASS, f"{metrics.summary()} (>= {metrics.threshold})", None
    if j.options.localize:
        where(j, run, metrics)
    return verdicts.VERIFICATION_FAILED, fired or metrics.failure(), None


def where(j: Judging, run: DeviceResult, metrics: Metrics) -> None:
    """Localize a numeric failure to its first divergent module (evidence, never a reason to
    lose the verdict)."""
    diag = j.diag
    # a device defect exists only in compiled graphs: replay compiled to see it
    replay = j.options.execution.value if diag.evidence.get("defects") else "eager"
    diag.evidence["localize_execution"] = replay
    with j.phases("localize"), device_warnings_recorded(diag):
        try:
            diag.divergence = localize(
                with_heads(j.model.model, j.heads),
                pipeline_inputs(j.inputs, j.heads, j.dtype),
                runner=j.runner or default_runner(),
                dtype=j.dtype,
                profile=j.options.profile,
                rows=_worst_rows(metrics, j.real_tokens),
                prepare=j.prepare if j.options.adapters else None,
                execution=replay,
            )
            if diag.divergence is not None and run.report is not None:
                diag.divergence.defects = defects_in(run.report, diag.divergence.module)
        except Exception as exc:  # localizing is evidence, never a reason to lose the verdict
            diag.evidence["localize_error"] = _one_line(exc)


def _worst_rows(metrics: Metrics, mask: torch.Tensor) -> list[int]:
    """The probe rows to replay when localizing: the worst sentence, and the most padded one."""
    rows = [int(metrics.worst_token[0])] if metrics.worst_token else []
    rows.append(int(mask.sum(dim=1).argmin()))
    return sorted(set(rows))
