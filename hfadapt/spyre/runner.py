"""Run a model on the simulated device, eager or compiled, and hand back its outputs (on the
host, float32), the lowering report and the device time. Diagnose, sweeps and the agent call
this one function, so every caller judges a model the same way."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from hfadapt.errors import SpyreLoweringError, UsageError
from hfadapt.options import Execution
from hfadapt.spyre.numerics.host_state import pinned
from hfadapt.spyre.rules.lowering_report import LoweringReport
from hfadapt.spyre.rules.profile import Profile, load_profile

if TYPE_CHECKING:
    from hfadapt.spyre.compile.backend import CompiledGraphs


@dataclass
class DeviceRun:
    outputs: Any  # the model's output with every tensor on the host as float32
    report: LoweringReport
    seconds: float  # device forward time (compile time excluded; see report.compile_seconds)


def _host_float(value: object) -> Any:
    """Every tensor in a (nested) model output, moved to the host; floats as float32."""
    if isinstance(value, torch.Tensor):
        host = value.cpu() if value.device.type != "cpu" else value
        return host.float() if host.is_floating_point() else host
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_host_float(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_host_float(v) for v in value)
    if isinstance(value, Mapping):
        out = {k: _host_float(v) for k, v in value.items()}
        try:
            return type(value)(**out)  # ModelOutput and plain dicts
        except TypeError:
            return out
    return value


def _profile(profile: Profile | str | None) -> Profile:
    return profile if isinstance(profile, Profile) else load_profile(profile)


def _eager(
    model: torch.nn.Module, inputs: Mapping[str, object], p: Profile, collect: bool
) -> DeviceRun:
    from hfadapt.spyre.eager import device as spyre_device
    from hfadapt.spyre.rules.tracking import tracking

    spyre_device.register()
    dev = torch.device("spyre")
    with tracking(p, mode="eager", collect=collect) as report, torch.no_grad():
        model.to(dev)
        moved = {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
        start = time.perf_counter()
        out = model(**moved)
        outputs = _host_float(out)
        seconds = time.perf_counter() - start
    return DeviceRun(outputs=outputs, report=report, seconds=seconds)


class _Shared(threading.local):
    """This thread's ``shared_graphs`` block: whether one is open, and the graphs of its last
    clean compiled run."""

    def __init__(self) -> None:
        self.open = False
        self.graphs: CompiledGraphs | None = None


_shared = _Shared()


@contextmanager
def shared_graphs() -> Iterator[None]:
    """Inside the block, a compiled run reuses the graphs of the block's previous clean
    compiled run when Dynamo's guards accept the new model as the same program, instead of
    tracing it again (hfadapt.spyre.compile.backend.relower: a model's task copies, which
    differ only in their weights; jina-embeddings-v3's structural diagnose 5.6 s instead of
    8.2 s, benchmarks/bench_tasks.py); its report says ``graphs_reused``. A model the guards
    refuse is lowered afresh, as outside."""
    outer = (_shared.open, _shared.graphs)
    _shared.open, _shared.graphs = True, None
    try:
        yield
    finally:
        _shared.open, _shared.graphs = outer


def _compiled(model: torch.nn.Module, inputs: Mapping[str, object], p: Profile) -> DeviceRun:
    from hfadapt.spyre.compile.backend import error_message, lower, relower

    previous = _shared.graphs if _shared.open else None
    again = relower(previous, model, dict(inputs), p) if previous is not None else None
    lowered, report = again if again is not None else lower(model, dict(inputs), p)
    if _shared.open:
        _shared.graphs = lowered.graphs() or previous
    if not report.ok:
        raise SpyreLoweringError(error_message(report, p), report)
    # the audit ran the lowered program on these very inputs: its result is the device's
    return DeviceRun(
        outputs=_host_float(lowered.audit_output), report=report, seconds=lowered.audit_run_seconds
    )


@pinned()  # every judging run, the agent's proofs included: the caller's precision never leaks in
def run_on_device(
    model: torch.nn.Module,
    inputs: Mapping[str, Any],
    *,
    execution: str = "eager",
    dtype: torch.dtype = torch.float16,
    profile: Profile | str | None = None,
    collect: bool = True,
) -> DeviceRun:
    """Run ``model(**inputs)`` on the simulated Spyre device in ``dtype`` (fp16 or bf16).

    The model is converted in place (dtype, and device for eager). A config whose hidden or
    intermediate size is off the stick boundary raises SpyreUnsupportedModelError before
    anything runs. Eager with ``collect=True`` records every violation and keeps running (audit
    mode); ``collect=False`` raises at the first, as the card does. Compiled mode judges the
    whole graph first and raises SpyreLoweringError with every violation in its report."""
    from hfadapt.spyre.rules.layout_rules import ensure_supported

    Execution.parse(execution, "execution")
    if dtype not in (torch.float16, torch.bfloat16):
        raise UsageError(f"the device runs models in fp16 or bf16, not {dtype}")
    p = _profile(profile)
    config = getattr(model, "config", None)
    if config is not None:
        ensure_supported(config, p)
    model.eval()
    model.to(dtype)
    if execution == "eager":
        return _eager(model, inputs, p, collect)
    return _compiled(model, inputs, p)
