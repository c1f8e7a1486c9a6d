"""The parent's proof of a drafted graph. The sandbox hands back a graph of ATen ops as bytes;
everything that decides acceptance happens here, in the process that never ran the draft, on
exactly the graph users will run:

- ``graph``: the bytes parse and validate (every op in the allowlist, every constant known),
  the graph takes the call the case recorded and reads exactly the module's tensors; where it
  applies is fixed from the attributes the stock code (and the draft, as reported) read;
- ``equivalence``: float64, the graph against the stock method on the case's inputs over three
  seeds and four value variants, with negative controls (identity, zero, constant, 0.1 % scaled)
  that must fail, and on fresh sizes: batch 1 and 8, lengths past the probe's up to the model's
  maximum (capped at ``MAX_FRESH_LEN``); a graph that refuses a size the stock code computes is
  a size-dependent graph and fails;
- ``device``: the graph on the simulated device at the module (values and cosine against the
  stock code on the CPU), then the case's model on the device without and with the graph: the
  fingerprint gone, no new violation, and how much of the graph runs on the host;
- ``end_to_end``: the model with the graph on the CPU against stock (min per-token cosine
  0.999), and on the device against the CPU reference (0.99, and a bounded relative error)."""

from __future__ import annotations

import copy
import math
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from hfadapt.adapters.api import Adapter
from hfadapt.adapters.equivalence import ATOL, RTOL, compare_outputs, prove_equivalent
from hfadapt.adapters.graph_adapter import GraphMethod, graph_adapter
from hfadapt.agent.cases import FailureCase, captured_example
from hfadapt.agent.end_to_end import (
    CPU_COSINE_MIN,
    DEVICE_COSINE_MIN,
    DEVICE_REL_ERR_MAX,
    relative_error,
    run_forward,
    token_cosine,
)
from hfadapt.agent.sandbox import StepReport
from hfadapt.errors import GraphError
from hfadapt.graphs import GraphArtifact, GraphProgram
from hfadapt.graphs.capture import call_template, module_tensors
from hfadapt.graphs.reads import read_value, record_reads

PROOF_SEEDS = (0, 1, 2)
FRESH_BATCHES = (1, 8)
MAX_FRESH_LEN = 1024
MAX_FRESH_ELEMENTS = 2**24
MODULE_COSINE_MIN = 0.99
MODULE_REL_ERR_MAX = 0.1  # the module on the device: DL16 rounding and the card's numerics
_READ_NAME = __import__("re").compile(r"^[A-Za-z0-9_.]{1,200}$")


@dataclass
class Proof:
    """What the parent established about one graph, step by step."""

    program: GraphProgram | None = None
    adapter: Adapter | None = None
    reads: dict[str, Any] = field(default_factory=dict)
    host_share: dict[str, Any] = field(default_factory=dict)
    device_outputs: Any = None
    steps: list[StepReport] = field(default_factory=list)

    @property
    def method(self) -> GraphMethod:
        assert self.adapter is not None
        return self.adapter.fn  # type: ignore[return-value]


def trusted_example(case: FailureCase) -> Callable[[int], Any]:
    """The case's example inputs (a builder of hfadapt's, or calls the parent captured)."""
    if case.example:
        return pkgutil.resolve_name(case.example)  # type: ignore[no-any-return]
    if case.example_file:
        return captured_example(case.example_file)  # type: ignore[no-any-return]
    raise GraphError("the case has no example inputs to prove a graph on")


def stock_callable(target: str) -> Callable[..., Any]:
    """The stock code at ``module:Class.method`` (trusted library code, imported here)."""
    return pkgutil.resolve_name(target)  # type: ignore[no-any-return]


