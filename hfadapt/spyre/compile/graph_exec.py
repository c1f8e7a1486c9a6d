"""Running a checked ATen graph with the device's numerics, as generated code (a new FX
GraphModule), not a per-node interpreter, so it runs close to plain CPU speed.

The transform: fp16/bf16 values are held as float32 tensors that carry DL16 values (dtype
arguments fp16/bf16 become float32); every node whose logical dtype (node.meta["val"]) is
fp16/bf16 is followed by an in-place DL16 rounding unless its op cannot create a new value
(views, copies, cat, relu, max, where, ...); fp32 nodes stay IEEE. Numbers that ops computing
in DL16 take as values (schema type Scalar, or a number where a Tensor goes) are rounded to DL16
once, at build time: the device holds them as DL16 constants (-inf becomes -max). Inputs are rounded on the way in
(parameters once, cached while unchanged), outputs are cast back to their logical dtypes (the
transfer to the host). CPU-fallback nodes run on the host in their logical dtypes.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx

from hfadapt import torch_internals as ti
from hfadapt.spyre import heap
from hfadapt.spyre.compile.defects import Corruption, misread_layout
from hfadapt.spyre.compile.graph_rules import GraphCheck, op_name
from hfadapt.spyre.compile.handoff import HandoffPlan
from hfadapt.spyre.numerics.dl16 import DL16Format, round_dl16, round_dl16_
from hfadapt.spyre.numerics.scalars import device_numbers
from hfadapt.spyre.numerics.value_preserving import preserves_values
from hfadapt.spyre.rules.profile import FALLBACK, Profile

DL16_DTYPES = (torch.float16, torch.bfloat16)

# Fallbacks that only select, zero or compare values: run on the held values, then model the
# round trip through the host dtype on the (small) result instead of converting every input.
HOST_EXACT = frozenset(
    {
        "aten::embedding",
        "aten::tril",
        "aten::triu",
        "aten::argmax",
        "aten::argmin",
        "aten::isin",
        "aten::index_copy",
    }
)


def _packet(op: str) -> str:
    return op.split(".", 1)[0]


def _dl16_dtype(value: object) -> torch.dtype | None:
    dtype = getattr(value, "dtype", None)
    return dtype if dtype in DL16_DTYPES and not isinstance(value, torch.dtype) else None


def _retype(value: object) -> Any:
    """fp16/bf16 dtype arguments -> float32 (the held representation)."""
    if isinstance(value, torch.dtype):
        return torch.float32 if value in DL16_DTYPES else value
    if isinstance(value, (list, tuple)):
        return type(value)(_retype(v) for v in value)
    if isinstance(value, dict):
        return {k: _retype(v) for k, v in value.items()}
    return value


class Runtime:
    """The helpers generated code calls; one per executable graph (holds the DL16 format and
    the cache of converted parameters)."""

    def __init__(self, fmt: DL16Format) -> None:
        heap.keep_freed_memory()  # a compiled program is the device's use, as an eager op is
        self.fmt = fmt
        self._cache: dict[int, tuple[weakref.ref[torch.Tensor], int, int, torch.Tensor]] = {}

    # -- transfers -------------------------------------------------------------------------
    def to_device(self, x: torch.Tensor) -> torch.Tensor:
        """Host fp16/bf16 -> device: float32 holding the DL16-rounded values."""
        return round_dl16_(x.float(), self.fmt, transfer=True)

    def to_device_static(self, x: torch.Tensor, slot: int) -> torch.Tensor:
        """Like to_device, for parameters and buffers: converted once while they stay the same
        tensor with the same data (version counter and data pointer unchanged)."""
        try:
            version = x._version
        except RuntimeError:  # inference tensors carry no version counter
            return self.to_device(x)
        hit = self._cache.get(slot)
        if hit is not None:
            ref, cached_version, ptr, held = hit
            if ref() is x and cached_version == version and ptr == x.data_ptr():
                return held
        held = self.to_device(x)
        self._cache[slot] = (weakref.ref(x), version, x.data_ptr(), held)
        return held

    def to_host(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.to(dtype)

    # -- rounding ----------------------------------------------------------------------------
    def round(self, x: torch.Tensor) -> torch.Tensor:
        return round_dl16_(x, self.fmt)

    def round_items(self, values: Any, flags: tuple[bool, ...]) -> Any:
        for value, flag in zip(values, flags, strict=False):
            if flag and value is not None:
                round_dl16_(value, self.fmt)
        return values

    def host_roundtrip(self, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A device value sent to the host as ``dtype`` and back (inf past fp16's range)."""
        return round_dl16_(x.to(dtype).float(), self.fmt, transfer=True)

    def from_host(self, values: Any, flags: Any) -> Any:
        """Host results -> device: DL16-logical tensors become held float32."""
        if isinstance(flags, bool):
            return round_dl16_(values.float(), self.fmt, transfer=True) if flags else values
        return type(values)(
            round_dl16_(v.float(), self.fmt, transfer=True) if f and v is not None else v
            for v, f in zip(values, flags, strict=False)
        )


