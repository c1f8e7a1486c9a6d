"""Running a graph artifact: hfadapt's own program built from validated data.

:class:`GraphProgram` checks the artifact once (every op through the allowlist, every reference
to an earlier value, where each tensor lives), then builds a ``torch.fx`` graph from it for the
call's dtype and device: ATen ops are called directly, so the simulated device judges each one
in an eager run and ``torch.compile`` captures them in a compiled one. Runs of ops on the host
(a mask built with ``tril`` on the CPU, a cast done before the upload) are grouped into host
segments that run outside compiled graphs, as the card's runtime runs host work between
device graphs. The generated forward is written by torch.fx from these nodes: no text of the
artifact becomes code except literal values of the kinds :mod:`hfadapt.graphs.values` decodes.

:meth:`GraphProgram.bind` says whether a call fits the graph (the same call form and plain
values, tensors of the recorded dtypes and of sizes within the symbols' ranges); a call that
does not fit is not run through the graph."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hfadapt import torch_internals as ti
from hfadapt.graphs import ops, values
from hfadapt.graphs.artifact import GraphArtifact, Slot
from hfadapt.graphs.capture import module_tensors

HOST, DEVICE = "host", "device"
# Ops that make a tensor and say where (``device=``): on the host unless told the call's device.
_TRANSFER = "aten::_to_copy.default"


@dataclass
class BoundCall:
    """A call that fits the graph: its tensors in the graph's input order (constants
    excluded), the call's floating dtype and device."""

    tensors: list[torch.Tensor]
    dtype: torch.dtype
    device: torch.device


class HostSegment(torch.nn.Module):
    """Consecutive host nodes, run eagerly outside any compiled graph (``compiler.disable``)."""

    def __init__(
        self,
        steps: list[tuple[Callable[..., Any], Any, Any, int]],
        inputs: list[int],
        outputs: list[int],
    ) -> None:
        super().__init__()
        self.steps, self.input_ids, self.output_ids = steps, inputs, outputs

    @torch.compiler.disable
    def forward(self, *given: Any) -> tuple[Any, ...]:
        env: dict[int, Any] = dict(zip(self.input_ids, given, strict=True))

        def sub(v: object) -> Any:
            if isinstance(v, values.Ref):
                return env[v.index]
            if isinstance(v, list):
                return [sub(x) for x in v]
            if isinstance(v, tuple):
                return tuple(sub(x) for x in v)
            return v

        for fn, args, kwargs, out in self.steps:
            env[out] = fn(*sub(args), **{k: sub(x) for k, x in kwargs.items()})
        return tuple(env[i] for i in self.output_ids)


