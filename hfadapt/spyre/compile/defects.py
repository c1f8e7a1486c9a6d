"""The card's silent failures (profile ``defects``) in compiled graphs: the graph lowers, the
numbers come out wrong. Each defect of the profile names a trigger, a matcher here that looks at
the checked ATen graph once, at build time; a match becomes a ``Corruption``: the value a node
reads is replaced, in the generated program, by what the card reads instead (the same data
taken with the wrong layout). Each firing is recorded in the lowering report with the defect id,
its source, the ATen node and the module path Dynamo recorded for it.

Triggers (by name, as the profile's ``defects[].trigger``):

- ``sdpa_noncontiguous_qkv``: a query, key or value reaching scaled_dot_product_attention as a
  transposed (permuted, non-contiguous) view. The attention math is captured decomposed
  (hfadapt.spyre.decompositions), so the SDPA call is the group of nodes whose
  ``source_fn_stack`` names it; its inputs from outside the group are Q, K, V and the mask.
- ``rms_norm_noncontiguous_view``: the native rms_norm reading a non-contiguous 4-D view.
- ``minus_inf_fill_into_sdpa_softmax``: a ``-inf`` fill made in the graph (full, full_like,
  masked_fill, where, constant_pad_nd with a -inf scalar; SDPA's own fill for a boolean mask or
  ``is_causal``) reaching the softmax of an SDPA call. The card's amax takes the fill's code
  (0xEFFF, -3.35e7) for +3.35e7: a row with nothing but fill (a fully masked, padded query row)
  has exp(x - 3.35e7) = 0 everywhere and becomes 0/0 = NaN, which the next layer's P @ V
  carries into every row (0 * NaN).

  A -inf arriving from the host as data lands on the same code: every other SDPA softmax checks
  its rows when the program runs, and the firing is recorded then (``runtime``).

- ``bf16_add_of_minus_infs``: an add (or sub of a negated fill) in bf16 whose two operands
  both carry a ``-inf`` fill made in the graph (two masks combined). The card's bf16 add gives
  NaN for ``-inf + -inf`` where IEEE gives ``-inf``: the masked positions turn to NaN.
- the per-op triggers of hfadapt.spyre.rules.op_defects (``exp_unaligned_stick``,
  ``rms_norm_noncontiguous_view``, ``fp32_row_reduction_past_cores``, ``rank5_full_reduction``),
  matched on each call node's recorded values; the eager device runs the same ones.
- the layout triggers (hfadapt.spyre.compile.layout_defects): ``rotate_half_slice`` (torch-spyre#3133): a slice of the last dim at a stick-aligned offset
  concatenated back along it (``rotate_half``): the slice reads from the row's start (inferred);
  ``view_transpose_64``: a head split ``x.view(B, S, H, D).transpose(1, 2)`` (or the permute
  (0, 2, 1, 3)) of fp16 data with S == 64 (torch-spyre#1783). The ops that read the transposed
  value read it with the wrong layout (its storage taken as if contiguous); a view op whose
  result is contiguous again (the transpose undone) reads nothing and is not corrupted.

- ``post_ln_output_into_next_graph_matmul`` (across graphs, matched at run time, not here: see
  hfadapt.spyre.compile.handoff): a graph output holding a LayerNorm result, read by a later
  graph's matmul.

The misread: a permuted view's storage holds its data in memory order; the kernel walks that
storage as if it were contiguous in the view's logical shape (``x.permute(memory order)
.reshape(shape)``), which costs one copy, what ``.contiguous()`` would have cost.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from hfadapt.errors import ProfileError
from hfadapt.spyre.compile.defect_match import Match, float4d, node_value, position
from hfadapt.spyre.compile.graph_rules import op_name, source_location
from hfadapt.spyre.compile.layout_defects import (
    rotate_half_slice,
    slice_from_start,
    view_transpose_64,
)
from hfadapt.spyre.numerics.kernels import sdpa_softmax
from hfadapt.spyre.rules.lowering_report import DefectFiring
from hfadapt.spyre.rules.op_defects import TRIGGERS as OP_TRIGGERS
from hfadapt.spyre.rules.op_defects import exp_first_stick_reread, memory_order, misread_layout
from hfadapt.spyre.rules.op_rules import is_dl16_dtype
from hfadapt.spyre.rules.profile import Defect, Profile

__all__ = [
    "CROSS_GRAPH_TRIGGERS",
    "TRIGGERS",
    "Corruption",
    "exp_first_stick_reread",
    "find_defects",
    "firing_at",
    "memory_order",
    "misread_layout",
    "module_path",
]


@dataclass(frozen=True)
class Corruption:
    """One firing in the generated program: the consumers read ``misread_layout(value)``, or
    (``replace`` set) the anchor node runs ``replace`` instead of its op."""

    firing: DefectFiring
    value: fx.Node
    consumers: frozenset[fx.Node]
    order: tuple[int, ...]
    shape: tuple[int, ...]
    anchor: fx.Node | None = None
    replace: Callable[..., torch.Tensor] | None = None
    runtime: bool = False  # recorded when it fires at run time (host data), not at build


# the magnitude of 0xEFFF, the code a -inf fill has on the device (hf-adapters hf_common.py)
FILL_CODE = 33521664.0


def softmax_amax_misread(x: torch.Tensor, dim: int, half_to_float: bool = False) -> torch.Tensor:
    """softmax whose row max reads the -inf fill's code as +3.35e7 (rows holding only fill:
    every exp underflows to 0, the row becomes 0/0 = NaN)."""
    m = x.amax(dim, keepdim=True)
    m = torch.where(m <= -FILL_CODE, -m, m)
    e = torch.exp(x - m)
    return e / e.sum(dim, keepdim=True)


def _sdpa_softmax(
    profile: Profile,
    fired: list[DefectFiring] | None,
    firing: DefectFiring | None,
    node: fx.Node,
) -> Callable[..., torch.Tensor]:
    """The card's softmax inside SDPA (hfadapt.spyre.numerics.kernels.sdpa_softmax, with the profile's
    leak) for the softmax ``node``; ``fired`` gets ``firing`` when a row is misread at run time
    (a host -inf mask). A DL16 result comes back rounded (the function's ``dl16_output``)."""
    params = profile.numeric_params
    floor = params.softmax_exp_floor or 0.0
    code = profile.dl16.host_inf
    key_stick = params.sdpa_unaligned_keys  # torch-spyre#3113
    value = node_value(node)
    fmt = profile.dl16 if value is not None and is_dl16_dtype(value.dtype) else None

    def softmax(x: torch.Tensor, dim: int, half_to_float: bool = False) -> torch.Tensor:
        out, misread = sdpa_softmax(x, dim, floor, code, True, fmt, key_stick)
        if misread and fired is not None and firing is not None:
            fired.append(firing)
        return out

    softmax.__name__ = "spyre_sdpa_softmax"
    softmax.dl16_output = fmt is not None  # type: ignore[attr-defined]
    return softmax


def _sdpa_softmaxes(gm: fx.GraphModule) -> list[fx.Node]:
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and op_name(n.target).split(".", 1)[0] in ("aten::_softmax", "aten::softmax")
        and _sdpa_group(n) is not None
    ]


