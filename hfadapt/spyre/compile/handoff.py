"""``defect.post_ln_handoff``: a post-LayerNorm graph output misread by the next graph's matmul.

hf-adapters ``hf_common.py`` (encoder_backbone_forward, vision_backbone_forward): "BERT post-LN
ends each block on a broadcast against a 1D weight/bias. Spyre tensors produced this way read
correctly via ``.to("cpu")`` but are mis-read by subsequent on-device ops, so the next compiled
block's matmul sees garbage. ``.clone()`` in eager Python (outside torch.compile) allocates a
fresh canonical-layout tensor and copies through, fixing the handoff."

Unlike the per-graph defects (hfadapt.spyre.compile.defects), this one spans two graphs, and
whether it fires is only known when the second graph runs: Dynamo compiles each graph once and
reuses it for every call. So it is modelled in two halves, both decided at build time and
checked at run time without guards:

- the producer: each graph output whose value is a LayerNorm result (``native_layer_norm`` /
  ``layer_norm`` with a weight or bias, or the affine ``mul`` / ``add`` against a 1-D weight or
  bias inside an ``nn.LayerNorm`` module, as the ``layer-norm-unfused`` adapter writes it;
  through views and in-graph clones: a clone compiled in the graph does not fix it) is *marked*
  when the program returns it (a weak registry keyed on the tensor's storage, so eager views of
  it stay marked; the mark lives as long as the returned tensor);
- the reader: each graph input that reaches a matmul (mm, addmm, bmm, linear, matmul; through
  views and clones) gets a check in the generated program: when the tensor it is called with
  is marked, the matmul-side readers of that input read it misread (other readers, such as a
  residual add, read it right). The first firing of each input is recorded in the graph's
  lowering report (the module and ATen node of the matmul that misreads).

Reading the output on the host (the model's result, judged against the reference) is fine; any
eager op between the graphs (``.clone()`` in the ``post-ln-handoff-clone`` adapter) makes a
fresh tensor that carries no mark.

The misread (inferred; the source says "mis-read" and "garbage", not how): the broadcast
leaves the result in the 1-D operand's dimension-major order, the feature dimension outermost;
the next graph's matmul walks that storage as canonical ``[.., S, H]`` row-major data, i.e. it
reads ``x.transpose(-1, -2)``'s memory as ``x``'s shape (``misread_layout`` with the last two
dimensions swapped). Tokens and features mix: the block's output is garbage (per-token cosine
about 0), one copy per firing.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import fx

from hfadapt.spyre.compile.defects import firing_at, misread_layout, module_path
from hfadapt.spyre.compile.graph_rules import op_name
from hfadapt.spyre.rules.lowering_report import DefectFiring, LoweringReport
from hfadapt.spyre.rules.profile import Defect, Profile

__all__ = [
    "TRIGGER",
    "HandoffPlan",
    "is_marked",
    "ln_outputs",
    "mark",
    "matmul_inputs",
    "plan_handoff",
]

TRIGGER = "post_ln_output_into_next_graph_matmul"

_MATMULS = frozenset(
    {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul"}
)
# ops through which a value is still the same data in the same (device) layout
_PASS_THROUGH = frozenset(
    {"aten::clone", "aten::alias", "aten::_unsafe_view", "aten::detach", "aten::contiguous"}
)
_LN_OPS = frozenset({"aten::native_layer_norm", "aten::layer_norm"})
_AFFINE = frozenset({"aten::add", "aten::mul"})


def _packet(node: fx.Node) -> str:
    return op_name(node.target).split(".", 1)[0] if node.op == "call_function" else ""


def _passes(node: fx.Node) -> bool:
    return node.op == "call_function" and (
        bool(getattr(node.target, "is_view", False)) or _packet(node) in _PASS_THROUGH
    )


def _val(node: object) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _in_layer_norm(node: fx.Node) -> bool:
    """Whether Dynamo recorded ``node`` inside an ``nn.LayerNorm`` (any subclass) module."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return False
    cls = list(stack.values())[-1][1]
    return isinstance(cls, type) and issubclass(cls, torch.nn.LayerNorm)