_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class GraphProgram:
    """A validated artifact, ready to run (thread-safe; one fx module per dtype and device)."""

    def __init__(self, artifact: GraphArtifact, *, prebuild: bool = True) -> None:
        """``prebuild=False``: the static facts only (placements, host share, op counts); the fx
        modules are built on first run (what a process that never runs the graph wants)."""
        self.artifact = artifact
        self.fns = [ops.resolve(n.op) for n in artifact.nodes]
        self.placement = self._placements()
        self._modules: dict[tuple[torch.dtype, str], torch.fx.GraphModule] = {}
        self._lock = threading.Lock()
        if prebuild:
            self._prebuild()

    def _prebuild(self) -> None:
        """Build the fx module for every floating dtype on the CPU and on the accelerator
        torch knows (the simulated device registers as PrivateUse1), so that no build, and no
        lock, happens while Dynamo traces a model that calls the graph: either would be a graph
        break, and on the card a break after a post-LayerNorm output is the handoff defect."""
        devices = [torch.device("cpu")]
        accelerator = ti.privateuse1_backend_name()
        if accelerator != "privateuseone":
            devices.append(torch.device(accelerator))
        for device in devices:
            for dtype in _FLOAT_DTYPES:
                self._modules[(dtype, str(device))] = self._build(dtype, device)

    # -- static facts -----------------------------------------------------------------------------

    def _placements(self) -> list[str | None]:
        """Where each value lives: inputs on the device (constants on the host), factory ops
        where their ``device=`` says (the host when it says nothing), transfers where they go,
        every other op where its tensor inputs are (the device if any is)."""
        art = self.artifact
        place: list[str | None] = [HOST if i.kind == "constant" else DEVICE for i in art.inputs]
        for node in art.nodes:
            dev = node.kwargs.get("device", _ABSENT)
            tensor_inputs = [
                place[r] for r in values.refs_in((node.args, node.kwargs)) if place[r] is not None
            ]
            if (
                node.op.startswith("sym::")
                or node.op.startswith("aten::sym_")
                or node.op in ops.ASSERT_OPS
            ):
                place.append(None)
            elif dev is not _ABSENT and dev is not None:
                place.append(DEVICE if isinstance(dev, values.Symbol) else HOST)
            elif not tensor_inputs:
                place.append(HOST)  # a factory with no device= makes its tensor on the CPU
            else:
                place.append(DEVICE if DEVICE in tensor_inputs else HOST)
        return place

    def _runs_on_host(self, i: int) -> bool:
        """Whether node ``i`` belongs to a host segment: it makes a host tensor, or it moves a
        tensor between the host and the device (the upload is the segment's last step)."""
        n_in = len(self.artifact.inputs)
        node = self.artifact.nodes[i]
        if self.placement[n_in + i] == HOST:
            return True
        if node.op == _TRANSFER:
            src = values.refs_in(node.args[:1])
            return bool(src) and self.placement[src[0]] == HOST
        return False

    def host_share(self) -> dict[str, Any]:
        """How much of the graph's arithmetic runs on the host: compute nodes (not views,
        casts, sizes or asserts) by where their result lives."""
        n_in = len(self.artifact.inputs)
        host = device = 0
        host_ops: list[str] = []
        for i, node in enumerate(self.artifact.nodes):
            if not ops.is_compute(node.op):
                continue
            if self.placement[n_in + i] == HOST:
                host += 1
                host_ops.append(node.op)
            elif self.placement[n_in + i] == DEVICE:
                device += 1
        total = host + device
        return {
            "compute_nodes": total,
            "host_nodes": host,
            "share": round(host / total, 4) if total else 0.0,
            "host_ops": sorted(set(host_ops))[:20],
        }

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.artifact.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    # -- binding a call ---------------------------------------------------------------------------

    def bind(
        self, module: torch.nn.Module, args: tuple[object, ...], kwargs: Mapping[str, object]
    ) -> BoundCall | str:
        """The call's tensors if ``module(*args, **kwargs)`` fits the graph, else why not."""
        art = self.artifact
        call_tensors: list[Any] = [None] * len(art.inputs_of("arg"))
        why = _match(art.call_args, tuple(args), call_tensors, "args")
        if why is None:
            if set(kwargs) != set(art.call_kwargs):
                why = f"keyword arguments {sorted(kwargs)} differ from the recorded {sorted(art.call_kwargs)}"
            else:
                for k, template in art.call_kwargs.items():
                    why = _match(template, kwargs[k], call_tensors, k)
                    if why:
                        break
        if why:
            return why
        state = module_tensors(module)
        ordered: list[torch.Tensor] = []
        arg_i = 0
        for spec in art.inputs:
            if spec.kind == "constant":
                continue
            if spec.kind == "arg":
                ordered.append(call_tensors[arg_i])
                arg_i += 1
                continue
            found = state.get(spec.name)
            if found is None or found[0] != spec.kind:
                return f"the module has no {spec.kind} {spec.name}"
            ordered.append(found[1])
        return self._check(ordered)

    def _check(self, tensors: list[torch.Tensor]) -> BoundCall | str:
        specs = [s for s in self.artifact.inputs if s.kind != "constant"]
        dtype = next(
            (
                t.dtype
                for t, s in zip(tensors, specs, strict=True)
                if s.dtype == values.DTYPE_SYMBOL
            ),
            None,
        )
        if dtype is not None and not dtype.is_floating_point:
            return f"the call's tensors are {dtype}, not floating point"
        device = tensors[0].device if tensors else torch.device("cpu")
        sizes: dict[str, int] = {}
        for t, spec in zip(tensors, specs, strict=True):
            want = dtype if spec.dtype == values.DTYPE_SYMBOL else values.DTYPES[spec.dtype]
            if t.dtype != want:
                return f"{spec.name} is {t.dtype}, the graph takes {want}"
            if t.device != device:
                return f"{spec.name} is on {t.device}, other inputs on {device}"
            if t.dim() != len(spec.shape):
                return f"{spec.name} has {t.dim()} dimensions, the graph takes {len(spec.shape)}"
            for size, want_size in zip(t.shape, spec.shape, strict=True):
                if isinstance(want_size, int):
                    if size != want_size:
                        return f"{spec.name} has size {list(t.shape)}, the graph takes {list(spec.shape)}"
                elif sizes.setdefault(want_size, int(size)) != size:
                    return f"{spec.name}: size {want_size} is {size} here, {sizes[want_size]} elsewhere"
        for name, size in sizes.items():
            lo, hi = self.artifact.symbols[name]
            # export assumes every dynamic size is at least 2 ("0/1 specialization"); the proofs
            # run size 1 too, so a lower bound of 2 admits 1.
            if size < min(lo, 1) or (lo > 2 and size < lo) or (hi is not None and size > hi):
                return f"size {name} = {size} is outside the graph's range [{lo}, {hi if hi is not None else 'inf'}]"
        return BoundCall(tensors, dtype or torch.float32, device)

    # -- running ------------------------------------------------------------------------------

    def run(self, bound: BoundCall) -> Any:
        return self.module_for(bound.dtype, bound.device)(*bound.tensors)

    def module_for(self, dtype: torch.dtype, device: torch.device) -> torch.fx.GraphModule:
        key = (dtype, str(device))
        found = self._modules.get(key)  # the hot path takes no lock (and stays traceable)
        if found is None:
            with self._lock:
                found = self._modules.get(key)
                if found is None:
                    found = self._modules[key] = self._build(dtype, device)
        return found

    @torch.compiler.disable
    def _build(self, dtype: torch.dtype, device: torch.device) -> torch.fx.GraphModule:
        art = self.artifact
        n_in = len(art.inputs)
        root = torch.nn.Module()
        graph = torch.fx.Graph()
        env: dict[int, Any] = {}
        for i, spec in enumerate(art.inputs):
            if spec.kind == "constant":
                root.register_buffer(f"const{i}", art.constants[spec.name], persistent=False)
                env[i] = graph.get_attr(f"const{i}")
            else:
                env[i] = graph.placeholder(f"in{i}")

        def sub(v: object) -> Any:
            if isinstance(v, values.Ref):
                return env[v.index]
            if isinstance(v, values.Symbol):
                return v.resolve(dtype, device)
            if isinstance(v, list):
                return [sub(x) for x in v]
            if isinstance(v, tuple):
                return tuple(sub(x) for x in v)
            return v

        used_after = self._last_use()
        i = 0
        segment_no = 0
        while i < len(art.nodes):
            if not self._runs_on_host(i):
                node = art.nodes[i]
                env[n_in + i] = graph.call_function(
                    self.fns[i], sub(node.args), {k: sub(v) for k, v in node.kwargs.items()}
                )
                i += 1
                continue
            start = i
            while i < len(art.nodes) and (
                self._runs_on_host(i) or self.placement[n_in + i] is None
            ):
                i += 1
            members = range(start, i)
            ids = {n_in + j for j in members}
            needed = sorted(
                {
                    r
                    for j in members
                    for r in values.refs_in((art.nodes[j].args, art.nodes[j].kwargs))
                    if r not in ids
                }
            )
            produced = [
                n_in + j
                for j in members
                if used_after.get(n_in + j, -1) >= i + n_in or n_in + j in self._output_refs()
            ]
            steps = [
                (
                    self.fns[j],
                    _resolve_symbols(art.nodes[j].args, dtype, device),
                    _resolve_symbols(art.nodes[j].kwargs, dtype, device),
                    n_in + j,
                )
                for j in members
            ]
            name = f"host{segment_no}"
            segment_no += 1
            root.add_module(name, HostSegment(steps, needed, produced))
            result = graph.call_module(name, tuple(env[r] for r in needed))
            for k, ref in enumerate(produced):
                env[ref] = graph.call_function(_getitem, (result, k))
        graph.output(sub(art.output))
        return torch.fx.GraphModule(root, graph, class_name="HfadaptGraph")

    def _last_use(self) -> dict[int, int]:
        """For each value, the largest value index that reads it."""
        n_in = len(self.artifact.inputs)
        last: dict[int, int] = {}
        for j, node in enumerate(self.artifact.nodes):
            for r in values.refs_in((node.args, node.kwargs)):
                last[r] = max(last.get(r, -1), n_in + j)
        return last

    def _output_refs(self) -> set[int]:
        return set(values.refs_in(self.artifact.output))