# -- triggers --------------------------------------------------------------------------------

_MASK_CONSUMERS = frozenset({"aten::add", "aten::where", "aten::masked_fill", "aten::sub"})


def _sdpa_group(node: fx.Node) -> str | None:
    stack = node.meta.get("source_fn_stack") or []
    if not stack:
        return None
    name, fn = stack[-1][0], stack[-1][1]
    fn_name = getattr(fn, "__name__", str(fn))
    return str(name) if "scaled_dot_product_attention" in fn_name else None


def sdpa_noncontiguous_qkv(gm: fx.GraphModule) -> list[Match]:
    groups: dict[str, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and (group := _sdpa_group(node)) is not None:
            groups.setdefault(group, []).append(node)
    found = []
    for nodes in groups.values():
        members = set(nodes)
        readers: dict[fx.Node, set[fx.Node]] = {}
        for node in nodes:
            for inp in node.all_input_nodes:
                if inp not in members:
                    readers.setdefault(inp, set()).add(node)
        for inp, consumers in readers.items():
            t = float4d(inp)
            if t is None or memory_order(t) is None:
                continue
            if any(op_name(c.target).split(".", 1)[0] in _MASK_CONSUMERS for c in consumers):
                continue  # the attention mask, not Q, K or V
            found.append(Match(inp, frozenset(consumers), min(consumers, key=position(gm))))
    return found


_FILLS = frozenset(
    {
        "aten::full",
        "aten::full_like",
        "aten::new_full",
        "aten::scalar_tensor",
        "aten::fill",
        "aten::masked_fill",
        "aten::where",
        "aten::constant_pad_nd",
    }
)
# ops past which a fill's value no longer stands as is
_STOPS = frozenset(
    {"aten::mm", "aten::bmm", "aten::addmm", "aten::sum", "aten::mean", "aten::amax", "aten::exp"}
)


def _is_minus_inf(value: object) -> bool:
    return isinstance(value, float) and value == float("-inf")


def minus_inf_fill_into_sdpa_softmax(gm: fx.GraphModule) -> list[Match]:
    fills = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and op_name(n.target).split(".", 1)[0] in _FILLS
        and any(_is_minus_inf(a) for a in (*n.args, *n.kwargs.values()))
    ]
    found: dict[fx.Node, fx.Node] = {}
    for fill in fills:
        seen, todo = {fill}, [fill]
        while todo:
            node = todo.pop()
            for user in node.users:
                if user in seen or user.op != "call_function":
                    continue
                seen.add(user)
                packet = op_name(user.target).split(".", 1)[0]
                if packet in ("aten::_softmax", "aten::softmax"):
                    if _sdpa_group(user) is not None:
                        found.setdefault(user, fill)
                elif packet not in _STOPS:
                    todo.append(user)
    return [Match(fill, frozenset({softmax}), softmax) for softmax, fill in found.items()]


