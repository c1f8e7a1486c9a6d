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
  0.999), and on the device against the CPU reference (0.99, and a bounded relative error), or,
  when the same device run without the graph already misses those, no worse than that run.

The proofs are bounded (:func:`prove_bounded`). Sizes first: a graph may declare no size (an
input's, a symbol's upper bound) beyond ``SIZE_FACTOR`` times the largest extent the case's own
calls and the fresh sizes need, and before the graph runs on a call it is run on fake tensors
(shapes only, no memory): a tensor more than ``SIZE_FACTOR`` times the largest the stock code
makes on that call (or than its largest input), counted in whole sticks, is refused before
anything is allocated. Then
the steps after ``graph`` run in a child process (hfadapt's own code on the graph as data) under
an address-space limit, a CPU-time limit and a wall-clock timeout with a kill
(:class:`ProofLimits`); a graph that reaches one fails the step with the limit it hit, and the
draft loop goes on to its next attempt. The child is forked from a server process that
multiprocessing's forkserver starts once per parent, a fresh interpreter that has only imported
this module (torch, Dynamo, the device), never run a tensor operation and never seen the
parent's state: each child starts where a fresh process would be after its imports (about 3 s
of a core on the project's machine, which every proof used to pay), and is given the parent's
environment as it is at the proof."""

from __future__ import annotations

import copy
import math
import multiprocessing
import os
import pkgutil
import resource
import secrets
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hfadapt import isolation, noise, settings
from hfadapt import torch_internals as ti
from hfadapt.adapters.api import STICK, Adapter
from hfadapt.adapters.equivalence import ATOL, RTOL, compare_outputs, prove_equivalent
from hfadapt.adapters.graph_adapter import (
    GraphMethod,
    graph_adapter,
    load_graph_adapter,
    module_attributes,
)
from hfadapt.agent.cases import FailureCase, captured_example, stock_call
from hfadapt.agent.defect_cases import DEFECT_MATCH
from hfadapt.agent.end_to_end import (
    CPU_COSINE_MIN,
    judge_device,
    run_forward,
    token_cosine,
)
from hfadapt.agent.graph_rules import static_rule
from hfadapt.agent.sandbox import StepReport
from hfadapt.errors import GraphError
from hfadapt.graphs import GraphArtifact, GraphProgram
from hfadapt.graphs.capture import call_template, module_tensors
from hfadapt.graphs.reads import read_value, record_reads

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import ForkServerContext
    from multiprocessing.process import BaseProcess

    from hfadapt.adapters.registry import Registry
    from hfadapt.spyre.rules.lowering_report import DefectFiring

PROOF_SEEDS = (0, 1, 2)
FRESH_BATCHES = (1, 8)
MAX_FRESH_LEN = 1024
MAX_FRESH_ELEMENTS = 2**24
MODULE_COSINE_MIN = 0.99
MODULE_REL_ERR_MAX = 0.1  # the module on the device: DL16 rounding and the card's numerics
_READ_NAME = __import__("re").compile(r"^[A-Za-z0-9_.]{1,200}$")
# A graph's sizes against what the case needs: at most this many times the largest extent of
# the case's calls (and the fresh sizes), and no tensor more than this many times the largest
# tensor the stock code makes on the same call, both counted as the device lays them out (the
# last two dimensions padded to whole sticks: a stick-padding rewrite of a small call, head_dim
# 32 -> 64 and 7 keys -> 64, is what the device needs, not a blow-up).
SIZE_FACTOR = 16
# Lengths drawn at proof time (secure random) over the model's whole range, besides the fixed
# fresh sizes: a graph right only at predictable lengths meets lengths it could not predict.
DRAWN_LENGTHS = 4
# Every reduced precision a graph runs in: its error against float64 may exceed the stock
# code's in the same dtype by at most this factor (plus one unit of the dtype's eps).
LOW_DTYPES = ("bfloat16", "float16")
LOW_DTYPE_FACTOR = 4.0


@dataclass(frozen=True)
class ProofLimits:
    """What the proof of one graph may use: ``memory_mb`` of address space beyond what the
    child process holds once it has imported hfadapt, ``cpu_seconds`` of CPU time, and
    ``wall_seconds`` before it is killed. ``in_child=False`` runs the steps in this process,
    unbounded (for debugging only)."""

    memory_mb: int = 4096
    cpu_seconds: int = 1800
    wall_seconds: float = 1800.0
    in_child: bool = True


DEFAULT_LIMITS = ProofLimits()


@dataclass
class Proof:
    """What the parent established about one graph, step by step."""

    program: GraphProgram | None = None
    adapter: Adapter | None = None
    reads: dict[str, Any] = field(default_factory=dict)
    host_share: dict[str, Any] = field(default_factory=dict)
    device_outputs: Any = None
    baseline_outputs: Any = None  # the same device run without the graph
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
    """The stock code at ``module:Class.method`` or ``module:function`` as ``call(module,
    *args, **kwargs)`` (trusted library code, imported here; :func:`cases.stock_call`)."""
    return stock_call(target)


def graph_call(program: GraphProgram) -> Callable[..., Any]:
    """``fn(module, *args, **kwargs)`` running the graph; raises when the call does not fit."""

    def run(module: torch.nn.Module, *args: object, **kwargs: object) -> Any:
        bound = program.bind(module, args, kwargs)
        if isinstance(bound, str):
            raise GraphError(f"the graph does not take this call: {bound}")
        return program.run(bound)

    return run


# -- graph ----------------------------------------------------------------------------------------


def step_graph(
    files: dict[str, bytes],
    case: FailureCase,
    name: str,
    rule: str,
    draft_reads: object,
    *,
    build: bool = True,
    static: bool = True,
) -> tuple[StepReport, Proof]:
    """``build=False``: the graph's fx modules are not built (the parent, which never runs the
    graph: the steps that do run in the child). ``static``: the static rules against the stock
    code's graph (:mod:`hfadapt.agent.graph_rules`; the child, which the parent has already
    checked, skips them)."""
    proof = Proof()
    if "graph.json" not in files:
        return StepReport("graph", "fail", "the sandbox handed back no graph"), proof
    try:
        artifact = GraphArtifact.from_bytes(files["graph.json"], files.get("constants.safetensors"))
        program = GraphProgram(artifact, prebuild=build)
    except GraphError as exc:
        return StepReport("graph", "fail", f"the graph does not validate: {exc.one_line()}"), proof
    module, args, kwargs = trusted_example(case)(0)
    module = module.float().eval()
    args_t, kwargs_t, _ = call_template(tuple(args), dict(kwargs))
    if (args_t, kwargs_t) != (artifact.call_args, artifact.call_kwargs):
        return StepReport(
            "graph", "fail", "the graph was captured for another call than the case's"
        ), proof
    too_big = oversized(artifact, module, args, kwargs)
    if too_big:
        return StepReport("graph", "fail", too_big, {"size_factor": SIZE_FACTOR}), proof
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
    for path, value in module_attributes(module).items():
        reads.setdefault(path, value)
    static_output: dict[str, Any] = {}
    if static:
        key = f"{case.target}|{case.example}|{case.example_file}"
        stock = stock_callable(case.target or "")
        why, static_output = static_rule(artifact, key, stock, module, tuple(args), dict(kwargs))
        if why:
            return StepReport("graph", "fail", why, static_output), proof
    proof.program, proof.reads = program, dict(sorted(reads.items()))
    proof.host_share = program.host_share()
    proof.adapter = graph_adapter(
        program,
        name=name,
        target=case.target or "",
        rule=rule,
        reads=proof.reads,
        call_site=case.call_site,
    )
    counts = program.op_counts()
    output = {
        "nodes": len(artifact.nodes),
        "ops": dict(sorted(counts.items(), key=lambda kv: -kv[1])[:30]),
        "host_share": proof.host_share,
        "conditions": proof.reads,
        "symbols": {k: list(v) for k, v in artifact.symbols.items()},
        **static_output,
    }
    summary = (
        f"{len(artifact.nodes)} ATen nodes, every op in the allowlist; applies where "
        f"{len(proof.reads)} attribute(s) match; {proof.host_share['host_nodes']} of "
        f"{proof.host_share['compute_nodes']} arithmetic ops on the host"
    )
    return StepReport("graph", "pass", summary, output), proof


# -- sizes --------------------------------------------------------------------------------------


def extent_limit(module: torch.nn.Module, args: object, kwargs: object) -> int:
    """The largest size a graph may declare for this case: ``SIZE_FACTOR`` times the largest
    extent (or element count) among the module's tensors, the call's and the fresh sizes."""
    tensors = [t for _, t in module_tensors(module).values()] + _tensors((args, kwargs))
    largest = max([t.numel() for t in tensors] + [MAX_FRESH_LEN, max(FRESH_BATCHES)])
    return SIZE_FACTOR * largest


def oversized(
    artifact: GraphArtifact, module: torch.nn.Module, args: object, kwargs: object
) -> str:
    """Why the graph's declared sizes exceed what the case needs ("" when they do not)."""
    limit = extent_limit(module, args, kwargs)
    for i in artifact.inputs:
        for size in i.shape:
            if isinstance(size, int) and size > limit:
                return (
                    f"input {i.name} declares size {size}, more than {limit} ({SIZE_FACTOR}x the "
                    "largest extent the case's calls and fresh sizes need)"
                )
    for name, (lo, hi) in artifact.symbols.items():
        bound = hi if hi is not None else lo
        if bound > limit:
            return (
                f"size {name} is bounded at {bound}, more than {limit} ({SIZE_FACTOR}x the "
                "largest extent the case's calls and fresh sizes need)"
            )
    return ""


