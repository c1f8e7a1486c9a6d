"""The ops a drafted graph may hold, and how an op is named in the artifact.

An ATen op is named ``aten::<name>.<overload>`` and resolved through ``torch.ops.aten`` only; its
packet must be in :data:`ATEN_OPS` (pure tensor math, views, factories, casts: what models and
adapters compute with) and its overload must be functional and deterministic (no argument it
writes, no random or data-dependent-shape tag). Symbolic-size arithmetic that ``torch.export``
emits between ATen ops is named ``sym::<name>`` and maps to a fixed table of functions. Nothing
else resolves: no Python callable, no custom op, no higher-order op."""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from typing import Any

import torch

from hfadapt import torch_internals as ti
from hfadapt.errors import GraphError

# Op packets (ATen names without overload). Everything here reads its inputs and returns new
# tensors (or views); mutation, randomness, I/O, and host synchronisation are not listed.
ATEN_OPS: frozenset[str] = frozenset(
    [
        "abs",
        "acos",
        "add",
        "addcdiv",
        "addcmul",
        "addmm",
        "alias",
        "all",
        "amax",
        "amin",
        "any",
        "arange",
        "argmax",
        "argmin",
        "asin",
        "atan",
        "atan2",
        "baddbmm",
        "bitwise_and",
        "bitwise_not",
        "bitwise_or",
        "bitwise_xor",
        "bmm",
        "cat",
        "ceil",
        "chunk",
        "clamp",
        "clamp_max",
        "clamp_min",
        "clone",
        "constant_pad_nd",
        "contiguous",
        "copy",
        "cos",
        "cosh",
        "cumsum",
        "detach",
        "diag_embed",
        "diagonal",
        "div",
        "einsum",
        "elu",
        "embedding",
        "eq",
        "erf",
        "exp",
        "expand",
        "expand_as",
        "expm1",
        "eye",
        "fill",
        "flatten",
        "flip",
        "floor",
        "floor_divide",
        "fmod",
        "full",
        "full_like",
        "gather",
        "ge",
        "gelu",
        "glu",
        "gt",
        "hardsigmoid",
        "hardswish",
        "hardtanh",
        "index",
        "index_put",
        "index_select",
        "isinf",
        "isnan",
        "layer_norm",
        "le",
        "leaky_relu",
        "lift_fresh_copy",
        "linalg_vector_norm",
        "linear",
        "log",
        "log1p",
        "log_softmax",
        "logical_and",
        "logical_not",
        "logical_or",
        "logical_xor",
        "logsumexp",
        "lt",
        "masked_fill",
        "matmul",
        "max",
        "maximum",
        "mean",
        "min",
        "minimum",
        "mish",
        "mm",
        "mul",
        "nan_to_num",
        "narrow",
        "native_layer_norm",
        "ne",
        "neg",
        "new_full",
        "new_ones",
        "new_zeros",
        "norm",
        "ones",
        "ones_like",
        "outer",
        "pad",
        "permute",
        "pow",
        "prod",
        "reciprocal",
        "relu",
        "remainder",
        "repeat",
        "repeat_interleave",
        "reshape",
        "rms_norm",
        "_fused_rms_norm",
        "roll",
        "round",
        "rsqrt",
        "rsub",
        "scalar_tensor",
        "scaled_dot_product_attention",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_flash_attention_for_cpu",
        "scatter",
        "scatter_add",
        "select",
        "sigmoid",
        "sign",
        "silu",
        "sin",
        "sinh",
        "slice",
        "softmax",
        "_softmax",
        "softplus",
        "split",
        "split_with_sizes",
        "sqrt",
        "square",
        "squeeze",
        "stack",
        "std",
        "sub",
        "sum",
        "sym_numel",
        "sym_size",
        "sym_storage_offset",
        "sym_stride",
        "t",
        "tanh",
        "topk",
        "transpose",
        "tril",
        "triu",
        "trunc",
        "unbind",
        "unflatten",
        "unfold",
        "unsqueeze",
        "var",
        "view",
        "view_as",
        "where",
        "zeros",
        "zeros_like",
        "_to_copy",
        "_unsafe_view",
        "_log_softmax",
        "_assert_scalar",
        "_assert_tensor_metadata",
    ]
)

