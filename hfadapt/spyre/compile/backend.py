"""The compiler of the simulated device: what ``torch.compile(model)`` with torch's default
backend uses for a graph on the ``spyre`` device (the card's form: torch-spyre has no backend
named "spyre"; hfadapt.spyre.eager.default_backend routes the default backend's graphs that use
the device here), and the ``backend="spyre"`` alias kept for earlier code, which also compiles
host tensors for the device (as ``lower()`` does to audit a model).

Each Dynamo graph is captured as ATen (aot_autograd, with hfadapt.spyre.decompositions'
table), judged whole against the device profile (graph_check), and then either refused with
*every* violation at once (``SpyreLoweringError`` carrying the ``LoweringReport``; its message
is the compiled-mode upstream text) or run as generated DL16 code (graph_exec). The report of
the latest compiled call is ``last_report()``; ``lower()`` audits a model without raising.

    model = model.half().to("spyre")
    compiled = torch.compile(model)        # the card's form; profile: torch.spyre.set_profile
    out = compiled(**inputs)               # inputs on "spyre"

    from hfadapt.spyre.compile import backend
    backend.register()                     # the alias (also found by its entry point)
    compiled = torch.compile(model, backend="spyre")   # options={"profile": "spyre-2026.10"}
    out = compiled(**inputs)
    backend.last_report().summary()
"""

from __future__ import annotations

import inspect
import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from hfadapt import torch_internals as ti
from hfadapt.errors import DeviceError, SpyreLoweringError
from hfadapt.model_config import ModelConfig
from hfadapt.spyre import host_constants
from hfadapt.spyre.compile.cache import default_cache
from hfadapt.spyre.compile.defects import find_defects
from hfadapt.spyre.compile.graph_exec import build_executable
from hfadapt.spyre.compile.graph_rules import check_graph
from hfadapt.spyre.compile.handoff import HandoffPlan, plan_handoff
from hfadapt.spyre.compile.native_ops import keep_native
from hfadapt.spyre.compile.reports import (
    GraphEntry,
    collect,
    collectors,
    last_report,
    merge_reports,
    note,
    reset_reports,
)
from hfadapt.spyre.decompositions import decomposition_table
from hfadapt.spyre.rules.lowering_report import LoweringReport, Violation
from hfadapt.spyre.rules.profile import Profile, load_profile

BACKEND_NAME = "spyre"
_RESUME_PREFIX = "torch_dynamo_resume_in_"


class SpyreCompileError(SpyreLoweringError, ti.inductor_error()):  # type: ignore[misc]
    """What the backend raises. Also an ``InductorError`` (what torch-spyre raises), which
    Dynamo passes through unwrapped instead of turning it into BackendCompilerFailed."""

    def __init__(self, message: str, report: LoweringReport) -> None:
        # Exception.__init__ directly: both bases' __init__ chain into each other's.
        Exception.__init__(self, message)
        self.report = report
        self.inner_exception = SpyreLoweringError(message, report)
        self.backend_name = BACKEND_NAME
        self.first_useful_frame = None

    def __reduce__(self) -> tuple[object, ...]:
        # sweeps send errors across processes: keep the report (default pickling drops it)
        return (type(self), (str(self.args[0]) if self.args else "", self.report))


def _profile(profile: Profile | str | None) -> Profile:
    return profile if isinstance(profile, Profile) else load_profile(profile)


def error_message(report: LoweringReport, profile: Profile) -> str:
    """``InductorError: Unsupported: Spyre backend does not support: <first>`` and then every
    violation, one per line, with its call site."""
    prefix = profile.errors["compile_unsupported"].split("{what}", 1)[0]
    first = report.violations[0]
    if first.message.startswith(prefix):
        head = first.message
    else:
        head = profile.message("compile_unsupported", what=f"{first.op}: {first.message}")
    lines = [f"InductorError: {head}", f"{len(report.violations)} violation(s) ({profile.name}):"]
    lines += [f"  {describe(v)}" for v in report.violations]
    return "\n".join(lines)


def describe(v: Violation) -> str:
    """One violation on one line: rule, op, dtypes and shapes, message, call site."""
    shapes = ", ".join(f"{d}{list(s)}" for d, s in zip(v.dtypes, v.shapes, strict=False)) or "-"
    where = ""
    if v.location is not None:
        where = f" at {v.location}" + (f": {v.location.code}" if v.location.code else "")
    return f"[{v.rule_id}] {v.op} ({shapes}): {v.message}{where}"