def laid_out(t: torch.Tensor) -> int:
    """The element count of ``t`` as the device lays it out: its last dimension padded to a
    whole stick, and the one before it (a sequence: layout.sequence_padding) too."""
    shape = list(t.shape)
    for i in range(max(0, len(shape) - 2), len(shape)):
        shape[i] = -(-shape[i] // STICK) * STICK
    return math.prod(shape)


class _Largest:
    """Records the element count (:func:`laid_out`) of the largest tensor the code run inside
    it makes."""

    def __init__(self) -> None:
        owner = self
        self.numel = 0

        class Mode(ti.torch_dispatch_mode()):  # type: ignore[misc]
            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                out = func(*args, **(kwargs or {}))
                for t in _tensors(out):
                    owner.numel = max(owner.numel, laid_out(t))
                return out

        self.mode: Any = Mode()

    def __enter__(self) -> _Largest:
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.mode.__exit__(*exc)


def fake_oversized(
    program: GraphProgram,
    module: torch.nn.Module,
    args: tuple[object, ...],
    kwargs: dict[str, object],
    stock_largest: int,
) -> str:
    """Runs the graph on fake tensors (shapes only: nothing allocated) for this call; why it
    must not run for real ("" when every tensor it makes is within ``SIZE_FACTOR`` times the
    stock code's largest on the call, or its largest input, both :func:`laid_out`). A graph the
    fake run cannot follow is left to the child's limits."""
    from hfadapt.graphs import values

    bound = program.bind(module, args, kwargs)
    if isinstance(bound, str):
        return ""  # the real run says why the call does not fit
    art = program.artifact
    largest_in = max([laid_out(t) for t in bound.tensors] + [1])
    limit = SIZE_FACTOR * max(stock_largest, largest_in)
    try:
        mode = ti.fake_tensor_mode()
        given = iter(bound.tensors)
        env: list[Any] = [
            mode.from_tensor(art.constants[i.name] if i.kind == "constant" else next(given))
            for i in art.inputs
        ]

        def sub(v: object) -> Any:
            if isinstance(v, values.Ref):
                return env[v.index]
            if isinstance(v, values.Symbol):
                return v.resolve(bound.dtype, bound.device)
            if isinstance(v, list):
                return [sub(x) for x in v]
            if isinstance(v, tuple):
                return tuple(sub(x) for x in v)
            if isinstance(v, dict):
                return {k: sub(x) for k, x in v.items()}
            return v

        with mode:
            for i, (node, fn) in enumerate(zip(art.nodes, program.fns, strict=True)):
                out = fn(*sub(node.args), **sub(node.kwargs))
                for t in _tensors(out):
                    if t.numel() > limit:
                        return (
                            f"node {i} ({node.op}) makes a tensor of shape {list(t.shape)} "
                            f"({t.numel()} elements), more than {limit} ({SIZE_FACTOR}x the largest "
                            "the stock code makes on this call, laid out in whole sticks): "
                            "refused before it ran"
                        )
                env.append(out)
    except Exception:
        return ""
    return ""


# -- equivalence ----------------------------------------------------------------------------------


def _f64(value: object) -> Any:
    if isinstance(value, torch.Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_f64(v) for v in value)
    if isinstance(value, dict):
        return {k: _f64(v) for k, v in value.items()}
    return value


def _resize(t: torch.Tensor, dim: int, size: int, g: torch.Generator) -> torch.Tensor:
    if not t.is_floating_point() and 2 <= size < t.shape[dim]:
        # Shortened, an integer tensor keeps its last position: cut at the front, a padded
        # attention mask's row would lose its padding, and transformers' mask utilities answer
        # a row without padding with no mask at all (None), a data-dependent shortcut that no
        # captured graph can take; fresh sizes test shapes, not another kind of input.
        last = t.narrow(dim, t.shape[dim] - 1, 1)
        return torch.cat([t.narrow(dim, 0, size - 1), last], dim=dim).contiguous()
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
    value: object, batch: tuple[int, int], seq: tuple[int, int] | None, g: torch.Generator
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


def batched_tensor(given: tuple[object, ...]) -> torch.Tensor | None:
    """The call's batched tensor: the first of two or more dimensions whose first is not 1 (a
    leading 1 is a broadcast table's, such as RoFormer's [1, 1, n, d] sinusoidal positions),
    else the first of two or more dimensions."""
    tensors = [a for a in given if isinstance(a, torch.Tensor) and a.dim() >= 2]
    return next((t for t in tensors if t.shape[0] != 1), tensors[0] if tensors else None)


def fresh_sizes(
    module: torch.nn.Module, args: tuple[object, ...]
) -> tuple[list[tuple[int, int | None]], dict[str, object]]:
    """(batch, length) pairs to prove at, and the bound stated with them. Batch is dim 0 of the
    call's first tensor, length its second-to-last dim (when it has three or more)."""
    first = batched_tensor(args)
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
        drawn = drawn_lengths(maximum or MAX_FRESH_LEN, s0)
        pairs += [(1, s) for s in drawn]
        bound.update(lengths=lengths, drawn=drawn, model_maximum=maximum, cap=MAX_FRESH_LEN)
    return pairs, bound


def drawn_lengths(top: int, taken: int) -> list[int]:
    """``DRAWN_LENGTHS`` lengths the draft cannot predict: drawn at proof time from the
    system's secure random source over ``2..top`` (the model's maximum), one of them short
    (up to 64) and at least one odd; never ``taken`` (the case's own length)."""
    rng = secrets.SystemRandom()
    top = max(top, 3)
    out: set[int] = set()
    while len(out) < min(DRAWN_LENGTHS, top - 2):
        hi = min(top, 64) if not out else top
        n = rng.randint(2, hi)
        if len(out) == DRAWN_LENGTHS - 1 and not any(x % 2 for x in out):
            n |= 1
            n = min(n, top if top % 2 else top - 1)
        if n != taken:
            out.add(n)
    return sorted(out)


def _fresh_calls(
    example: Callable[[int], Any],
) -> tuple[list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]], dict[str, Any]]:
    module, args, kwargs = example(0)
    module = module.double().eval()
    args, kwargs = _f64(tuple(args)), _f64(dict(kwargs))
    given = (*args, *kwargs.values())  # a module-level function's call passes them by name
    first = batched_tensor(given)
    pairs, bound = fresh_sizes(module, given)
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