def _native_kernel(op: str, profile: Profile) -> Callable[..., Any] | None:
    """The eager device's kernel for ops whose device numerics are not "fp32, then round the
    output" (hfadapt.spyre.numerics.kernels), so both paths compute the same; None without one."""
    from hfadapt.spyre.numerics.kernels import native_kernel

    return native_kernel(op, profile.numeric_params)


def _kernel_target(kernel: Callable[..., object], fmt: DL16Format) -> Callable[..., Any]:
    """An FX call target for a device-numerics kernel (hfadapt.spyre.numerics.kernels): the kernels
    take (args, kwargs, fmt) and return outputs already rounded to DL16."""

    def spyre_kernel(*args: object, **kwargs: object) -> object:
        return kernel(args, kwargs, fmt)

    spyre_kernel.__name__ = f"spyre_{getattr(kernel, '__name__', 'kernel')}"
    return spyre_kernel


class _Builder:
    def __init__(
        self,
        gm: fx.GraphModule,
        check: GraphCheck,
        profile: Profile,
        static: Iterable[int],
        corruptions: Iterable[Corruption] = (),
        handoff: HandoffPlan | None = None,
    ) -> None:
        self.gm = gm
        self.check = check
        self.profile = profile
        self.static = set(static)
        self.rt = Runtime(profile.dl16)
        self.graph = fx.Graph()
        self.env: dict[fx.Node, fx.Node] = {}
        self.root = torch.nn.Module()
        self.kernels_used: list[str] = []
        corruptions = list(corruptions)
        # (consumer, value) -> the corruption it reads; the misread node is made once per value
        self.misreads: dict[tuple[fx.Node, fx.Node], Corruption] = {
            (c, k.value): k for k in corruptions for c in k.consumers
        }
        self._misread_nodes: dict[int, fx.Node] = {}
        # nodes a device defect makes compute something else (the op replaced)
        self.replaced: dict[fx.Node, Callable[..., Any]] = {
            k.anchor: k.replace
            for k in corruptions
            if k.anchor is not None and k.replace is not None
        }
        # defect.post_ln_handoff (hfadapt.spyre.compile.handoff): inputs checked at run time
        # for a mark, outputs marked; (consumer, input) -> the checked value it reads
        self.handoff = handoff
        self.handoff_reads: dict[tuple[fx.Node, fx.Node], fx.Node] = {}

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> fx.Node:
        return self.graph.call_function(fn, args, kwargs)

    def _round_scalars(
        self, target: object, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Numbers passed where the schema takes a Scalar or a Tensor (a wrapped number) are
        device values: the device holds them as DL16 constants (a host -inf lands on 0xEFFF). ints,
        floats and lists typed as sizes, dims, eps or probabilities are left alone."""
        return device_numbers(target, args, kwargs, self.profile.dl16)

    # -- node kinds ----------------------------------------------------------------------------
    def placeholder(self, node: fx.Node, index: int) -> None:
        new = self.graph.placeholder(node.name)
        dtype = _dl16_dtype(node.meta.get("val"))
        if dtype is None:
            self.env[node] = new
        elif index in self.static:
            self.env[node] = self.call(self.rt.to_device_static, new, index)
        else:
            self.env[node] = self.call(self.rt.to_device, new)
        reader = self.handoff.readers.get(index) if self.handoff else None
        if reader is not None and self.handoff is not None:
            checked = self.call(self.handoff.checker(index), new, self.env[node])
            for consumer in reader.consumers:
                self.handoff_reads[(consumer, node)] = checked

    def get_attr(self, node: fx.Node) -> None:
        value = getattr(self.gm, str(node.target))
        if isinstance(value, torch.Tensor) and value.dtype in DL16_DTYPES:
            value = round_dl16(value.float(), self.profile.dl16, transfer=True)
        name = str(node.target).replace(".", "_")
        setattr(self.root, name, value)
        self.env[node] = self.graph.get_attr(name)

    def call_function(self, node: fx.Node) -> None:
        target = node.target
        if target is operator.getitem:
            self.env[node] = self.graph.call_function(
                operator.getitem, fx.node.map_arg(node.args, self.env.__getitem__)
            )
            return
        op = op_name(target)
        value = node.meta.get("val")
        if self.check.outcomes.get(node) == FALLBACK or op == "aten::view.dtype":
            self.env[node] = self._host(node, op, value)
            return
        read = self._reader(node)
        source = node.args[0] if node.args else None
        if _packet(op) == "aten::clone" and isinstance(source, fx.Node) and _plain_clone(node):
            # a copy nothing can tell from its input: no op of the program writes into a
            # value another node made, and the layout is the same (e.g. eval-mode dropout)
            self.env[node] = read(source)
            return
        args = fx.node.map_arg(node.args, read)
        kwargs = fx.node.map_arg(node.kwargs, read)
        inputs_dl16 = any(_dl16_dtype(n.meta.get("val")) for n in node.all_input_nodes)
        # the op computes in DL16: a DL16 result, or a comparison of DL16 values
        if _dl16_dtype(value) or (inputs_dl16 and getattr(value, "dtype", None) == torch.bool):
            args, kwargs = self._round_scalars(target, tuple(args), dict(kwargs))
        args, kwargs = _retype(args), _retype(kwargs)
        if _packet(op) in ("aten::_softmax", "aten::_log_softmax"):
            args = (*args[:2], False)  # half_to_float: the held input already is float32
        replaced = self.replaced.get(node)
        if replaced is not None:  # a device defect: the card computes this op wrongly
            out = self.graph.call_function(replaced, tuple(args), dict(kwargs))
            rounded = getattr(replaced, "dl16_output", False)  # the SDPA softmax rounds its own
            self.env[node] = out if rounded else self._round_output(node, op, out, value)
            return
        kernel = _native_kernel(op, self.profile) if inputs_dl16 else None
        if kernel is not None:
            # device numerics of their own (e.g. LayerNorm statistics kept in DL16)
            self.kernels_used.append(op)
            target = _kernel_target(kernel, self.profile.dl16)
            self.env[node] = self.graph.call_function(target, tuple(args), dict(kwargs))
            return
        out = self.graph.call_function(target, tuple(args), dict(kwargs))  # type: ignore[arg-type]
        self.env[node] = self._round_output(node, op, out, value)

    def _reader(self, node: fx.Node) -> Callable[[fx.Node], fx.Node]:
        """How ``node`` reads its inputs: their values, except an input a device defect makes
        it misread (hfadapt.spyre.compile.defects)."""
        if not self.misreads and not self.handoff_reads:
            return self.env.__getitem__

        def read(n: fx.Node) -> fx.Node:
            checked = self.handoff_reads.get((node, n))
            if checked is not None:
                return checked
            corruption = self.misreads.get((node, n))
            if corruption is None:
                return self.env[n]
            made = self._misread_nodes.get(id(corruption))
            if made is None:
                made = self.call(misread_layout, self.env[n], corruption.order, corruption.shape)
                self._misread_nodes[id(corruption)] = made
            return made

        return read

    def _preserves(self, node: fx.Node, op: str) -> bool:
        if getattr(node.target, "is_view", False):
            return True
        dtype = _dl16_dtype(_first(node.meta.get("val")))
        inputs = [getattr(n.meta.get("val"), "dtype", None) for n in node.all_input_nodes]
        if dtype is not None and preserves_values(
            op, [d for d in inputs if isinstance(d, torch.dtype)], dtype
        ):
            return True
        if _packet(op) == "aten::_to_copy":  # a cast between DL16 dtypes keeps the value
            return bool(node.all_input_nodes) and bool(
                _dl16_dtype(node.all_input_nodes[0].meta.get("val"))
            )
        return False

    def _round_output(self, node: fx.Node, op: str, out: fx.Node, value: object) -> fx.Node:
        if self._preserves(node, op):
            return out
        if isinstance(value, (list, tuple)):
            flags = tuple(bool(_dl16_dtype(v)) for v in value)
            return self.call(self.rt.round_items, out, flags) if any(flags) else out
        return self.call(self.rt.round, out) if _dl16_dtype(value) else out

    def _host(self, node: fx.Node, op: str, value: object) -> fx.Node:
        """A CPU fallback: the op runs on the host in its logical dtypes."""
        if _packet(op) in HOST_EXACT:
            out = self.graph.call_function(
                node.target,  # type: ignore[arg-type]
                _retype(fx.node.map_arg(node.args, self.env.__getitem__)),
                _retype(fx.node.map_arg(node.kwargs, self.env.__getitem__)),
            )
            dtype = _dl16_dtype(value)
            return self.call(self.rt.host_roundtrip, out, dtype) if dtype else out

        def to_host(n: fx.Node) -> fx.Node:
            dtype = _dl16_dtype(n.meta.get("val"))
            return self.call(self.rt.to_host, self.env[n], dtype) if dtype else self.env[n]

        out = self.graph.call_function(
            node.target,  # type: ignore[arg-type]
            fx.node.map_arg(node.args, to_host),
            fx.node.map_arg(node.kwargs, to_host),
        )
        if isinstance(value, (list, tuple)):
            flags: Any = tuple(bool(_dl16_dtype(v)) for v in value)
        else:
            flags = bool(_dl16_dtype(value))
        return self.call(self.rt.from_host, out, flags) if any(_as_tuple(flags)) else out

    def output(self, node: fx.Node) -> None:
        def back(n: fx.Node) -> fx.Node:
            dtype = _dl16_dtype(n.meta.get("val"))
            return self.call(self.rt.to_host, self.env[n], dtype) if dtype else self.env[n]

        values = fx.node.map_arg(node.args[0], back)
        plan = self.handoff
        if plan is not None and plan.marks:  # post-LayerNorm outputs: marked as returned
            if isinstance(values, (list, tuple)):
                values = type(values)(
                    self.call(plan.marker(i), v) if i in plan.marks else v
                    for i, v in enumerate(values)
                )
            elif isinstance(values, fx.Node):
                values = self.call(plan.marker(0), values)
        self.graph.output(values)

    def build(self) -> fx.GraphModule:
        index = 0
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self.placeholder(node, index)
                index += 1
            elif node.op == "get_attr":
                self.get_attr(node)
            elif node.op == "call_function":
                self.call_function(node)
            elif node.op == "output":
                self.output(node)
            else:  # call_module / call_method do not occur in ATen graphs
                raise NotImplementedError(f"{node.op} node {node.name} in an ATen graph")
        self.graph.lint()
        return fx.GraphModule(self.root, self.graph, class_name="SpyreDeviceGraph")


def _plain_clone(node: fx.Node) -> bool:
    """Whether ``node`` (an aten::clone) copies a contiguous intermediate into the same layout
    and is not itself a graph output: then the program can hand its input on instead. A copy
    of data the program did not make (an input or a constant, or a view of one) is kept: the
    program must not return or alias those."""
    source = node.args[0] if node.args else None
    fmt = node.kwargs.get("memory_format")
    value = getattr(source, "meta", {}).get("val")
    return (
        isinstance(source, fx.Node)
        and _made_here(source)
        and fmt in (None, torch.preserve_format, torch.contiguous_format)
        and isinstance(value, torch.Tensor)
        and value.is_contiguous()
        and all(user.op != "output" for user in node.users)
    )


# ops that return their input's memory though their schemas do not say so
_ALIASING = frozenset({"aten::_unsafe_view"})


def _made_here(node: fx.Node) -> bool:
    """Whether ``node``'s data is made by an op of the graph: followed back through views and
    the items of ops that return several, to a node that is not a view (False at an input or
    a constant)."""
    current: Any = node
    for _ in range(256):  # a chain of views is short; a cycle cannot occur in a graph
        if not isinstance(current, fx.Node) or current.op != "call_function":
            return False
        target = current.target
        aliasing = target is operator.getitem or getattr(target, "is_view", False)
        if not aliasing and _packet(op_name(target)) not in _ALIASING:
            return True
        current = current.args[0] if current.args else None
    return False


def _first(value: object) -> Any:
    """A node's value, or the first of its values (max, topk: the values, then the indices)."""
    return value[0] if isinstance(value, (list, tuple)) and value else value


def _as_tuple(flags: object) -> tuple[bool, ...]:
    return flags if isinstance(flags, tuple) else (bool(flags),)


def build_executable(
    gm: fx.GraphModule,
    check: GraphCheck,
    profile: Profile,
    static_inputs: Iterable[int] = (),
    corruptions: Iterable[Corruption] = (),
    handoff: HandoffPlan | None = None,
) -> tuple[fx.GraphModule, Runtime]:
    """The DL16 program for a checked graph: a GraphModule taking the same inputs and returning
    the same outputs (logical dtypes) as ``gm``. ``static_inputs``: indices of parameters and
    buffers, whose conversion is cached. ``corruptions``: the device defects that fire in this
    graph (hfadapt.spyre.compile.defects.find_defects); their consumers read the misread value.
    ``handoff``: the graph's part of defect.post_ln_handoff (hfadapt.spyre.compile.handoff):
    outputs it marks, inputs it checks for a mark at each call."""

    builder = _Builder(gm, check, profile, static_inputs, corruptions, handoff)
    # aot_autograd calls its compilers with its FakeTensorMode active; constants and scalars
    # are converted here for real.
    with ti.unset_fake_temporarily():
        return builder.build(), builder.rt