# -- the compiled graphs ------------------------------------------------------------------------


class DeviceGraph:
    """A graph that lowered: runs the generated DL16 program. ``report`` is its own report;
    ``handoff``: its part of defect.post_ln_handoff, whose firings are known only at run time
    (added to the report after each run)."""

    def __init__(
        self,
        program: Callable[..., object],
        entry: GraphEntry,
        handoff: HandoffPlan | None = None,
        fired: list[Any] | None = None,
    ) -> None:
        self.program = program
        self.entry = entry
        self.report = entry.report
        self.handoff = handoff
        self.fired = fired if fired is not None else []

    def __call__(self, *args: Any) -> object:
        note(self.entry)
        start = time.perf_counter()
        try:
            return self.program(*args)
        finally:
            if self.handoff is not None and self.handoff.fired:
                self.handoff.report_firings(self.report)
            while self.fired:  # defects the data decided (a host -inf mask at SDPA)
                self.report.add_defect(self.fired.pop())
            elapsed = time.perf_counter() - start
            for collector in collectors():
                collector.run_seconds += elapsed


def _is_top_frame() -> bool:
    """Whether Dynamo is compiling a frame's start, not the resume function after a graph
    break (private API: when it is unavailable, every graph starts a new report)."""
    return ti.is_top_frame(_RESUME_PREFIX)


def _fw_metadata() -> Any:
    return ti.fw_metadata()


def _static_inputs() -> list[int]:
    return list(getattr(_fw_metadata(), "static_input_indices", None) or [])


def _plain_inference(inputs: int) -> bool:
    """Whether aot_autograd's inference graph is all there is to the compiled call: no input
    mutated, every output a fresh tensor, no hidden state, one graph input per Dynamo input.
    Only such graphs go into the compile cache (a hit skips aot_autograd's runtime wrappers)."""
    meta = _fw_metadata()
    if meta is None:
        return False
    try:
        return (
            len(meta.input_info) == inputs
            and not any(i.mutates_data or i.mutates_metadata for i in meta.input_info)
            and all(o.output_type == ti.output_type_non_alias() for o in meta.output_info)
            and meta.num_intermediate_bases == 0
            and not meta.tokens
        )
    except AttributeError:  # another torch's metadata: compile without the cache
        return False


@dataclass(eq=False)
class SpyreBackend:
    """A Dynamo backend. ``strict``: raise on violations (torch.compile); otherwise record
    them and run the refused graph on the host unchanged, so tracing reaches every graph.

    Compared by identity: Dynamo reuses a frame's cached graphs only for a backend equal to the
    one that compiled them (``==``), and field equality made two audits' backends equal once
    both were strict, so one audit could run another's graphs."""

    profile: Profile = field(default_factory=load_profile)
    strict: bool = True
    # how many graphs Dynamo has handed this backend (relower: whether a call compiled anew)
    graphs: int = 0
    __name__ = BACKEND_NAME  # Dynamo names backends in its logs by __name__

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[object], **kwargs: object
    ) -> Any:
        self.graphs += 1
        if _automatic_dynamic(example_inputs):
            # Dynamo made a recompiled frame's sizes symbolic on its own (a second shape):
            # the card has static shapes and compiles each one, so this does too
            return _PerShape(self, gm)
        top = _is_top_frame()

        def compile_graph(aten_gm: torch.fx.GraphModule, _inputs: Sequence[object]) -> Any:
            return self.compile_graph(aten_gm, top)

        # rms_norm, softmax(dtype=): judged whole, as the card lowers them (with grad enabled
        # too: the custom ops carry their derivatives, the card runs the forward)
        keep_native(gm)
        # the persistent compile cache (hfadapt.spyre.compile.cache): aot_autograd's graph of
        # this Dynamo graph, from an earlier process
        cache = default_cache()
        key = cache.key(gm, example_inputs, self.profile) if cache is not None else None
        if cache is not None and key is not None:
            hit = cache.load(key, example_inputs)
            if hit is not None:
                return self.compile_graph(hit.gm, top, hit.static)

        def inference(aten_gm: torch.fx.GraphModule, _inputs: Sequence[object]) -> Any:
            static = _static_inputs()
            if cache is not None and key is not None and _plain_inference(len(example_inputs)):
                cache.store(key, aten_gm, example_inputs, static)
            return self.compile_graph(aten_gm, top, static)

        return ti.aot_autograd(
            fw_compiler=compile_graph,
            bw_compiler=compile_graph,
            inference_compiler=inference,
            decompositions=decomposition_table(),
        )(gm, example_inputs)

    def compile_graph(
        self, gm: torch.fx.GraphModule, top: bool, static: list[int] | None = None
    ) -> Callable[..., object]:
        """Judge one ATen graph; refuse it or build its DL16 program."""
        start = time.perf_counter()
        report = LoweringReport(
            profile_name=self.profile.name,
            profile_version=self.profile.version,
            mode="compile",
            graph_count=1,
        )
        check = check_graph(gm, self.profile, report)
        entry = GraphEntry(report=report, top=top, lowered=check.ok)
        if not check.ok:
            report.compile_seconds = time.perf_counter() - start
            note(entry)
            if self.strict:
                raise SpyreCompileError(error_message(report, self.profile), report)
            return _HostGraph(gm, entry)
        _warn_fallbacks(report, self.profile)
        # the card's silent failures: matched once here, computed wrongly by the program
        # (those its data decides, a host -inf mask, are recorded when they fire)
        fired: list[Any] = []
        corruptions = find_defects(gm, self.profile, fired)
        for corruption in corruptions:
            if not corruption.runtime:
                report.add_defect(corruption.firing)
        # across graphs (defect.post_ln_handoff): outputs marked, inputs checked at each call
        static = _static_inputs() if static is None else static
        handoff = plan_handoff(gm, self.profile, static)
        program, _runtime = build_executable(gm, check, self.profile, static, corruptions, handoff)
        report.compile_seconds = time.perf_counter() - start
        note(entry)
        return DeviceGraph(program, entry, handoff, fired)