# Symbolic-size arithmetic between ops (what torch.export writes for ``x.shape[1] // 2``).
SYM_OPS: dict[str, Callable[..., Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "floordiv": operator.floordiv,
    "truediv": operator.truediv,
    "mod": operator.mod,
    "neg": operator.neg,
    "pow": operator.pow,
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "and_": operator.and_,
    "or_": operator.or_,
    "getitem": operator.getitem,
    "sym_float": torch.sym_float,
    "sym_int": torch.sym_int,
    "sym_max": torch.sym_max,
    "sym_min": torch.sym_min,
    "sym_not": torch.sym_not,
    "sym_sqrt": math.sqrt,
    "ceil": math.ceil,
    "floor": math.floor,
}
_SYM_BY_FN = {id(fn): name for name, fn in SYM_OPS.items()}
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
_OVERLOAD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# Ops that only assert something about their inputs: executed, never counted as compute.
ASSERT_OPS = frozenset({"aten::_assert_scalar.default", "aten::_assert_tensor_metadata.default"})


def op_name(target: object) -> str:
    """The artifact's name for an fx node target; GraphError for anything not nameable."""
    if isinstance(target, ti.OpOverload):
        ns = target.namespace
        packet = target._schema.name.split("::", 1)[-1]
        return f"{ns}::{packet}.{target._overloadname}"
    name = _SYM_BY_FN.get(id(target))
    if name is not None:
        return f"sym::{name}"
    raise GraphError(f"{getattr(target, '__name__', type(target).__name__)} is not an ATen op")


# Overloads tagged as drawing random numbers that are deterministic when this argument is the
# literal 0.0 (attention's dropout in inference): checked per node by check_node.
ZERO_DROPOUT: dict[str, tuple[str, int]] = {
    "aten::scaled_dot_product_attention.default": ("dropout_p", 4),
    "aten::_scaled_dot_product_attention_math.default": ("dropout_p", 4),
    "aten::_scaled_dot_product_flash_attention_for_cpu.default": ("dropout_p", 3),
}


def check_node(name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
    """Per-node conditions of the allowlist (attention only without dropout)."""
    if name in ZERO_DROPOUT:
        key, pos = ZERO_DROPOUT[name]
        value = kwargs.get(key, args[pos] if len(args) > pos else 0.0)
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0.0):
            raise GraphError(f"{name} with dropout {value!r}: a graph must be deterministic")


def _checked_overload(name: str, op: ti.OpOverload) -> None:
    schema = op._schema
    if schema.is_mutable or any(
        a.alias_info is not None and a.alias_info.is_write for a in schema.arguments
    ):
        raise GraphError(f"{name} writes one of its arguments; a graph must be functional")
    tags = set(op.tags)
    if torch.Tag.nondeterministic_seeded in tags and name not in ZERO_DROPOUT:
        raise GraphError(f"{name} draws random numbers; a graph must be deterministic")
    if torch.Tag.data_dependent_output in tags or torch.Tag.dynamic_output_shape in tags:
        raise GraphError(f"{name} reads tensor values on the host; a graph must not")


def resolve(name: str) -> Callable[..., Any]:
    """The callable an artifact op name stands for, after every check; GraphError when the name
    is malformed or names anything outside the allowlist."""
    if not isinstance(name, str) or len(name) > 120:
        raise GraphError("an op name must be a short string")
    if name.startswith("sym::"):
        fn = SYM_OPS.get(name[5:])
        if fn is None:
            raise GraphError(f"{name} is not a symbolic-size operation hfadapt allows")
        return fn
    ns, _, rest = name.partition("::")
    packet, _, overload = rest.partition(".")
    if ns != "aten" or not _NAME.match(packet) or not _OVERLOAD.match(overload or "-"):
        raise GraphError(f"{name!r} is not an ATen op name (aten::<name>.<overload>)")
    if packet not in ATEN_OPS:
        raise GraphError(f"{name} is not in hfadapt's allowlist of graph ops")
    packet_obj = getattr(torch.ops.aten, packet, None)
    op = getattr(packet_obj, overload, None) if packet_obj is not None else None
    if not isinstance(op, ti.OpOverload):
        raise GraphError(f"{name}: torch has no such ATen overload")
    _checked_overload(name, op)
    return op


def is_compute(name: str) -> bool:
    """Whether an op does arithmetic (counted for the host share), not only shapes, views,
    casts or asserts."""
    if name.startswith("sym::") or name in ASSERT_OPS:
        return False
    packet = name.split("::", 1)[-1].split(".", 1)[0]
    return packet not in _SHAPE_ONLY


_SHAPE_ONLY = frozenset(
    [
        "alias",
        "clone",
        "contiguous",
        "copy",
        "detach",
        "expand",
        "expand_as",
        "flatten",
        "lift_fresh_copy",
        "narrow",
        "permute",
        "reshape",
        "select",
        "slice",
        "split",
        "split_with_sizes",
        "squeeze",
        "sym_numel",
        "sym_size",
        "sym_storage_offset",
        "sym_stride",
        "t",
        "transpose",
        "unbind",
        "unflatten",
        "unsqueeze",
        "view",
        "view_as",
        "_to_copy",
        "_unsafe_view",
        "chunk",
    ]
)

__all__ = ["ATEN_OPS", "SYM_OPS", "is_compute", "op_name", "resolve"]