def _tensors(value: object) -> list[torch.Tensor]:
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


# Inputs shaped like trained activations: a few channels far above the row's RMS, one channel
# alone (a row's peak at the most its width allows, sqrt(width) times its RMS), and magnitudes
# near sqrt(eps) of the common eps 1e-5/1e-6 (variance near eps for norm-like code).
SHAPED_VARIANTS = ("outliers", "spike", "tiny-1e-3", "tiny-3e-4")


def _shape_like(t: torch.Tensor, variant: str, rng: secrets.SystemRandom) -> torch.Tensor:
    if not t.is_floating_point() or t.dim() == 0 or t.numel() < 2:
        return t.clone()
    x = t.double().clone()
    std = float(x.std()) or 1.0
    width = x.shape[-1]
    if variant == "outliers":  # 1-3 channels 20-100x the rest
        for i in rng.sample(range(width), max(1, min(3, width // 16))):
            x[..., i] *= rng.uniform(20.0, 100.0)
    elif variant == "spike":  # one channel carries the row
        i = rng.randrange(width)
        x = x * 1e-4
        x[..., i] *= 1e4
    else:
        x = x / std * float(variant.split("-", 1)[1])
    return x.to(t.dtype)


def _map_args(value: object, f: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return f(value)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_map_args(v, f) for v in value)
    if isinstance(value, dict):
        return {k: _map_args(v, f) for k, v in value.items()}
    return value


def _shaped_call(
    args: object, kwargs: object, variant: str, rng: secrets.SystemRandom
) -> tuple[Any, Any]:
    def shape(t: torch.Tensor) -> torch.Tensor:
        return _shape_like(t, variant, rng)

    return _map_args(args, shape), _map_args(kwargs, shape)


def shaped_inputs(
    run: Callable[..., Any], stock: Callable[..., Any], example: Callable[[int], Any]
) -> tuple[list[dict[str, Any]], str]:
    """The graph against the stock code in float64 on :data:`SHAPED_VARIANTS` of the case's
    inputs (channels chosen at proof time); (rows, why the first failed or "")."""
    rng = secrets.SystemRandom()
    rows: list[dict[str, Any]] = []
    for seed in PROOF_SEEDS:
        module, args, kwargs = example(seed)
        module = module.double().eval()
        args, kwargs = _f64(tuple(args)), _f64(dict(kwargs))
        for variant in SHAPED_VARIANTS:
            a, k = _shaped_call(args, kwargs, variant, rng)
            with torch.no_grad():
                try:
                    ref = stock(copy.deepcopy(module), *a, **k)
                except Exception:  # the stock code does not take these values
                    continue
                try:
                    out = run(copy.deepcopy(module), *a, **k)
                except GraphError as exc:
                    return rows, f"{variant} inputs (seed {seed}): {exc.one_line()}"
            ok, abs_err, rel_err, why = compare_outputs(ref, out, RTOL, ATOL)
            row = {"input": f"{variant} seed {seed}", "ok": ok, "max_rel_err": rel_err}
            rows.append(row | {"max_abs_err": abs_err})
            if not ok:
                return rows, (
                    f"float64 on {variant} inputs (seed {seed}): max rel err {rel_err:.3g} > "
                    f"rtol {RTOL:g} ({why})"
                )
    return rows, ""


def _low_error(ref: object, got: object) -> float:
    """Max abs error of ``got`` against the float64 ``ref``, over its largest magnitude, on
    the elements where ``ref`` is finite (inf where ``got`` is not finite there)."""
    refs, gots = _tensors(ref), _tensors(got)
    if len(refs) != len(gots):
        return math.inf
    worst = 0.0
    for r, g in zip(refs, gots, strict=True):
        if not r.is_floating_point():
            if not torch.equal(r, g.to(r.dtype)):
                return math.inf
            continue
        if tuple(r.shape) != tuple(g.shape):
            return math.inf
        r64, g64 = r.double(), g.double()
        finite = torch.isfinite(r64)
        if not bool(finite.any()):
            continue
        if not bool(torch.isfinite(g64[finite]).all()):
            return math.inf
        scale = float(r64[finite].abs().max()) or 1.0
        worst = max(worst, float((g64[finite] - r64[finite]).abs().max()) / scale)
    return worst


def low_dtypes(
    run: Callable[..., Any], stock: Callable[..., Any], example: Callable[[int], Any]
) -> tuple[list[dict[str, Any]], str]:
    """The graph and the stock code each in every reduced precision of :data:`LOW_DTYPES`, both
    against the stock code in float64 on the same rounded inputs: the graph's error may exceed
    the stock code's by at most ``LOW_DTYPE_FACTOR`` (plus the dtype's eps). A graph that does
    not take the dtype falls back to the stock code where it is applied: noted, not failed."""
    rows: list[dict[str, Any]] = []
    rng = secrets.SystemRandom()
    for name in LOW_DTYPES:
        dt = getattr(torch, name)
        for seed in PROOF_SEEDS:
            module, args, kwargs = example(seed)
            low = copy.deepcopy(module).float().to(dt).eval()
            for variant in ("random", "outliers"):
                a, k = _rounded(tuple(args), dt), _rounded(dict(kwargs), dt)
                if variant != "random":
                    a, k = _shaped_call(a, k, variant, rng)
                label = f"{name} {variant} seed {seed}"
                with torch.no_grad():
                    try:
                        ref = stock(copy.deepcopy(low).double(), *_f64(a), **_f64(k))
                        mine = stock(copy.deepcopy(low), *a, **k)
                    except Exception as exc:
                        rows.append({"input": label, "skipped": f"stock: {type(exc).__name__}"})
                        continue
                    try:
                        out = run(copy.deepcopy(low), *a, **k)
                    except GraphError as exc:
                        rows.append({"input": label, "skipped": exc.one_line()[:200]})
                        continue
                stock_err, graph_err = _low_error(ref, mine), _low_error(ref, out)
                if not math.isfinite(stock_err):
                    rows.append({"input": label, "skipped": "the stock code is not finite"})
                    continue
                limit = LOW_DTYPE_FACTOR * stock_err + float(torch.finfo(dt).eps)
                ok = graph_err <= limit
                rows.append(
                    {"input": label, "ok": ok, "stock_err": stock_err, "graph_err": graph_err}
                )
                if not ok:
                    return rows, (
                        f"{label}: the graph's error against float64 is {graph_err:.3g}, the "
                        f"stock code's in {name} {stock_err:.3g} (allowed {limit:.3g}: "
                        f"{LOW_DTYPE_FACTOR:g}x plus eps)"
                    )
    return rows, ""


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
    module0, args0, kwargs0 = example(0)
    module0 = module0.double().eval()
    args0, kwargs0 = _f64(tuple(args0)), _f64(dict(kwargs0))
    with torch.no_grad(), _Largest() as largest:
        stock(copy.deepcopy(module0), *args0, **kwargs0)
    too_big = fake_oversized(proof.program, module0, args0, kwargs0, largest.numel)
    if too_big:
        return StepReport("equivalence", "fail", too_big, {"size_factor": SIZE_FACTOR})
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
                with _Largest() as largest:
                    ref = stock(copy.deepcopy(module), *args, **kwargs)
            except Exception as exc:  # the stock code does not take this size: nothing to prove
                rows.append(
                    {"input": label, "skipped": f"the stock code raises: {type(exc).__name__}"}
                )
                continue
            too_big = fake_oversized(proof.program, module, args, kwargs, largest.numel)
            if too_big:
                output["fresh"] = rows
                return StepReport("equivalence", "fail", f"{label}: {too_big}", output)
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
    shaped, why = shaped_inputs(run, stock, example)
    output["shaped"] = shaped
    if why:
        return StepReport("equivalence", "fail", why, output)
    low, why = low_dtypes(run, stock, example)
    output["dtypes"] = low
    if why:
        return StepReport("equivalence", "fail", why, output)
    proven = sum(1 for r in rows if r.get("ok"))
    lengths = sorted(set(bound.get("lengths") or []) | set(bound.get("drawn") or []))
    summary = (
        f"float64: {len(result.cases)} inputs, {sum(1 for r in shaped if r['ok'])} shaped like "
        f"trained activations (outliers, tiny) and {proven} fresh sizes within rtol {RTOL:g} "
        f"(max rel err {worst_rel:.3g}, max abs err {worst_abs:.3g}); controls identity, zero, "
        f"constant, scaled rejected; lengths {lengths} (drawn at random: "
        f"{bound.get('drawn') or []}); {', '.join(LOW_DTYPES)}: "
        f"{sum(1 for r in low if r.get('ok'))} inputs within {LOW_DTYPE_FACTOR:g}x the stock "
        "code's error"
    )
    return StepReport("equivalence", "pass", summary, output)


# -- device ---------------------------------------------------------------------------------------


def _rounded(value: object, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_rounded(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _rounded(v, dtype) for k, v in value.items()}
    return value


def _to(value: Any, device: torch.device | str) -> Any:
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
    from hfadapt.spyre.rules.tracking import tracking

    assert proof.program is not None
    dtype = getattr(torch, case.run_dtype)
    module, args, kwargs = trusted_example(case)(0)
    low = copy.deepcopy(module).float().to(dtype)
    args, kwargs = _rounded(tuple(args), dtype), _rounded(dict(kwargs), dtype)
    ref_module = copy.deepcopy(low).double()
    with torch.no_grad():
        ref = stock_callable(case.target or "")(ref_module, *_f64(args), **_f64(kwargs))
        # the stock code in the run dtype too: a value at the dtype's limit (a mask's
        # finfo.min) is compared with the same limit, not float64's
        ref_low = stock_callable(case.target or "")(copy.deepcopy(low), *args, **kwargs)
    spyre_device.register()
    dev = torch.device("spyre")
    with tracking(case.profile, mode="eager", collect=True) as report, torch.no_grad():
        on_dev = low.to(dev)
        out = graph_call(proof.program)(on_dev, *_to(args, dev), **_to(kwargs, dev))
        got = _to(out, "cpu")
    # what the device refused on this call's sizes (its numbers then are the audit's): the
    # feedback names it, a numeric failure alone would not say why
    met = [f"{v.rule_id} at {v.op}: {v.message}" for v in report.violations][:3]
    refs, outs = _tensors(ref), _tensors(got)
    if len(refs) != len(outs):
        return {
            "ok": False,
            "why": f"{len(outs)} outputs on the device, {len(refs)} from the stock code",
        }
    limit = float(torch.finfo(dtype).max) / 2  # past it, a value is a sentinel (a mask's)
    cos64, rel64 = _module_error(refs, outs, limit)
    cos_low, rel_low = _module_error(_tensors(ref_low), outs, limit)
    worst_cos, worst_rel = (cos64, rel64) if rel64 <= rel_low else (cos_low, rel_low)
    ok = worst_cos >= MODULE_COSINE_MIN and worst_rel <= MODULE_REL_ERR_MAX
    result: dict[str, Any] = {"ok": ok, "min_cosine": worst_cos, "relative_error": worst_rel}
    if met:
        result["violations"] = met
    return result


def _module_error(
    refs: list[torch.Tensor], outs: list[torch.Tensor], limit: float
) -> tuple[float, float]:
    """(min row cosine, worst relative error) of the device's outputs against ``refs``, both
    saturated at ``limit`` (a masked position's finfo.min, -inf on the card, counts as equal)."""
    if len(refs) != len(outs):
        return 0.0, math.inf
    worst_cos, worst_rel = 1.0, 0.0
    for r, o in zip(refs, outs, strict=True):
        if not r.is_floating_point():
            continue
        a = r.double().reshape(-1, r.shape[-1] if r.dim() else 1).clamp(-limit, limit)
        b = o.double().reshape(-1, o.shape[-1] if o.dim() else 1).clamp(-limit, limit)
        na, nb = a.norm(dim=-1), b.norm(dim=-1)
        cos = (a * b).sum(-1) / (na * nb).clamp(min=1e-300)
        cos = torch.where((na < 1e-12) & (nb < 1e-12), torch.ones_like(cos), cos)
        worst_cos = min(worst_cos, float(cos.min()) if cos.numel() else 1.0)
        denom = float(a.norm())
        rel = float((b - a).norm()) / denom if denom > 0 else float((b - a).norm())
        worst_rel = max(worst_rel, rel if math.isfinite(rel) else math.inf)
    return worst_cos, worst_rel


def case_registry(case: FailureCase, adapter: Adapter | None, proving: str = "") -> Registry:
    """The case's registry (its baseline: the adapters it left out stay out, and so does the
    adapter being proven, which a re-proof finds among the accepted ones), with ``adapter``."""
    from hfadapt.adapters.registry import Registry, discover

    base = discover() if case.registry == "default" else Registry()
    left_out = set(case.without_adapters) | ({proving} if proving else set())
    adapters = [a for a in base.adapters if a.name not in left_out]
    if adapter is not None:
        # the graph takes the place of any adapter that patches the same code
        adapters = [a for a in adapters if a.target != adapter.target] + [adapter]
    return Registry(adapters=adapters)


def _device_run(
    case: FailureCase, adapter: Adapter | None, proving: str = ""
) -> tuple[Any, list[str], str]:
    """(the run, the modules the graph applied to, how the outputs were had). In compiled mode a
    model that still fails on other fingerprints does not lower at all: its report is the
    compiled one, and its outputs come from an eager audit run (every op judged, none refused),
    so that the graph's numbers can still be compared end to end."""
    from hfadapt.agent.models import case_model
    from hfadapt.errors import SpyreLoweringError
    from hfadapt.spyre.runner import run_on_device

    def one(execution: str) -> tuple[Any, list[str]]:
        cm = case_model(case.model)
        handle = case_registry(case, adapter, proving).apply(cm.model)
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


def _module_refusal(
    proof: Proof, at_module: dict[str, Any], output: dict[str, Any]
) -> StepReport | None:
    """The device step's refusal on the module alone (its numbers there, or every arithmetic op
    on the host), or None."""
    if not at_module["ok"]:
        why = at_module.get("why") or (
            f"on the device at the module: min cosine {at_module['min_cosine']:.4f} (>= "
            f"{MODULE_COSINE_MIN}), relative error {at_module['relative_error']:.3g} (<= {MODULE_REL_ERR_MAX})"
        )
        if at_module.get("violations"):
            why += f"; on this call the device also refused: {at_module['violations'][0]}"
        return StepReport("device", "fail", why, output)
    share = proof.host_share
    if share.get("compute_nodes") and share.get("host_nodes") == share.get("compute_nodes"):
        return StepReport(
            "device",
            "fail",
            "every arithmetic op of the graph runs on the host: that is a CPU fallback, not a rewrite the device runs",
            output,
        )
    return None


def step_device(proof: Proof, case: FailureCase) -> StepReport:
    assert proof.adapter is not None
    at_module = module_on_device(proof, case)
    output: dict[str, Any] = {"module": at_module, "host_share": proof.host_share}
    refused = _module_refusal(proof, at_module, output)
    if refused is not None:
        return refused
    share = proof.host_share
    if not case.model:
        return StepReport("device", "skip", "this case names no model to run on the device", output)
    if case.match == DEFECT_MATCH:
        return _defect_gone(proof, case, output, at_module)
    fp = case.fingerprint
    before, _, _ = _device_run(case, None, proof.adapter.name)
    after, applied, outputs_from = _device_run(case, proof.adapter, proof.adapter.name)
    proof.device_outputs = after.outputs
    proof.baseline_outputs = before.outputs
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
            f"the graph brings {len(new)} new violation(s) ({len(before.report.violations)} "
            f"without it, {len(after.report.violations)} with it); first: {new[0]}",
            output,
        )
    summary = (
        f"fingerprint {fp} gone, no new violation ({len(before.report.violations)} without the "
        f"graph; with it {after.report.summary()}); {host}; at the "
        f"module min cosine {at_module['min_cosine']:.5f}, relative error {at_module['relative_error']:.2g}"
    )
    return StepReport("device", "pass", summary, output)


def _same_module(a: str, b: str) -> bool:
    """Module paths recorded on two runs (one may carry a wrapper's prefix) name one module."""
    return a == b or a.endswith("." + b) or b.endswith("." + a)


def _firing_text(f: DefectFiring) -> str:
    return f"{f.defect_id} in {f.module or 'the model'} ({f.module_class}, {f.op})"


def _defect_gone(
    proof: Proof, case: FailureCase, output: dict[str, object], at_module: dict[str, object]
) -> StepReport:
    """A silent device defect's case: the model compiled on the device without and with the
    graph; the defect no longer fires where the case found it, nothing new fires or fails, and
    the numbers of both runs against the CPU reference are stated."""
    from hfadapt.agent.models import case_model

    assert proof.adapter is not None
    defect, name = case.rule_id, proof.adapter.name
    before, _, _ = _device_run(case, None, name)
    after, applied, outputs_from = _device_run(case, proof.adapter, name)
    proof.device_outputs, proof.baseline_outputs = after.outputs, before.outputs
    where = [str(f.get("module", "")) for f in case.evidence.get("firings") or []]

    def here(f: DefectFiring) -> bool:
        return f.defect_id == defect and (
            not where or any(_same_module(f.module, m) for m in where)
        )

    fired_before = [f for f in before.report.defects if here(f)]
    remaining = [f for f in after.report.defects if here(f)]
    seen = {(f.defect_id, f.module) for f in before.report.defects}
    new_defects = [f for f in after.report.defects if (f.defect_id, f.module) not in seen]
    base_fps = set(before.report.fingerprints())
    new = [v for v in after.report.violations if v.fingerprint() not in base_fps]
    cm = case_model(case.model)
    verdict = judge_device(run_forward(cm.model, cm.inputs), after.outputs, before.outputs, cm.mask)
    output.update(
        defect=defect,
        fired_without=[_firing_text(f) for f in fired_before[:5]],
        fired_with=[_firing_text(f) for f in remaining[:5]],
        new_defects=[_firing_text(f) for f in new_defects[:5]],
        applied_to=applied[:20],
        graph_runs=proof.method.runs,
        graph_fallbacks=proof.method.fallbacks,
        baseline_violations=len(before.report.violations),
        violations=len(after.report.violations),
        new=[str(v) for v in new[:10]],
        report=after.report.summary(),
        outputs_from=outputs_from,
        **verdict.output(),
    )
    numbers = verdict.numbers()
    if not fired_before:
        why = f"device defect {defect} did not fire without the graph; nothing to remove"
        return StepReport("device", "fail", why, output)
    if not applied:
        return StepReport(
            "device", "fail", "the graph applied to no module of the case's model", output
        )
    if remaining:
        why = (
            f"device defect {defect} still fires with the graph: {_firing_text(remaining[0])} "
            f"({len(remaining)} firing(s), {len(fired_before)} without it); {numbers}"
        )
        return StepReport("device", "fail", why, output)
    if new or new_defects:
        first = str(new[0]) if new else _firing_text(new_defects[0])
        why = (
            f"the graph brings {len(new)} new violation(s) and {len(new_defects)} new defect "
            f"firing(s); first: {first}; {numbers}"
        )
        return StepReport("device", "fail", why, output)
    summary = (
        f"device defect {defect} no longer fires ({len(fired_before)} firing(s) without the "
        f"graph: {_firing_text(fired_before[0])}), no new violation or firing; {numbers}; at the "
        f"module min cosine {at_module['min_cosine']:.5f}, relative error "
        f"{at_module['relative_error']:.2g}"
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
    # enabled: the graph runs on the CPU too. A defect's graph was captured on the calls the
    # model makes with the case's other adapters (the device run's): they apply here as well.
    if case.match == DEFECT_MATCH:
        case_registry(case, proof.adapter).apply(adapted)
    else:
        Registry(adapters=[proof.adapter]).apply(adapted)
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
    verdict = judge_device(stock, proof.device_outputs, proof.baseline_outputs, cm.mask)
    output.update(verdict.output())
    if case.match == DEFECT_MATCH:  # a silent defect's draft must make the model better
        ok, text = verdict.better, verdict.better_text()
    else:
        ok, text = verdict.ok, verdict.text()
    if not ok:
        return StepReport("end_to_end", "fail", text, output)
    summary = f"CPU vs stock min token cosine {cpu_cos:.6f} >= {CPU_COSINE_MIN}; {text}"
    return StepReport("end_to_end", "pass", summary, output)


PARENT_STEPS = ("graph", "equivalence", "device", "end_to_end")
RUNNERS: dict[str, Callable[[Proof, FailureCase], StepReport]] = {
    "equivalence": step_equivalence,
    "device": step_device,
    "end_to_end": step_end_to_end,
}


# -- bounded: the steps after ``graph`` in a child process ----------------------------------------


def _one_line(exc: BaseException) -> str:
    from hfadapt.errors import HfadaptError

    if isinstance(exc, HfadaptError):
        return exc.one_line()
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}"


def _out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError)
        and ("can't allocate memory" in text or "out of memory" in text or "bad_alloc" in text)
    )


def run_steps(
    proof: Proof,
    case: FailureCase,
    steps: tuple[str, ...],
    *,
    skip_ok: bool = False,
    limits: ProofLimits | None = None,
    on_report: Callable[[StepReport], None] | None = None,
) -> list[StepReport]:
    """``steps`` in order, in this process, each timed; stops after the first that does not pass
    (a skip goes on when ``skip_ok``). A failure to allocate is the graph's: the step fails
    with the limit."""
    reports: list[StepReport] = []
    for step in steps:
        start = time.monotonic()
        try:
            report = RUNNERS[step](proof, case)
        except Exception as exc:  # a graph that breaks a proof is the graph's failure
            if limits is not None and _out_of_memory(exc):
                why = f"the proof exceeded {limits.memory_mb} MB ({_one_line(exc)[:200]})"
                report = StepReport(step, "fail", why, {"limit": "memory"})
            else:
                report = StepReport(step, "fail", _one_line(exc))
        report.seconds = round(time.monotonic() - start, 3)
        reports.append(report)
        if on_report is not None:
            on_report(report)
        if not (report.status == "pass" or (skip_ok and report.status == "skip")):
            break
    return reports


def _vm_bytes() -> int:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _limit_self(limits: ProofLimits) -> None:
    """The child's limits, set once hfadapt and torch are imported (their mappings are the
    baseline): ``memory_mb`` more address space, ``cpu_seconds`` more CPU time."""
    base = _vm_bytes()
    if base:
        cap = base + limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    used = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(used.ru_utime + used.ru_stime) + limits.cpu_seconds
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))