def _symbolic(value: object) -> bool:
    if isinstance(value, torch.SymInt | torch.SymFloat):
        return True
    shape = getattr(value, "shape", None)
    return shape is not None and any(not isinstance(s, int) for s in shape)


def _automatic_dynamic(example_inputs: Sequence[object]) -> bool:
    """Symbolic sizes Dynamo chose itself (automatic dynamic shapes after a recompile), not
    asked for with ``dynamic=True`` (which keeps the layout.dynamic_shape refusal)."""
    if not any(_symbolic(v) for v in example_inputs):
        return False
    config = ti.dynamo_config()
    return bool(getattr(config, "assume_static_by_default", True))


class _PerShape:
    """A Dynamo graph with symbolic sizes, compiled once per concrete shape as a static graph
    (the card compiles each static shape; hf-adapters recompiles per prompt length)."""

    def __init__(self, backend: SpyreBackend, gm: torch.fx.GraphModule) -> None:
        self.backend = backend
        self.gm = gm
        self.compiled: dict[tuple[Any, ...], Callable[..., Any]] = {}

    @staticmethod
    def _key(args: Sequence[object]) -> tuple[object, ...]:
        return tuple(
            (tuple(a.shape), tuple(a.stride()), a.dtype, a.device.type)
            if isinstance(a, torch.Tensor)
            else a
            for a in args
        )

    def __call__(self, *args: object) -> Any:
        key = self._key(args)
        fn = self.compiled.get(key)
        if fn is None:
            with ti.dynamo_config().patch(automatic_dynamic_shapes=False):
                fn = self.compiled[key] = self.backend(self.gm, list(args))
        return fn(*args)


def _warn_fallbacks(report: LoweringReport, profile: Profile) -> None:
    """torch-spyre's "<op> is falling back to cpu", once per op and graph, at compile time."""
    from hfadapt.spyre.rules.tracking import SpyreFallbackWarning

    for op in report.fallbacks:
        warnings.warn(
            profile.message("fallback_warning", op=op), SpyreFallbackWarning, stacklevel=2
        )


class _HostGraph(DeviceGraph):
    """A refused graph in an audit: runs the captured graph on the host, so tracing reaches
    the graphs after it. Its numbers are never judged (the model does not lower), only its
    shapes and dtypes: half-precision matmuls run in fp32 and round back, because PyTorch's
    CPU fp16/bf16 GEMM is two orders of magnitude slower (measured on a 3072 x 2048 x 2048
    product: 0.5 s in fp32, 180 s in fp16)."""

    def __init__(self, gm: torch.fx.GraphModule, entry: GraphEntry) -> None:
        def run(*args: object) -> Any:
            with _Fp32Matmuls():
                return gm(*args)

        super().__init__(run, entry)