def graph_call(program: GraphProgram) -> Callable[..., Any]:
    """``fn(module, *args, **kwargs)`` running the graph; raises when the call does not fit."""

    def run(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        bound = program.bind(module, args, kwargs)
        if isinstance(bound, str):
            raise GraphError(f"the graph does not take this call: {bound}")
        return program.run(bound)

    return run


# -- graph ----------------------------------------------------------------------------------------


def step_graph(
    files: dict[str, bytes], case: FailureCase, name: str, rule: str, draft_reads: Any
) -> tuple[StepReport, Proof]:
    proof = Proof()
    if "graph.json" not in files:
        return StepReport("graph", "fail", "the sandbox handed back no graph"), proof
    try:
        artifact = GraphArtifact.from_bytes(files["graph.json"], files.get("constants.safetensors"))
        program = GraphProgram(artifact)
    except GraphError as exc:
        return StepReport("graph", "fail", f"the graph does not validate: {exc.one_line()}"), proof
    module, args, kwargs = trusted_example(case)(0)
    module = module.float().eval()
    args_t, kwargs_t, _ = call_template(tuple(args), dict(kwargs))
    if (args_t, kwargs_t) != (artifact.call_args, artifact.call_kwargs):
        return StepReport(
            "graph", "fail", "the graph was captured for another call than the case's"
        ), proof
    wanted = {(kind, n) for n, (kind, _) in module_tensors(module).items()}
    declared = {(i.kind, i.name) for i in artifact.inputs if i.kind in ("param", "buffer")}
    if declared != wanted:
        extra = sorted(declared ^ wanted)[:3]
        return StepReport(
            "graph", "fail", f"the graph does not read exactly the module's tensors ({extra})"
        ), proof
    with torch.no_grad(), record_reads(module) as reads:
        stock_callable(case.target or "")(module, *args, **kwargs)
    for path in draft_reads if isinstance(draft_reads, list) else []:
        if isinstance(path, str) and _READ_NAME.match(path) and path not in reads:
            value = read_value(module, path)
            if value == value:  # readable here (a missing attribute compares unequal)
                reads[path] = value
    proof.program, proof.reads = program, dict(sorted(reads.items()))
    proof.host_share = program.host_share()
    proof.adapter = graph_adapter(
        program, name=name, target=case.target or "", rule=rule, reads=proof.reads
    )
    counts = program.op_counts()
    output = {
        "nodes": len(artifact.nodes),
        "ops": dict(sorted(counts.items(), key=lambda kv: -kv[1])[:30]),
        "host_share": proof.host_share,
        "conditions": proof.reads,
        "symbols": {k: list(v) for k, v in artifact.symbols.items()},
    }
    summary = (
        f"{len(artifact.nodes)} ATen nodes, every op in the allowlist; applies where "
        f"{len(proof.reads)} attribute(s) match; {proof.host_share['host_nodes']} of "
        f"{proof.host_share['compute_nodes']} arithmetic ops on the host"
    )
    return StepReport("graph", "pass", summary, output), proof


# -- equivalence ----------------------------------------------------------------------------------


def _f64(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_f64(v) for v in value)
    if isinstance(value, dict):
        return {k: _f64(v) for k, v in value.items()}
    return value


def _resize(t: torch.Tensor, dim: int, size: int, g: torch.Generator) -> torch.Tensor:
    reps = -(-size // t.shape[dim])
    tiled = torch.cat([t] * reps, dim=dim).narrow(dim, 0, size)
    if t.is_floating_point() and t.numel() > 16 and t.unique().numel() > 16:
        std = float(t.double().std()) or 1.0
        fresh = torch.randn(tiled.shape, generator=g, dtype=torch.float64) * std + float(
            t.double().mean()
        )
        return fresh.to(t.dtype)
    return tiled.contiguous()


def _resized(
    value: Any, batch: tuple[int, int], seq: tuple[int, int] | None, g: torch.Generator
) -> Any:
    if isinstance(value, torch.Tensor):
        t = value
        if t.dim() >= 1 and t.shape[0] == batch[0] and batch[0] != batch[1]:
            t = _resize(t, 0, batch[1], g)
        if seq is not None and seq[0] != seq[1]:
            for d in range(1, t.dim()):
                if t.shape[d] == seq[0]:
                    t = _resize(t, d, seq[1], g)
        return t
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_resized(v, batch, seq, g) for v in value)
    if isinstance(value, dict):
        return {k: _resized(v, batch, seq, g) for k, v in value.items()}
    return value


def max_positions(module: torch.nn.Module) -> int | None:
    for m in module.modules():
        n = getattr(getattr(m, "config", None), "max_position_embeddings", None)
        if isinstance(n, int) and n > 0:
            return n
    return None


def fresh_sizes(
    module: torch.nn.Module, args: tuple[Any, ...]
) -> tuple[list[tuple[int, int | None]], dict[str, Any]]:
    """(batch, length) pairs to prove at, and the bound stated with them. Batch is dim 0 of the
    call's first tensor, length its second-to-last dim (when it has three or more)."""
    first = next((a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2), None)
    if first is None:
        return [], {"note": "no batched tensor input: no fresh sizes"}
    s0 = int(first.shape[-2]) if first.dim() >= 3 else None
    pairs: list[tuple[int, int | None]] = [(b, s0) for b in FRESH_BATCHES]
    bound: dict[str, Any] = {"batches": list(FRESH_BATCHES)}
    if s0 is not None:
        maximum = max_positions(module)
        longest = min(maximum or 4 * 256, MAX_FRESH_LEN)
        mid = min(2 * s0 + 1, longest)
        lengths = sorted({mid, longest} - {s0})
        pairs += [(2, s) for s in lengths]
        bound.update(lengths=lengths, model_maximum=maximum, cap=MAX_FRESH_LEN)
    return pairs, bound


def _fresh_calls(
    example: Callable[[int], Any],
) -> tuple[list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]], dict[str, Any]]:
    module, args, kwargs = example(0)
    module = module.double().eval()
    args, kwargs = _f64(tuple(args)), _f64(dict(kwargs))
    first = next((a for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2), None)
    pairs, bound = fresh_sizes(module, args)
    calls = []
    g = torch.Generator().manual_seed(20_000)
    for b, s in pairs:
        assert first is not None
        seq = (int(first.shape[-2]), s) if s is not None and first.dim() >= 3 else None
        new_args = _resized(args, (int(first.shape[0]), b), seq, g)
        new_kwargs = _resized(kwargs, (int(first.shape[0]), b), seq, g)
        too_big = any(t.numel() > MAX_FRESH_ELEMENTS for t in _tensors((new_args, new_kwargs)))
        if not too_big:
            calls.append(
                (f"batch {b} x length {s if s is not None else '-'}", module, new_args, new_kwargs)
            )
    return calls, bound


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def bounded_sizes(artifact: GraphArtifact) -> list[str]:
    """The batch and length sizes of the call's first batched tensor that the graph caps (a
    finite upper bound: the code read its own size and branched on it)."""
    first = next((i for i in artifact.inputs if i.kind == "arg" and len(i.shape) >= 2), None)
    if first is None:
        return []
    dims = [("batch", first.shape[0])] + (
        [("length", first.shape[-2])] if len(first.shape) >= 3 else []
    )
    found = []
    for what, size in dims:
        if isinstance(size, str) and artifact.symbols[size][1] is not None:
            found.append(f"{what} at most {artifact.symbols[size][1]}")
    return found