def child_main(conn: Connection, env: Mapping[str, str], hold: bool) -> None:
    """The child process (:func:`start_child`: forked from the forkserver): nothing of the parent's
    state but ``env``, the parent's environment at the proof. It takes a session of its own
    (the parent's kill takes it and anything it ran), receives the job on ``conn``, proves, and
    sends each report. With ``hold`` (the parent holds library messages back: a command without
    ``--verbose``, ``hfadapt.load``), it holds its own as well, from the job's unpickling on:
    its standard error is the parent's, where the device's warnings would bypass the command's
    one summary line; what it held goes back as counts (``noise.count_held``)."""
    import sys

    enter_child(env)
    held = noise.LibraryNoise(verbose=not hold)
    try:
        with held:
            job = conn.recv()
            sys.path[:] = [p for p in job["sys_path"] if isinstance(p, str)]
            _child(conn, job)
        if held.counts:
            conn.send(("held", dict(held.counts)))
    finally:
        conn.close()


def enter_child(env: Mapping[str, str]) -> None:
    """What a forked proof child does first: a session of its own, and ``env`` as its
    environment (the server's is the parent's when the server started)."""
    os.setsid()
    settings.replace_environment(env)


@cache
def _context() -> ForkServerContext:
    """multiprocessing's forkserver, its server preloading this module: started by the first
    proof of the process, each later proof a fork of it."""
    ctx: ForkServerContext = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def start_child(target: Callable[..., None], args: tuple[object, ...]) -> BaseProcess:
    """A started proof child running ``target(*args)``: forked from the forkserver, or, in a
    process forked from one that had started it (that server is the other process's child, out
    of this one's reach: multiprocessing raises ChildProcessError), a fresh interpreter."""
    child: BaseProcess = _context().Process(target=target, args=args, name="hfadapt-proof")
    try:
        child.start()
    except ChildProcessError:
        child = multiprocessing.get_context("spawn").Process(
            target=target, args=args, name="hfadapt-proof"
        )
        child.start()
    return child