def _carries_minus_inf_fill(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes whose value still holds a ``-inf`` fill made in the graph (followed from each fill
    through ops that keep values, up to the ops in ``_STOPS``)."""
    carried: set[fx.Node] = set()
    todo = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function"
        and op_name(n.target).split(".", 1)[0] in _FILLS
        and any(_is_minus_inf(a) for a in (*n.args, *n.kwargs.values()))
    ]
    while todo:
        node = todo.pop()
        if node in carried:
            continue
        carried.add(node)
        todo += [
            u
            for u in node.users
            if u.op == "call_function" and op_name(u.target).split(".", 1)[0] not in _STOPS
        ]
    return carried


def bf16_add_of_minus_infs(gm: fx.GraphModule) -> list[Match]:
    carried = _carries_minus_inf_fill(gm)
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or op_name(node.target).split(".", 1)[0] != "aten::add":
            continue
        out = node_value(node)
        operands = [a for a in node.args[:2] if isinstance(a, fx.Node)]
        if out is None or out.dtype != torch.bfloat16 or len(operands) != 2:
            continue
        if all(a in carried for a in operands):
            found.append(Match(node, frozenset({node}), node))
    return found


def add_minus_infs_nan(a: torch.Tensor, b: torch.Tensor, *, alpha: float = 1) -> torch.Tensor:
    """a + alpha * b as the card's bf16 add computes it: -inf + -inf is NaN. A -inf fill is
    held on the device as its code, -0xEFFF (-3.35e7): any value at or below it counts."""
    out = torch.add(a, b, alpha=alpha)
    both = (a <= -FILL_CODE) & ((b if alpha > 0 else -b) <= -FILL_CODE)
    return out.masked_fill(both, float("nan"))


def _node_values(node: fx.Node) -> tuple[Any, dict[str, Any]]:
    """A call node's args and kwargs with each input node replaced by its recorded value."""
    args = fx.node.map_arg(node.args, lambda n: n.meta.get("val"))
    kwargs = fx.node.map_arg(node.kwargs, lambda n: n.meta.get("val"))
    return args, dict(kwargs)


def _op_trigger(name: str) -> Callable[[fx.GraphModule], list[Match]]:
    """A per-op trigger of hfadapt.spyre.rules.op_defects, matched on each call node's values."""
    spec = OP_TRIGGERS[name]

    def trigger(gm: fx.GraphModule) -> list[Match]:
        found = []
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            op = op_name(node.target)
            if op.split(".", 1)[0] not in spec.ops:
                continue
            args, kwargs = _node_values(node)
            if not spec.matches(op, args, kwargs):
                continue
            if spec.misread_input:
                inp = node.args[0]
                if isinstance(inp, fx.Node):
                    found.append(Match(inp, frozenset({node}), node))
            else:
                found.append(Match(node, frozenset({node}), node))
        return found

    return trigger


def _op_replacement(name: str, op: str) -> Callable[..., torch.Tensor]:
    compute = OP_TRIGGERS[name].compute
    assert compute is not None

    def replaced(*args: object, **kwargs: object) -> torch.Tensor:
        return compute(op, args, kwargs)

    replaced.__name__ = f"spyre_defect_{name}"
    return replaced


TRIGGERS: dict[str, Callable[[fx.GraphModule], list[Match]]] = {
    "sdpa_noncontiguous_qkv": sdpa_noncontiguous_qkv,
    "minus_inf_fill_into_sdpa_softmax": minus_inf_fill_into_sdpa_softmax,
    "bf16_add_of_minus_infs": bf16_add_of_minus_infs,
    "view_transpose_64": view_transpose_64,
    "rotate_half_slice": rotate_half_slice,
    **{name: _op_trigger(name) for name in OP_TRIGGERS},
}
# triggers that span two graphs: matched when the graphs run, not here (the post-LayerNorm
# handoff: hfadapt.spyre.compile.handoff, which names the same trigger)
CROSS_GRAPH_TRIGGERS = frozenset({"post_ln_output_into_next_graph_matmul"})
# triggers whose anchor op computes wrongly (the op is replaced), not a misread input
REPLACEMENTS: dict[str, Callable[..., torch.Tensor]] = {
    "minus_inf_fill_into_sdpa_softmax": softmax_amax_misread,
    "bf16_add_of_minus_infs": add_minus_infs_nan,
    "rotate_half_slice": slice_from_start,
}


# -- firing ----------------------------------------------------------------------------------

_ROOT = re.compile(r"^L\['[^']+'\]\.?")
_INDEX = re.compile(r"\[(?:'([^']*)'|(\d+))\]")
# a module reached through one of its bound methods (``layers.0.self_attn.forward.__self__``,
# as Dynamo records a method an adapter keeps on the module): the module itself
_BOUND = re.compile(r"\.[A-Za-z_]\w*\.__self__")


def module_path(node: fx.Node) -> tuple[str, str]:
    """(module path below the compiled model, module class) of the innermost module Dynamo
    recorded for ``node`` (``encoder.layer.0.attention.self``); ("", "") without one."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1][:2]
    path = _INDEX.sub(lambda m: "." + (m.group(1) or m.group(2)), _ROOT.sub("", str(path)))
    path = _BOUND.sub("", path)
    name = getattr(cls, "__name__", None) or str(cls).rsplit(".", 1)[-1].strip("'>")
    return path.strip("."), name


def firing_at(
    anchor: fx.Node, value: torch.Tensor, defect_id: str, source: str, effect: str
) -> DefectFiring:
    """The lowering-report entry of a defect firing at ``anchor``, reading ``value``."""
    module, cls = module_path(anchor)
    return DefectFiring(
        defect_id=defect_id,
        source=source,
        effect=effect,
        op=op_name(anchor.target),
        node=anchor.name,
        module=module,
        module_class=cls,
        shape=tuple(int(s) for s in value.shape),
        stride=tuple(int(s) for s in value.stride()),
        dtype=str(value.dtype).removeprefix("torch."),
        location=source_location(anchor),
    )


def find_defects(
    gm: fx.GraphModule, profile: Profile, fired: list[DefectFiring] | None = None
) -> list[Corruption]:
    """Every firing of the profile's compile-mode defects in this graph. ``fired``: where the
    program appends the firings only its data shows (a host -inf mask reaching SDPA's
    softmax: its code lands on 0xEFFF like an in-graph fill's)."""
    out = []
    for defect in profile.active_defects("compile"):
        if defect.trigger in CROSS_GRAPH_TRIGGERS:
            continue  # matched across graphs, at run time (hfadapt.spyre.compile.handoff)
        trigger = TRIGGERS.get(defect.trigger)
        if trigger is None:
            raise ProfileError(
                f"profile {profile.name}: defect {defect.id} names unknown trigger "
                f"{defect.trigger!r} (known: {', '.join(sorted([*TRIGGERS, *CROSS_GRAPH_TRIGGERS]))})"
            )
        for match in trigger(gm):
            out.append(_corruption(defect, match, profile))
        if defect.trigger == "minus_inf_fill_into_sdpa_softmax":
            out += _runtime_amax(gm, defect, profile, {c.anchor for c in out}, fired)
    return out


def _runtime_amax(
    gm: fx.GraphModule,
    defect: Defect,
    profile: Profile,
    anchored: set[fx.Node | None],
    fired: list[DefectFiring] | None,
) -> list[Corruption]:
    """SDPA softmaxes no in-graph fill reaches: their mask may still carry a host -inf (data
    of a graph input), which the card misreads the same way; checked when the program runs."""
    out = []
    for node in _sdpa_softmaxes(gm):
        if node in anchored or (t := node_value(node)) is None:
            continue
        firing = firing_at(node, t, defect.id, profile.defect_source(defect), defect.effect)
        replace = _sdpa_softmax(profile, fired, firing, node)
        shape = tuple(int(s) for s in t.shape)
        out.append(Corruption(firing, node, frozenset(), (), shape, node, replace, runtime=True))
    return out


def _corruption(defect: Defect, match: Match, profile: Profile) -> Corruption:
    replace = REPLACEMENTS.get(defect.trigger)
    spec = OP_TRIGGERS.get(defect.trigger)
    if spec is not None and spec.compute is not None:
        replace = _op_replacement(defect.trigger, op_name(match.anchor.target))
    if defect.trigger == "minus_inf_fill_into_sdpa_softmax":
        # recorded at build: the fill is in-graph
        replace = _sdpa_softmax(profile, None, None, match.anchor)
    # the value read wrongly, or (an op computing wrongly) the op's own result
    t = node_value(match.value if replace is None else match.anchor)
    assert t is not None
    order = (match.order or memory_order(t)) if replace is None else ()
    assert order is not None
    firing = firing_at(match.anchor, t, defect.id, profile.defect_source(defect), defect.effect)
    if replace is not None:
        return Corruption(
            firing, match.value, frozenset(), (), tuple(t.shape), match.anchor, replace
        )
    return Corruption(firing, match.value, match.consumers, order, tuple(int(s) for s in t.shape))