def step_equivalence(proof: Proof, case: FailureCase) -> StepReport:
    assert proof.program is not None
    capped = bounded_sizes(proof.program.artifact)
    if capped:
        why = (
            f"the graph only takes {', '.join(capped)}, the stock code any: a size-dependent graph"
        )
        return StepReport("equivalence", "fail", why, {"capped": capped})
    example = trusted_example(case)
    stock = stock_callable(case.target or "")
    run = graph_call(proof.program)
    result = prove_equivalent(run, original=stock, example=example, seeds=PROOF_SEEDS)
    output: dict[str, Any] = result.to_dict()
    output["cases"] = [c for c in output["cases"] if not c["ok"]][:6]
    output["inputs"] = len(result.cases)
    if not result.equivalent:
        return StepReport("equivalence", "fail", result.summary(), output)
    calls, bound = _fresh_calls(example)
    rows: list[dict[str, Any]] = []
    worst_abs, worst_rel = result.max_abs_err, result.max_rel_err
    for label, module, args, kwargs in calls:
        with torch.no_grad():
            try:
                ref = stock(copy.deepcopy(module), *args, **kwargs)
            except Exception as exc:  # the stock code does not take this size: nothing to prove
                rows.append(
                    {"input": label, "skipped": f"the stock code raises: {type(exc).__name__}"}
                )
                continue
            try:
                out = run(copy.deepcopy(module), *args, **kwargs)
            except GraphError as exc:
                output["fresh"] = rows
                why = (
                    f"{label}: {exc.one_line()}; the stock code computes it: a size-dependent graph"
                )
                return StepReport("equivalence", "fail", why, output)
        ok, abs_err, rel_err, why = compare_outputs(ref, out, RTOL, ATOL)
        rows.append({"input": label, "ok": ok, "max_abs_err": abs_err, "max_rel_err": rel_err})
        worst_abs, worst_rel = max(worst_abs, abs_err), max(worst_rel, rel_err)
        if not ok:
            output["fresh"] = rows
            return StepReport("equivalence", "fail", f"float64 at {label}: {why}", output)
    output.update(fresh=rows, fresh_bound=bound, max_abs_err=worst_abs, max_rel_err=worst_rel)
    proven = sum(1 for r in rows if r.get("ok"))
    summary = (
        f"float64: {len(result.cases)} inputs and {proven} fresh sizes within rtol {RTOL:g} (max rel "
        f"err {worst_rel:.3g}, max abs err {worst_abs:.3g}); controls identity, zero, constant, "
        f"scaled rejected; lengths up to {max(bound.get('lengths') or [0])}"
    )
    return StepReport("equivalence", "pass", summary, output)