def _child(conn: Connection, job: dict[str, Any]) -> None:
    """The graph step again (deterministic, it rebuilds the proof), then the steps asked for;
    each report is sent as it is made."""
    limits = ProofLimits(**job["limits"])
    case = FailureCase.from_dict(job["case"])
    _limit_self(limits)
    try:
        if "folder" in job:
            adapter = load_graph_adapter(Path(job["folder"]), proven=False)
            program = adapter.fn.program  # type: ignore[attr-defined]
            proof = Proof(program=program, adapter=adapter)
            proof.host_share = program.host_share()
        else:
            report, proof = step_graph(
                job["files"], case, job["name"], job["rule"], job["reads"], static=False
            )
            if report.status != "pass":
                conn.send(("report", asdict(report)))
                return

        def send(report: StepReport) -> None:
            conn.send(("report", asdict(report)))

        def started(step: str) -> None:
            conn.send(("start", step))

        for step in job["steps"]:
            started(step)
            (done,) = run_steps(proof, case, (step,), limits=limits, on_report=send)
            if not (done.status == "pass" or (job["skip_ok"] and done.status == "skip")):
                break
    except BaseException as exc:  # said to the parent, then the child ends
        why = f"the proof exceeded {limits.memory_mb} MB" if _out_of_memory(exc) else _one_line(exc)
        conn.send(("error", why))