def _getitem(seq: Any, k: int) -> Any:
    return seq[k]


def _resolve_symbols(v: object, dtype: torch.dtype, device: torch.device) -> Any:
    if isinstance(v, values.Symbol):
        return v.resolve(dtype, device)
    if isinstance(v, list):
        return [_resolve_symbols(x, dtype, device) for x in v]
    if isinstance(v, tuple):
        return tuple(_resolve_symbols(x, dtype, device) for x in v)
    if isinstance(v, dict):
        return {k: _resolve_symbols(x, dtype, device) for k, x in v.items()}
    return v


def _match(template: object, value: object, tensors: list[object], where: str) -> str | None:
    """None when ``value`` has the template's form (its tensors noted in ``tensors``)."""
    if isinstance(template, Slot):
        if not isinstance(value, torch.Tensor):
            return f"{where} is a {type(value).__name__}, the graph takes a tensor there"
        tensors[template.index] = value
        return None
    if isinstance(template, (list, tuple)):
        if type(value) is not type(template) and not (
            isinstance(value, (list, tuple)) and not hasattr(value, "_fields")
        ):
            return (
                f"{where} is a {type(value).__name__}, the graph takes a {type(template).__name__}"
            )
        if len(value) != len(template):
            return f"{where} has {len(value)} items, the graph takes {len(template)}"
        for k, (t, v) in enumerate(zip(template, value, strict=True)):
            why = _match(t, v, tensors, f"{where}[{k}]")
            if why:
                return why
        return None
    if isinstance(template, dict):
        if not isinstance(value, Mapping) or set(value) != set(template):
            return f"{where} does not have the recorded keys"
        for k, t in template.items():
            why = _match(t, value[k], tensors, f"{where}[{k!r}]")
            if why:
                return why
        return None
    if type(value) is not type(template) or value != template:
        return f"{where} is {value!r}, the graph was made for {template!r}"
    return None


class _Absent:
    pass


_ABSENT = _Absent()

__all__ = ["BoundCall", "GraphProgram", "HostSegment"]