_MATMULS = frozenset(
    {torch.ops.aten.mm, torch.ops.aten.bmm, torch.ops.aten.addmm, torch.ops.aten.baddbmm}
)


class _Fp32Matmuls(ti.torch_dispatch_mode()):  # type: ignore[misc]
    """Half-precision mm/bmm/addmm/baddbmm computed in fp32, results in their own dtype."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func.overloadpacket in _MATMULS:
            halves = [a for a in args if isinstance(a, torch.Tensor) and a.dtype in _HALF_DTYPES]
            if halves:
                up = [
                    a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                    for a in args
                ]
                return func(*up, **kwargs).to(halves[0].dtype)
        return func(*args, **kwargs)


_HALF_DTYPES = (torch.float16, torch.bfloat16)


def spyre_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """The function registered as ``backend="spyre"``. ``options``: ``profile`` (name, path or
    Profile), ``strict`` (default True)."""
    options: Mapping[str, Any] = kwargs.get("options") or {}
    backend = SpyreBackend(
        profile=_profile(options.get("profile")), strict=bool(options.get("strict", True))
    )
    return backend(gm, example_inputs)


def register() -> None:
    """Make ``torch.compile(..., backend="spyre")`` available (the alias; also what the default
    backend's device graphs are routed to, when the entry point is not installed). Idempotent."""
    if not ti.compiler_backend_registered(BACKEND_NAME):
        ti.register_compiler_backend(spyre_backend, BACKEND_NAME)


# -- auditing a model -----------------------------------------------------------------------------


@dataclass(frozen=True)
class CompiledGraphs:
    """What ``relower`` needs of a clean audit: the backend whose graphs Dynamo cached, the
    profile they were judged under, and what the audit added to the call. Not the model: an
    earlier task's copy of the weights is not kept alive for the next."""

    backend: SpyreBackend
    profile: Profile
    extra_kwargs: Mapping[str, object]


class LoweredModel:
    """What ``lower()`` returns: calls the compiled model, or raises SpyreLoweringError with the
    audit's report when the model does not lower."""

    def __init__(
        self,
        compiled: Callable[..., object],
        report: LoweringReport,
        profile: Profile,
        extra_kwargs: Mapping[str, object] | None = None,
        backend: SpyreBackend | None = None,
    ) -> None:
        self.compiled = compiled
        self.report = report
        self.profile = profile
        self.backend = backend  # what compiled the graphs (relower runs another model on them)
        # the audit call's own result and its device time: when the report is clean, what the
        # model computes on the audit inputs (a second run would compute it again)
        self.audit_output: Any = None
        self.audit_run_seconds = 0.0
        # what lower() added to the audit call (use_cache=False): the same call signature
        # keeps Dynamo's guards passing, so the audited graphs are the ones that run
        self.extra_kwargs = dict(extra_kwargs or {})

    def __call__(self, *args: object, **kwargs: object) -> object:
        if not self.report.ok:
            raise SpyreCompileError(error_message(self.report, self.profile), self.report)
        with torch.no_grad():
            return self.compiled(*args, **{**self.extra_kwargs, **kwargs})

    def graphs(self) -> CompiledGraphs | None:
        """What another model may run on (``relower``); None unless the audit was clean."""
        if self.backend is None or not self.report.ok:
            return None
        return CompiledGraphs(self.backend, self.profile, dict(self.extra_kwargs))


def _graph_breaks() -> int:
    return sum(ti.dynamo_counters()["graph_break"].values())


def _takes_use_cache(model: Callable[..., object], config: ModelConfig | None) -> bool:
    """A decoder whose forward takes ``use_cache`` (a KV cache would add outputs and state)."""
    if not getattr(config, "use_cache", False):
        return False
    try:
        params = inspect.signature(getattr(model, "forward", model)).parameters
    except (TypeError, ValueError):
        return False
    return "use_cache" in params


def _log_enabled(module: object, logger: str) -> bool:
    log = getattr(module, logger, None)
    return log is None or log.isEnabledFor(logging.DEBUG)


@contextmanager
def _no_log_only_work() -> Iterator[None]:
    """Skip two things Dynamo (torch 2.13) computes only for its own logs, which an audit pays
    for on every frame it compiles:

    - the guard latency probe: every new frame's guards are timed once after a cache flush
      (torch._dynamo.guards.profile_guard_manager: about 0.1 s a frame, 1.2 s of a 2-layer
      BERT audit's 12 frames). An audit compiles every frame once;
    - the enclosing function's name of every traced call, for the ``trace_call`` debug log:
      output_graph's create_proxy builds that log's header eagerly, and the name comes from
      tokenizing the whole source file in pure Python (torch._dynamo.funcname_cache):
      torch/nn/functional.py alone takes 0.38 s, a third of MiniLM's tracing. Skipped only
      while that log is off (``TORCH_LOGS=trace_call`` keeps it).

    Private API: where either is absent, nothing changes for it."""
    guards, output_graph = ti.dynamo_module("guards"), ti.dynamo_module("output_graph")
    symbolic_convert = ti.dynamo_module("symbolic_convert")
    replacements: list[tuple[Any, str, Any]] = [
        (guards, "profile_guard_manager", lambda *args, **kwargs: 0.0)
    ]
    if not (
        _log_enabled(output_graph, "trace_call_log")
        or _log_enabled(symbolic_convert, "trace_call_log")
    ):
        replacements.append((symbolic_convert, "get_funcname", lambda filename, lineno: None))
    with ti.patched(replacements):
        yield


def _call(fn: Callable[..., object], inputs: Mapping[str, object] | Sequence[object]) -> object:
    if isinstance(inputs, Mapping):
        return fn(**inputs)
    return fn(*inputs)


def _dynamo_settings() -> Any:
    """Dynamo's settings for an audit: a raised recompile limit keeps it from silently falling
    back to eager after many audits; static shapes. Dynamo's gc.collect(1) after every frame
    frees accelerator memory early; here it only walks the young objects again (0.3 s of
    MiniLM's 9 frames under the command's collector settings, hfadapt.own_process): cycles are
    left to the collector's own schedule."""
    return ti.dynamo_config().patch(
        recompile_limit=1_000_000,
        accumulated_recompile_limit=1_000_000,
        automatic_dynamic_shapes=False,
        run_gc_after_compile=False,
    )


def _trace(
    model: Callable[..., object],
    example_inputs: Mapping[str, object] | Sequence[object],
    p: Profile,
) -> tuple[SpyreBackend, Callable[..., object], Any, object, float, int]:
    """Compile ``model`` with a fresh spyre backend and call it on ``example_inputs``: (the
    backend, the compiled model, the graphs' collector, the output, the call's seconds, the
    graph-break events it caused)."""
    # A fresh backend object makes Dynamo recompile instead of reusing another audit's graphs
    backend = SpyreBackend(profile=p, strict=False)
    compiled = torch.compile(model, backend=backend, dynamic=False)
    breaks_before = _graph_breaks()
    start = time.perf_counter()
    with collect(p) as collector, _dynamo_settings(), _no_log_only_work(), torch.no_grad():
        output = _call(compiled, example_inputs)
    elapsed = time.perf_counter() - start
    return backend, compiled, collector, output, elapsed, _graph_breaks() - breaks_before


def lower(
    model: Callable[..., object],
    example_inputs: Mapping[str, object] | Sequence[object],
    profile: Profile | str | None = None,
    *,
    check_config: bool = True,
) -> tuple[LoweredModel, LoweringReport]:
    """Audit a model on the device: compile it with the spyre backend on ``example_inputs``
    (keyword inputs as a dict, or positional), static shapes, every graph judged. Returns the
    runnable model and the report; the report lists every violation of every graph (the
    model then raises when called). A config whose hidden or intermediate size is off the
    stick boundary raises SpyreUnsupportedModelError first; a head_dim whose attention matmul
    fails gets the config-level ``layout.head_dim`` entry (the adapter fix) beside it. Decoder
    configs get ``use_cache=False``. ``report.compile_seconds``: the first call minus the
    device run time. A clean audit keeps its result (``audit_output``, ``audit_run_seconds``)."""
    from hfadapt.spyre.rules.layout_rules import attention_head_dim_violation, ensure_supported

    p = _profile(profile)
    config = getattr(model, "config", None)
    if check_config and config is not None:
        ensure_supported(config, p)
    extra: dict[str, Any] = {}
    if isinstance(example_inputs, Mapping) and _takes_use_cache(model, config):
        extra = {"use_cache": False}
        example_inputs = {**extra, **example_inputs}
    built = host_constants.builds()
    traced = _trace(model, example_inputs, p)
    if host_constants.builds() != built:
        # The host built a constant inside this trace (hfadapt.spyre.host_constants): the graph
        # broke there, where any later trace finds the constant. Trace again, so the graphs
        # judged are the same whatever the process built before (10 graphs cold, 5 warm on a
        # ModernBERT with the RoPE adapter). Dynamo forgets its frames first: a fresh backend
        # alone recompiles the frames as they were split (measured: 10 graphs again). This
        # happens once per constant in a process; other compiled models then compile afresh.
        ti.dynamo_reset()
        traced = _trace(model, example_inputs, p)
    backend, compiled, collector, output, elapsed, breaks = traced
    if not collector.entries:
        raise DeviceError(
            "lower(): Dynamo captured no graph (a frame it skips, or no tensor operations)"
        )
    if breaks:
        # Code between graphs runs eagerly; on the CPU-held model here nothing judges it.
        warnings.warn(
            f"lower(): Dynamo broke the graph ({breaks} graph-break event(s), "
            f"{len(collector.entries)} graph(s)); code outside the graphs ran on the host and "
            "was not checked against the device profile",
            UserWarning,
            stacklevel=2,
        )
    report = collector.report()
    report.compile_seconds = max(elapsed - collector.run_seconds, 0.0)
    if config is not None:
        diagnosis = attention_head_dim_violation(config, report.violations, p)
        if diagnosis is not None:
            report.add(diagnosis)
    backend.strict = True  # later shapes compile strictly: a new violation raises
    lowered = LoweredModel(compiled, report, p, extra, backend)
    if report.ok:
        lowered.audit_output, lowered.audit_run_seconds = output, collector.run_seconds
    return lowered, report


def relower(
    previous: CompiledGraphs,
    model: Callable[..., object],
    example_inputs: Mapping[str, object] | Sequence[object],
    profile: Profile | str | None = None,
) -> tuple[LoweredModel, LoweringReport] | None:
    """``model`` run on the graphs of ``previous`` (``LoweredModel.graphs``), without tracing
    it again, when Dynamo's guards accept it as the same program: another instance of the same
    classes and config whose tensors differ only in their values (one task's adapters merged
    into a copy of the weights, hfadapt.judge.task_judging). Every tensor is read from
    ``model`` at the call, and whatever Dynamo specialized on is guarded, so the result is what
    a fresh ``lower(model, example_inputs, profile)`` computes; the report (the same graphs'
    judgments, and what fired in this run) says ``graphs_reused``. None when ``profile`` is
    not the one ``previous`` was judged under, or when the call made Dynamo compile anything
    (a guard failed: another program; a host constant was built): the caller then lowers
    afresh, as ``lower`` judges a new graph."""
    backend, p = previous.backend, previous.profile
    if _profile(profile) != p:
        return None
    if isinstance(example_inputs, Mapping):
        example_inputs = {**previous.extra_kwargs, **example_inputs}
    compiled = torch.compile(model, backend=backend, dynamic=False)
    graphs, built = backend.graphs, host_constants.builds()
    start = time.perf_counter()
    try:
        with collect(p) as collector, _dynamo_settings(), _no_log_only_work(), torch.no_grad():
            output = _call(compiled, example_inputs)
    except SpyreLoweringError:  # a new graph the strict backend refused: judged afresh
        return None
    elapsed = time.perf_counter() - start
    if backend.graphs != graphs or host_constants.builds() != built or not collector.entries:
        return None
    report = collector.report()
    report.compile_seconds = max(elapsed - collector.run_seconds, 0.0)  # the guards' checks
    report.graphs_reused = True
    lowered = LoweredModel(compiled, report, p, previous.extra_kwargs, backend)
    lowered.audit_output, lowered.audit_run_seconds = output, collector.run_seconds
    return lowered, report


__all__ = [
    "BACKEND_NAME",
    "CompiledGraphs",
    "DeviceGraph",
    "GraphEntry",
    "LoweredModel",
    "SpyreBackend",
    "SpyreCompileError",
    "collect",
    "describe",
    "error_message",
    "last_report",
    "lower",
    "merge_reports",
    "register",
    "relower",
    "reset_reports",
    "spyre_backend",
]