def _death(code: int | None, limits: ProofLimits) -> str:
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return f"the proof exceeded {limits.cpu_seconds} s of CPU time"
    if code is not None and code < 0:
        sig = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        return (
            f"the proof's process was ended by {sig} (limits {limits.memory_mb} MB, "
            f"{limits.cpu_seconds} s CPU): most likely the proof exceeded {limits.memory_mb} MB"
        )
    return f"the proof's process ended with exit code {code} before reporting"


def prove_bounded(
    job: dict[str, Any],
    steps: tuple[str, ...],
    limits: ProofLimits,
    *,
    skip_ok: bool = False,
) -> list[StepReport]:
    """``steps`` for one graph in a child (:func:`start_child`) under ``limits``. ``job``: ``files``,
    ``case``, ``name``, ``rule`` and ``reads`` (a draft's graph: the graph step runs again in
    the child), or ``folder`` and ``case`` (a graph adapter folder). A child that hits a limit,
    is killed at the wall-clock timeout or dies fails the step it was in, with the reason."""
    import sys

    full = {**job, "steps": list(steps), "skip_ok": skip_ok, "limits": asdict(limits)}
    full["sys_path"] = list(sys.path)
    receive, theirs = multiprocessing.Pipe(duplex=True)
    start = time.monotonic()
    try:
        child = start_child(child_main, (theirs, settings.environment(), noise.holding_now()))
    finally:
        theirs.close()
    receive.send(full)
    reports: list[StepReport] = []
    current = steps[0] if steps else "proof"
    current_start = time.monotonic()
    why = ""
    try:
        while True:
            left = limits.wall_seconds - (time.monotonic() - start)
            if left <= 0:
                why = f"the proof exceeded {limits.wall_seconds:g} s (wall clock); it was stopped"
                break
            if not receive.poll(min(left, 0.5)):
                if child.exitcode is not None and not receive.poll(0):
                    why = why or _death(child.exitcode, limits)
                    break
                continue
            try:
                kind, body = receive.recv()
            except (EOFError, OSError):
                child.join(5)
                if child.exitcode != 0:
                    why = why or _death(child.exitcode, limits)
                break
            if kind == "start":
                current, current_start = body, time.monotonic()
            elif kind == "report":
                reports.append(StepReport(**body))
            elif kind == "error":
                why = body
            elif kind == "held":
                noise.count_held(body)
    finally:
        if child.exitcode is None:
            isolation.kill_group(child)
        child.join()
        child.close()
        receive.close()
    if why and not (reports and reports[-1].step == current):
        reports.append(
            StepReport(
                current,
                "fail",
                why,
                {"limits": asdict(limits)},
                round(time.monotonic() - current_start, 3),
            )
        )
    return reports


__all__ = [
    "DEFAULT_LIMITS",
    "PARENT_STEPS",
    "SIZE_FACTOR",
    "Proof",
    "ProofLimits",
    "fake_oversized",
    "graph_call",
    "oversized",
    "prove_bounded",
    "run_steps",
    "step_device",
    "step_end_to_end",
    "step_equivalence",
    "step_graph",
    "stock_callable",
    "trusted_example",
]