# -- device ---------------------------------------------------------------------------------------


def _rounded(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_rounded(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _rounded(v, dtype) for k, v in value.items()}
    return value


def _to(value: Any, device: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


def module_on_device(proof: Proof, case: FailureCase) -> dict[str, Any]:
    """The graph on the simulated device (eager) at the module, against the stock code in
    float64 on the same rounded inputs: min row cosine and relative error per output."""
    from hfadapt.spyre.eager import device as spyre_device
    from hfadapt.spyre.tracking import tracking

    assert proof.program is not None
    dtype = getattr(torch, case.run_dtype)
    module, args, kwargs = trusted_example(case)(0)
    low = copy.deepcopy(module).float().to(dtype)
    args, kwargs = _rounded(tuple(args), dtype), _rounded(dict(kwargs), dtype)
    ref_module = copy.deepcopy(low).double()
    with torch.no_grad():
        ref = stock_callable(case.target or "")(ref_module, *_f64(args), **_f64(kwargs))
    spyre_device.register()
    dev = torch.device("spyre")
    with tracking(case.profile, mode="eager", collect=True), torch.no_grad():
        on_dev = low.to(dev)
        out = graph_call(proof.program)(on_dev, *_to(args, dev), **_to(kwargs, dev))
        got = _to(out, "cpu")
    refs, outs = _tensors(ref), _tensors(got)
    if len(refs) != len(outs):
        return {
            "ok": False,
            "why": f"{len(outs)} outputs on the device, {len(refs)} from the stock code",
        }
    worst_cos, worst_rel = 1.0, 0.0
    for r, o in zip(refs, outs, strict=True):
        if not r.is_floating_point():
            continue
        a = r.double().reshape(-1, r.shape[-1] if r.dim() else 1)
        b = o.double().reshape(-1, o.shape[-1] if o.dim() else 1)
        na, nb = a.norm(dim=-1), b.norm(dim=-1)
        cos = (a * b).sum(-1) / (na * nb).clamp(min=1e-300)
        cos = torch.where((na < 1e-12) & (nb < 1e-12), torch.ones_like(cos), cos)
        worst_cos = min(worst_cos, float(cos.min()) if cos.numel() else 1.0)
        denom = float(a.norm())
        rel = float((b - a).norm()) / denom if denom > 0 else float((b - a).norm())
        worst_rel = max(worst_rel, rel if math.isfinite(rel) else math.inf)
    ok = worst_cos >= MODULE_COSINE_MIN and worst_rel <= MODULE_REL_ERR_MAX
    return {"ok": ok, "min_cosine": worst_cos, "relative_error": worst_rel}


def _registry(case: FailureCase, adapter: Adapter | None) -> Any:
    from hfadapt.adapters.registry import Registry, discover

    base = discover() if case.registry == "default" else Registry()
    left_out = set(case.without_adapters)
    adapters = [a for a in base.adapters if a.name not in left_out]
    if adapter is not None:
        # the graph takes the place of any adapter that patches the same code
        adapters = [a for a in adapters if a.target != adapter.target] + [adapter]
    return Registry(adapters=adapters)


def _device_run(case: FailureCase, adapter: Adapter | None) -> tuple[Any, list[str], str]:
    """(the run, the modules the graph applied to, how the outputs were had). In compiled mode a
    model that still fails on other fingerprints does not lower at all: its report is the
    compiled one, and its outputs come from an eager audit run (every op judged, none refused),
    so that the graph's numbers can still be compared end to end."""
    from hfadapt.agent.models import case_model
    from hfadapt.errors import SpyreLoweringError
    from hfadapt.spyre.runner import run_on_device

    def one(execution: str) -> tuple[Any, list[str]]:
        cm = case_model(case.model)
        handle = _registry(case, adapter).apply(cm.model)
        applied = handle.applied.get(adapter.name, []) if adapter is not None else []
        dtype = getattr(torch, case.run_dtype)
        inputs = {k: _rounded(v, dtype) for k, v in cm.inputs.items()}
        run = run_on_device(
            cm.model, inputs, execution=execution, dtype=dtype, profile=case.profile, collect=True
        )
        return run, applied

    try:
        run, applied = one(case.execution)
        return run, applied, case.execution
    except SpyreLoweringError as exc:  # compiled mode refuses the whole graph: its report says why
        if exc.report is None:
            raise
        audit, applied = one("eager")
        audit.report = exc.report
        return audit, applied, "eager audit (the compiled graph does not lower: other violations)"


def step_device(proof: Proof, case: FailureCase) -> StepReport:
    assert proof.adapter is not None
    at_module = module_on_device(proof, case)
    output: dict[str, Any] = {"module": at_module, "host_share": proof.host_share}
    if not at_module["ok"]:
        why = at_module.get("why") or (
            f"on the device at the module: min cosine {at_module['min_cosine']:.4f} (>= "
            f"{MODULE_COSINE_MIN}), relative error {at_module['relative_error']:.3g} (<= {MODULE_REL_ERR_MAX})"
        )
        return StepReport("device", "fail", why, output)
    share = proof.host_share
    if share.get("compute_nodes") and share.get("host_nodes") == share.get("compute_nodes"):
        return StepReport(
            "device",
            "fail",
            "every arithmetic op of the graph runs on the host: that is a CPU fallback, not a rewrite the device runs",
            output,
        )
    if not case.model:
        return StepReport("device", "skip", "this case names no model to run on the device", output)
    fp = case.fingerprint
    before, _, _ = _device_run(case, None)
    after, applied, outputs_from = _device_run(case, proof.adapter)
    proof.device_outputs = after.outputs
    base_fps = set(before.report.fingerprints())
    remaining = [v for v in after.report.violations if case.is_this(v)]
    new = [
        v for v in after.report.violations if v.fingerprint() not in base_fps and v not in remaining
    ]
    in_baseline = any(case.is_this(v) for v in before.report.violations)
    output.update(
        fingerprint=fp,
        in_baseline=in_baseline,
        applied_to=applied[:20],
        graph_runs=proof.method.runs,
        graph_fallbacks=proof.method.fallbacks,
        baseline_violations=len(before.report.violations),
        violations=len(after.report.violations),
        remaining=[str(v) for v in remaining[:5]],
        new=[str(v) for v in new[:10]],
        report=after.report.summary(),
        outputs_from=outputs_from,
    )
    host = f"{share['host_nodes']} of {share['compute_nodes']} arithmetic ops on the host"
    if not in_baseline:
        return StepReport(
            "device",
            "fail",
            f"fingerprint {fp} did not occur without the graph; nothing to remove",
            output,
        )
    if not applied:
        return StepReport(
            "device", "fail", "the graph applied to no module of the case's model", output
        )
    if remaining:
        return StepReport(
            "device",
            "fail",
            f"fingerprint {fp} still occurs with the graph: {remaining[0]}",
            output,
        )
    if new:
        return StepReport(
            "device",
            "fail",
            f"the graph brings {len(new)} new violation(s); first: {new[0]}",
            output,
        )
    summary = (
        f"fingerprint {fp} gone, no new violation ({after.report.summary()}); {host}; at the "
        f"module min cosine {at_module['min_cosine']:.5f}, relative error {at_module['relative_error']:.2g}"
    )
    return StepReport("device", "pass", summary, output)


# -- end to end -----------------------------------------------------------------------------------


def step_end_to_end(proof: Proof, case: FailureCase) -> StepReport:
    from hfadapt.adapters.registry import Registry
    from hfadapt.agent.models import case_model

    assert proof.adapter is not None
    if not case.model:
        return StepReport("end_to_end", "skip", "this case names no model to judge end to end")
    cm = case_model(case.model)
    stock = run_forward(cm.model, cm.inputs)
    adapted = copy.deepcopy(cm.model)
    runs_before = proof.method.runs
    Registry(adapters=[proof.adapter]).apply(adapted)  # enabled: the graph runs on the CPU too
    cpu = run_forward(adapted, cm.inputs)
    cpu_cos = token_cosine(stock, cpu, cm.mask)
    output: dict[str, Any] = {
        "cpu_vs_stock_min_token_cosine": cpu_cos,
        "cpu_threshold": CPU_COSINE_MIN,
        "graph_runs_on_cpu": proof.method.runs - runs_before,
    }
    if proof.method.runs == runs_before:
        return StepReport(
            "end_to_end",
            "fail",
            "the graph did not run in the model (every call fell back to the stock code)",
            output,
        )
    if not cpu_cos >= CPU_COSINE_MIN:
        return StepReport(
            "end_to_end",
            "fail",
            f"CPU with the graph vs stock: min per-token cosine {cpu_cos:.6f} < {CPU_COSINE_MIN}",
            output,
        )
    if proof.device_outputs is None:
        return StepReport(
            "end_to_end",
            "fail",
            "no device output to compare (the device step did not run)",
            output,
        )
    dev_cos = token_cosine(stock, proof.device_outputs, cm.mask)
    dev_rel = relative_error(stock, proof.device_outputs, cm.mask)
    output.update(
        device_vs_cpu_min_token_cosine=dev_cos,
        device_threshold=DEVICE_COSINE_MIN,
        device_relative_error=dev_rel,
        device_relative_error_max=DEVICE_REL_ERR_MAX,
    )
    if not dev_cos >= DEVICE_COSINE_MIN:
        return StepReport(
            "end_to_end",
            "fail",
            f"device vs CPU reference: min per-token cosine {dev_cos:.6f} < {DEVICE_COSINE_MIN}",
            output,
        )
    if not dev_rel <= DEVICE_REL_ERR_MAX:
        return StepReport(
            "end_to_end",
            "fail",
            f"device vs CPU reference: relative error {dev_rel:.4f} > {DEVICE_REL_ERR_MAX}",
            output,
        )
    summary = (
        f"CPU vs stock min token cosine {cpu_cos:.6f} >= {CPU_COSINE_MIN}; device vs CPU "
        f"{dev_cos:.6f} >= {DEVICE_COSINE_MIN}, relative error {dev_rel:.3g} <= {DEVICE_REL_ERR_MAX}"
    )
    return StepReport("end_to_end", "pass", summary, output)


PARENT_STEPS = ("graph", "equivalence", "device", "end_to_end")

__all__ = [
    "PARENT_STEPS",
    "Proof",
    "graph_call",
    "step_device",
    "step_end_to_end",
    "step_equivalence",
    "step_graph",
    "stock_callable",
    "trusted_example",
]