def _ln_result(node: fx.Node) -> fx.Node | None:
    """The LayerNorm node whose result ``node`` is (through views and clones), or None."""
    while _passes(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    if node.op != "call_function":
        return None
    packet = _packet(node)
    if node.target is operator.getitem:
        parent, index = node.args[0], node.args[1]
        if isinstance(parent, fx.Node) and _packet(parent) in _LN_OPS and index == 0:
            return parent if any(a is not None for a in parent.args[2:4]) else None
        return None
    if packet in _LN_OPS:
        return node if any(a is not None for a in node.args[2:4]) else None
    if packet in _AFFINE and _in_layer_norm(node):
        out = _val(node)
        if out is None or out.dim() < 2:
            return None
        for arg in node.args[:2]:
            t = _val(arg)
            if t is not None and t.dim() == 1 and t.shape[0] == out.shape[-1]:
                return node  # the broadcast against the 1-D weight or bias
    return None


def _outputs(gm: fx.GraphModule) -> list[object]:
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = out.args[0]
    return list(values) if isinstance(values, (list, tuple)) else [values]


def ln_outputs(gm: fx.GraphModule) -> dict[int, fx.Node]:
    """Graph output position -> the LayerNorm node its value comes from."""
    found = {}
    for position, value in enumerate(_outputs(gm)):
        if isinstance(value, fx.Node) and (t := _val(value)) is not None and t.dim() >= 2:
            ln = _ln_result(value)
            if ln is not None:
                found[position] = ln
    return found


@dataclass(frozen=True)
class Reader:
    """A graph input some matmul reads: the input's direct users on the way to a matmul (they
    read the misread value) and the first matmul reached (the node reported)."""

    index: int
    node: fx.Node
    consumers: frozenset[fx.Node]
    anchor: fx.Node


def matmul_inputs(gm: fx.GraphModule, static: Iterable[int] = ()) -> dict[int, Reader]:
    """Placeholder index -> its matmul readers (floating inputs of two or more dimensions;
    ``static``: indices of parameters and buffers, which no graph returns, left out)."""
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    found = {}
    skip = set(static)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for index, node in enumerate(placeholders):
        t = _val(node)
        if index in skip or t is None or t.dim() < 2 or not t.is_floating_point():
            continue
        consumers, anchors = set(), []
        for user in node.users:
            seen, todo = {user}, [user]
            while todo:
                current = todo.pop()
                if _packet(current) in _MATMULS:
                    consumers.add(user)
                    anchors.append(current)
                elif _passes(current):
                    todo += [u for u in current.users if u not in seen]
                    seen.update(current.users)
        if consumers:
            anchor = min(anchors, key=position.__getitem__)
            found[index] = Reader(index, node, frozenset(consumers), anchor)
    return found


# -- the marks ----------------------------------------------------------------------------------

_lock = threading.Lock()
# storage address -> (the marked tensor, while it lives; the LayerNorm module that made it)
_marks: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


def mark(t: torch.Tensor, origin: str) -> torch.Tensor:
    """Record that ``t`` (a graph output) holds a post-LayerNorm result in the broadcast's
    layout. Returns ``t``."""
    key = _storage_key(t)
    if key == 0:
        return t

    def forget(_ref: weakref.ref[torch.Tensor], key: int = key) -> None:
        with _lock:
            entry = _marks.get(key)
            if entry is not None and entry[0] is _ref:
                del _marks[key]

    with _lock:
        _marks[key] = (weakref.ref(t, forget), origin)
    return t


def is_marked(t: torch.Tensor) -> str | None:
    """The LayerNorm module whose graph output ``t`` is (or a view of), None when unmarked."""
    if not isinstance(t, torch.Tensor):
        return None
    entry = _marks.get(_storage_key(t))
    if entry is None or entry[0]() is None:
        return None
    return entry[1]


# -- the plan a graph's program carries ------------------------------------------------------------


@dataclass
class HandoffPlan:
    """What the generated program of one graph does about the defect: which outputs it marks
    (position -> the LayerNorm module) and which inputs it checks (index -> reader); ``fired``
    collects the firings of the inputs found marked, for the graph's report."""

    defect: Defect
    source: str
    marks: dict[int, str] = field(default_factory=dict)
    readers: dict[int, Reader] = field(default_factory=dict)
    fired: dict[int, DefectFiring] = field(default_factory=dict)
    reported: set[int] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.marks or self.readers)

    def marker(self, position: int) -> Callable[[torch.Tensor], torch.Tensor]:
        origin = self.marks[position]

        def mark_output(t: torch.Tensor) -> torch.Tensor:
            return mark(t, origin)

        mark_output.__name__ = f"post_ln_mark_{position}"
        return mark_output

    def checker(self, index: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``check(raw, held)``: the value the matmul readers of input ``index`` read: the held
        device value, misread when the tensor the graph was called with is marked."""
        reader = self.readers[index]
        t = _val(reader.node)
        assert t is not None
        shape = tuple(int(s) for s in t.shape)
        order = (*range(len(shape) - 2), len(shape) - 1, len(shape) - 2)

        def check(raw: torch.Tensor, held: torch.Tensor) -> torch.Tensor:
            origin = is_marked(raw)
            if origin is None:
                return held
            if index not in self.fired:
                self.fired[index] = self._firing(reader, origin, raw)
            return misread_layout(held, order, shape)

        check.__name__ = f"post_ln_check_{index}"
        return check

    def _firing(self, reader: Reader, origin: str, raw: torch.Tensor) -> DefectFiring:
        effect = f"{self.defect.effect} (the output of {origin or 'a LayerNorm'})"
        return firing_at(reader.anchor, raw, self.defect.id, self.source, effect)

    def report_firings(self, report: LoweringReport) -> None:
        """Add the firings not yet in ``report`` (called after each run of the program)."""
        for index, firing in self.fired.items():
            if index not in self.reported:
                report.add_defect(firing)
                self.reported.add(index)


def plan_handoff(
    gm: fx.GraphModule, profile: Profile, static: Iterable[int] = ()
) -> HandoffPlan | None:
    """The plan for one graph, None when the profile has no active post-LN handoff defect or
    the graph neither returns a LayerNorm result nor reads an input with a matmul (``static``:
    the parameter and buffer inputs, never checked)."""
    defect = next((d for d in profile.active_defects("compile") if d.trigger == TRIGGER), None)
    if defect is None:
        return None
    plan = HandoffPlan(defect, profile.defect_source(defect))
    for position, ln in ln_outputs(gm).items():
        plan.marks[position] = module_path(ln)[0] or "LayerNorm"
    plan.readers = matmul_inputs(gm, static)
    return plan if plan else None
