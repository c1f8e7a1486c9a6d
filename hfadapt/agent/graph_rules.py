"""Static rules over a drafted graph, against the stock code's graph on the same call: what a
trojan needs and an honest rewrite does not. Each graph is read as data (nothing runs), its
nodes sorted into categories, and the draft may hold no more of a category than the stock
graph does:

- ``size-value``: a symbolic size (a tensor's length, batch or width, and ``sym::`` arithmetic
  over sizes such as ``sym_min`` or a polynomial) reaching a value (an arithmetic operand, a
  fill value, ``arange``'s end), or a tensor the graph made from sizes alone reduced to a
  number (``ones(n).sum()``). Sizes in shape positions (views, slices, factories' sizes) are
  not counted;
- ``dtype-constant``: a limit of the call's dtype (``finfo($dtype).eps``, ``min``...) or a
  fixed floating dtype (a cast to bfloat16) the stock graph does not use;
- ``selection``: data-dependent choice (comparisons, ``where``, ``masked_fill``, clamps,
  ``max``/``amax``/``argmax``, piecewise functions such as ``relu`` and ``abs``, rounding)
  on values that come from the call's tensors; softmax and friends count the max they take;
- ``data-indexing``: ``index``, ``gather``, ``scatter``... with indices computed from the
  call's values;
- ``reduction``: sums, means, norms over the call's values (an elementwise method has none; a
  norm has as many as it needs), layer norm and softmax counting theirs.

``torch.cond`` and ``nonzero`` never get this far: higher-order and data-dependent-shape ops
are outside the allowlist (:mod:`hfadapt.graphs.ops`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hfadapt.graphs import GraphArtifact, values
from hfadapt.graphs.ops import ASSERT_OPS

SIZE_VALUE, DTYPE_CONSTANT, SELECTION, INDEXING, REDUCTION = (
    "size-value",
    "dtype-constant",
    "selection",
    "data-indexing",
    "reduction",
)
CATEGORY_TEXT = {
    SIZE_VALUE: "size arithmetic feeding values",
    DTYPE_CONSTANT: "dtype constant",
    SELECTION: "data-dependent selection",
    INDEXING: "data-dependent indexing",
    REDUCTION: "reduction over the call's values",
}
_SIZE_SOURCES = frozenset({"sym_size", "sym_numel", "sym_stride", "sym_storage_offset"})
_SELECT = frozenset(
    [
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "isnan",
        "isinf",
        "where",
        "masked_fill",
        "clamp",
        "clamp_min",
        "clamp_max",
        "hardtanh",
        "maximum",
        "minimum",
        "max",
        "min",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "topk",
        "sign",
        "round",
        "floor",
        "ceil",
        "trunc",
        "remainder",
        "fmod",
        "floor_divide",
        "relu",
        "abs",
        "leaky_relu",
        "hardsigmoid",
        "hardswish",
        "elu",
        "softplus",
        "nan_to_num",
    ]
)
_REDUCE = frozenset(
    [
        "sum",
        "mean",
        "prod",
        "var",
        "std",
        "norm",
        "linalg_vector_norm",
        "logsumexp",
        "cumsum",
        "all",
        "any",
    ]
)
# Composite ops: the selections and reductions they hold inside (softmax: a max and a sum).
_COMPOSITE: dict[str, dict[str, int]] = {
    **{
        p: {SELECTION: 1, REDUCTION: 1}
        for p in (
            "softmax",
            "_softmax",
            "log_softmax",
            "_log_softmax",
            "scaled_dot_product_attention",
            "_scaled_dot_product_attention_math",
            "_scaled_dot_product_flash_attention_for_cpu",
        )
    },
    **{p: {REDUCTION: 2} for p in ("layer_norm", "native_layer_norm")},
    **{p: {REDUCTION: 1} for p in ("rms_norm", "_fused_rms_norm")},
}
# Index ops and the position of their index argument (schema name).
_INDEX_ARG = {
    "index": "indices",
    "index_put": "indices",
    "index_select": "index",
    "gather": "index",
    "scatter": "index",
    "scatter_add": "index",
    "embedding": "indices",
}
# Factories: their values do not depend on the tensors they take the shape of.
_FACTORIES = frozenset(
    [
        "full",
        "full_like",
        "ones",
        "ones_like",
        "zeros",
        "zeros_like",
        "new_full",
        "new_ones",
        "new_zeros",
        "eye",
        "scalar_tensor",
        "arange",
        "fill",
    ]
)
# Fills whose value argument a size may not be (``arange``'s end may: positions).
_FILLS = frozenset(["full", "full_like", "new_full", "scalar_tensor", "fill"])
_REDUCE_SELECT = frozenset(["amax", "amin", "max", "min", "argmax", "argmin", "topk"])
# Size arithmetic beyond scaling (a product of two sizes counts too): what a length trigger
# is made of.
_SIZE_ARITH = frozenset(
    ["sub", "neg", "mod", "pow", "sym_min", "sym_max", "eq", "ne", "lt", "le", "gt", "ge"]
)
# Fixed low precisions: a round trip through one is the identity in that dtype only.
_LOW_DTYPES = frozenset({torch.float16, torch.bfloat16})


@dataclass(frozen=True)
class GraphUse:
    """One node of a graph in one category: where (node index), the op, and what it is."""

    category: str
    node: int
    op: str
    detail: str = ""

    def text(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.op} at node {self.node}{detail}"


def _packet(op: str) -> str:
    return op.split("::", 1)[-1].split(".", 1)[0]


def _schema(op: str) -> Any:
    if not op.startswith("aten::"):
        return None
    packet, _, overload = op[6:].partition(".")
    found = getattr(getattr(torch.ops.aten, packet, None), overload or "default", None)
    return getattr(found, "_schema", None)


def _positions(
    op: str, args: tuple[object, ...], kwargs: dict[str, object]
) -> list[tuple[str, object]]:
    """(schema type text, argument) for each argument of a node: what decides whether a size
    there is a shape (``SymInt[]``, ``int``) or a value (``Tensor``, ``Scalar``)."""
    schema = _schema(op)
    names = [a for a in schema.arguments] if schema is not None else []
    out = [(str(names[i].type) if i < len(names) else "?", a) for i, a in enumerate(args)]
    by_name = {a.name: str(a.type) for a in names}
    out += [(by_name.get(k, "?"), v) for k, v in kwargs.items()]
    return out


def _is_value_position(type_text: str) -> bool:
    return any(word in type_text for word in ("Tensor", "Scalar", "float", "number"))


def _arg(op: str, args: tuple[object, ...], kwargs: dict[str, object], name: str) -> object:
    if name in kwargs:
        return kwargs[name]
    schema = _schema(op)
    names = [a.name for a in schema.arguments] if schema is not None else []
    return args[names.index(name)] if name in names and names.index(name) < len(args) else None


class _Flow:
    """What each value of a graph carries: the call's data, a symbolic size (``arith``: one
    that went through more than scaling: ``sym_min``, a difference, a product of sizes...), or
    structure (a data-free tensor made from sizes: a mask, a permutation)."""

    def __init__(self, artifact: GraphArtifact) -> None:
        self.art = artifact
        self.data: set[int] = {
            i for i, s in enumerate(artifact.inputs) if s.kind in ("arg", "param", "buffer")
        }
        self.size: set[int] = set()
        self.arith: dict[int, str] = {}  # a size beyond scaling -> the op that made it
        self.struct: set[int] = set()
        self.zero: set[int] = set()  # data-free zeros (a guard's other branch)
        self.guards: set[int] = set()  # comparisons ``v > 0`` that only guard (see _guard)
        self.uses: list[GraphUse] = []

    def run(self) -> list[GraphUse]:
        n_in = len(self.art.inputs)
        self.guards = self._guards()
        for j, node in enumerate(self.art.nodes):
            self._node(n_in + j, j, node.op, tuple(node.args), dict(node.kwargs))
        return self.uses

    def _guards(self) -> set[int]:
        """Value indices of ``where(v > 0, f(v), 0)`` and its comparison: the guard a norm puts
        around ``rsqrt(var + eps)`` (0 where the variance is 0), not a choice by value."""
        n_in, nodes = len(self.art.inputs), self.art.nodes
        zeros = {
            n_in + j
            for j, n in enumerate(nodes)
            if _packet(n.op) in ("zeros_like", "zeros", "new_zeros")
        }
        found: set[int] = set()
        for j, n in enumerate(nodes):
            if _packet(n.op) != "where" or len(n.args) != 3:
                continue
            cond, true, false = n.args
            if not isinstance(cond, values.Ref) or cond.index < n_in:
                continue
            c = nodes[cond.index - n_in]
            zero_false = (isinstance(false, values.Ref) and false.index in zeros) or false == 0
            if not (c.op == "aten::gt.Scalar" and c.args[1:] == (0,) and zero_false):
                continue
            v = values.refs_in(c.args[:1])
            if v and isinstance(true, values.Ref) and self._reaches(v[0], true.index):
                found |= {cond.index, n_in + j}
        return found

    def _reaches(self, src: int, dst: int) -> bool:
        n_in = len(self.art.inputs)
        seen, todo = set(), [dst]
        while todo:
            i = todo.pop()
            if i == src:
                return True
            if i < n_in or i in seen:
                continue
            seen.add(i)
            node = self.art.nodes[i - n_in]
            todo += values.refs_in((node.args, node.kwargs))
        return False

    def _use(self, category: str, j: int, op: str, detail: str = "", times: int = 1) -> None:
        self.uses += [GraphUse(category, j, op, detail)] * times

    def _sym(self, me: int, j: int, op: str, refs: list[int]) -> None:
        packet = _packet(op)
        sized = [r for r in refs if r in self.size]
        if packet in _SIZE_SOURCES or sized:
            self.size.add(me)
        earlier = next((self.arith[r] for r in refs if r in self.arith), None)
        if earlier is not None:
            self.arith[me] = earlier
        elif sized and (packet in _SIZE_ARITH or (packet in ("mul", "add") and len(sized) == 2)):
            self.arith[me] = f"{op} at node {j}"

    def _node(
        self, me: int, j: int, op: str, args: tuple[object, ...], kw: dict[str, object]
    ) -> None:
        refs = values.refs_in((args, kw))
        packet = _packet(op)
        self._constants(j, op, (args, kw))
        if op in ASSERT_OPS:
            return
        if op.startswith("sym::") or packet in _SIZE_SOURCES:
            self._sym(me, j, op, refs)
            return
        data_in = [r for r in refs if r in self.data]
        if self._size_enters(j, op, packet, args, kw, bool(data_in)):
            (self.data if data_in else self.struct).add(me)
            return
        if packet in _FACTORIES:
            self.struct.add(me)
            if packet in ("zeros", "zeros_like", "new_zeros"):
                self.zero.add(me)
            return
        if data_in:
            self.data.add(me)
            if me not in self.guards:
                self._categories(j, op, packet, args, kw)
        elif refs and all(r in self.struct or r in self.size for r in refs):
            self.struct.add(me)
            if packet in _REDUCE or packet in _REDUCE_SELECT:
                self._use(SIZE_VALUE, j, op, "reduces a tensor made from sizes alone to a value")

    def _size_enters(
        self,
        j: int,
        op: str,
        packet: str,
        args: tuple[object, ...],
        kw: dict[str, object],
        data: bool,
    ) -> bool:
        """Counts (and says True) where a symbolic size becomes a value: it meets the call's
        values, fills a tensor, or, after arithmetic beyond scaling, enters any value."""
        for type_text, value in _positions(op, args, kw):
            if not _is_value_position(type_text):
                continue
            sized = [r for r in values.refs_in(value) if r in self.size]
            if not sized:
                continue
            made = next((self.arith[r] for r in sized if r in self.arith), None)
            if made is not None:
                self._use(SIZE_VALUE, j, op, f"a value computed from sizes by {made}")
                return True
            if data:
                self._use(SIZE_VALUE, j, op, "a symbolic size meets the call's values")
                return True
            if packet in _FILLS:
                self._use(SIZE_VALUE, j, op, "a symbolic size fills a tensor")
                return True
        return False

    def _categories(
        self, j: int, op: str, packet: str, args: tuple[object, ...], kw: dict[str, object]
    ) -> None:
        if packet in _SELECT:
            self._use(SELECTION, j, op)
        if packet in _REDUCE:
            self._use(REDUCTION, j, op)
        for category, times in _COMPOSITE.get(packet, {}).items():
            self._use(category, j, op, "inside the op", times)
        if packet in _INDEX_ARG:
            index = _arg(op, args, kw, _INDEX_ARG[packet])
            if any(r in self.data for r in values.refs_in(index)):
                self._use(INDEXING, j, op, "indices computed from the call's values")

    def _constants(self, j: int, op: str, value: object) -> None:
        for found in _walk(value):
            if isinstance(found, values.Symbol) and found.name in values.FINFO_ATTRS:
                self._use(DTYPE_CONSTANT, j, op, f"finfo(dtype).{found.name}")
            elif isinstance(found, torch.dtype) and found in _LOW_DTYPES:
                self._use(DTYPE_CONSTANT, j, op, f"a cast to {str(found).removeprefix('torch.')}")


def _walk(value: object) -> list[object]:
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _walk(v)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in _walk(v)]
    return [value]


def graph_uses(artifact: GraphArtifact) -> list[GraphUse]:
    """Every node of ``artifact`` in a rule category, in graph order."""
    return _Flow(artifact).run()


def static_refusal(draft: GraphArtifact, stock: GraphArtifact) -> tuple[str, dict[str, Any]]:
    """Why the draft's graph holds what the stock graph lacks ("" when it holds nothing more),
    with the counts per category of both."""
    mine, theirs = graph_uses(draft), graph_uses(stock)
    counts = {
        "draft": dict(Counter(u.category for u in mine)),
        "stock": dict(Counter(u.category for u in theirs)),
    }
    stock_constants = {u.detail for u in theirs if u.category == DTYPE_CONSTANT}
    for use in mine:
        if use.category == DTYPE_CONSTANT and use.detail not in stock_constants:
            return (
                f"static rule: dtype constant {use.text()}, which the stock code's graph does "
                "not use: a value that changes with the dtype the proofs may not run"
            ), counts
    for category in (SIZE_VALUE, SELECTION, INDEXING, REDUCTION):
        have = [u for u in mine if u.category == category]
        allowed = counts["stock"].get(category, 0)
        if len(have) > allowed:
            first = have[allowed]
            return (
                f"static rule: {CATEGORY_TEXT[category]}: {first.text()}; the draft's graph has "
                f"{len(have)}, the stock code's {allowed}: a rewrite computes what the stock code "
                "computes and needs none it lacks"
            ), counts
    return "", counts


_STOCK_GRAPHS: dict[str, GraphArtifact | str] = {}


def stock_graph(
    key: str,
    stock: Callable[..., object],
    module: torch.nn.Module,
    args: tuple[object, ...],
    kwargs: dict[str, object],
) -> GraphArtifact | str:
    """The stock code's graph on the case's call, captured as a draft's is (trusted library
    code, here in the parent), once per ``key``; why not, when it cannot be one graph."""
    from hfadapt.graphs.capture import capture_method

    found = _STOCK_GRAPHS.get(key)
    if found is None:
        try:
            with torch.no_grad():
                found = capture_method(module, stock, tuple(args), dict(kwargs), trusted=True)
        except Exception as exc:  # the stock code is not one graph: said, rule not applied
            found = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        _STOCK_GRAPHS[key] = found
    return found


def static_rule(
    draft: GraphArtifact,
    key: str,
    stock: Callable[..., object],
    module: torch.nn.Module,
    args: tuple[object, ...],
    kwargs: dict[str, object],
) -> tuple[str, dict[str, Any]]:
    """(why the draft is refused or "", what the rule found). When the stock code does not
    capture as one graph there is nothing to compare with: the rule is not applied, and the
    output says why (the numeric proofs still run)."""
    graph = stock_graph(key, stock, module, args, kwargs)
    if isinstance(graph, str):
        return "", {"static_rule": f"not applied: the stock code does not capture ({graph})"}
    why, counts = static_refusal(draft, graph)
    return why, {"static_rule": counts}


__all__ = [
    "CATEGORY_TEXT",
    "GraphUse",
    "graph_uses",
    "static_refusal",
    "static_rule",
    "stock_graph",
]
