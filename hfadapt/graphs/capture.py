"""Capturing a rewritten method as a graph artifact with ``torch.export`` (run inside the sandbox,
where the draft's Python is allowed to run; nothing here is trusted by the parent, which
validates and proves what comes out).

The method is exported twice on the meta device, once with every floating-point tensor in
bfloat16 and once in float16, with every size dynamic (``Dim.AUTO``: export keeps dynamic what
the code does not pin). The two graphs must be the same but for the dtype: where they differ
by exactly the input dtype, the artifact says ``$dtype``; a float that is the same limit of
each dtype (``finfo(dtype).min / 2``) becomes a ``finfo`` symbol; the meta device (where the
inputs were) becomes ``$device`` and the CPU stays the host. Any other difference means the
code branches on the dtype, which one graph cannot hold: refused with the node that differs."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.export import Dim

from hfadapt import settings
from hfadapt import torch_internals as ti
from hfadapt.errors import GraphError
from hfadapt.graphs import ops, values
from hfadapt.graphs.artifact import GraphArtifact, Node, Slot, TensorInput

EXPORT_DTYPES = (torch.bfloat16, torch.float16)
_SKIP = (torch.ops.aten._assert_tensor_metadata.default,)


def call_template(
    args: tuple[object, ...], kwargs: dict[str, object]
) -> tuple[Any, Any, list[torch.Tensor]]:
    """(args template, kwargs template, the call's tensors in order): tensors become slots,
    plain values stay as they are; anything else cannot be part of a graph's call."""
    tensors: list[torch.Tensor] = []

    def walk(v: object, depth: int = 0) -> Any:
        if isinstance(v, torch.Tensor):
            tensors.append(v)
            return Slot(len(tensors) - 1)
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if depth < 4 and isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
            items = [walk(x, depth + 1) for x in v]
            return items if isinstance(v, list) else tuple(items)
        if depth < 4 and type(v) is dict and all(isinstance(k, str) for k in v):
            return {k: walk(x, depth + 1) for k, x in v.items()}
        raise GraphError(
            f"the call passes a {type(v).__name__}; a graph's call holds tensors and plain values only"
        )

    a = tuple(walk(v) for v in args)
    k = {name: walk(v) for name, v in kwargs.items()}
    return a, k, tensors


def fill_template(template: Any, tensors: list[Any]) -> Any:
    """The call's value with each slot replaced by its tensor."""
    if isinstance(template, Slot):
        return tensors[template.index]
    if isinstance(template, list):
        return [fill_template(v, tensors) for v in template]
    if isinstance(template, tuple):
        return tuple(fill_template(v, tensors) for v in template)
    if isinstance(template, dict):
        return {k: fill_template(v, tensors) for k, v in template.items()}
    return template


def module_tensors(module: torch.nn.Module) -> dict[str, tuple[str, torch.Tensor]]:
    """Every parameter and buffer of ``module`` by path (tied ones under each of their names):
    what a graph reads of the module instance, as (kind, tensor)."""
    out: dict[str, tuple[str, torch.Tensor]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        out[name] = ("param", p)
    for name, b in module.named_buffers(remove_duplicate=False):
        if b is not None:
            out[name] = ("buffer", b)
    return out


class _Call(torch.nn.Module):
    """The method on one module instance, with the module's tensors and the call's tensors as
    inputs (the module is held outside the module tree: its tensors come in as inputs)."""

    def __init__(
        self, inner: torch.nn.Module, fn: Callable[..., object], args_t: object, kwargs_t: object
    ) -> None:
        super().__init__()
        object.__setattr__(self, "inner", inner)
        self.fn, self.args_t, self.kwargs_t = fn, args_t, kwargs_t

    def forward(self, state: dict[str, torch.Tensor], tensors: list[torch.Tensor]) -> object:
        args = fill_template(self.args_t, tensors)
        kwargs = fill_template(self.kwargs_t, tensors)
        inner: torch.nn.Module = self.__dict__["inner"]
        with ti.reparametrize_module(inner, state):
            return self.fn(inner, *args, **kwargs)


class FunctionSite(torch.nn.Module):
    """The stand-in module a module-level function's call is captured and proven on: the call's
    objects that are neither tensors nor plain values (a model's ``config``) are held here by
    parameter name, so a graph's call keeps tensors and plain values only. It owns no tensors.
    Where a config is held, its attention implementation is kept as a plain attribute: the
    attributes a graph was proven with are the conditions it applies under, and a mask for
    ``sdpa`` is not a mask for ``eager``."""

    def __init__(self, context: dict[str, object] | None = None) -> None:
        super().__init__()
        self._context_names: tuple[str, ...] = tuple(sorted(context or {}))
        for name, value in (context or {}).items():
            object.__setattr__(self, name, value)  # kept out of the module tree
        config = (context or {}).get("config")
        impl = getattr(config, "_attn_implementation", None) if config is not None else None
        if isinstance(impl, str):
            self.attn_implementation = impl

    def context(self) -> dict[str, object]:
        """The held objects, by the parameter name they are passed as."""
        return {name: self.__dict__[name] for name in self._context_names}


def split_function_call(
    fn: Callable[..., object], args: tuple[object, ...], kwargs: dict[str, object]
) -> tuple[dict[str, object], dict[str, object]]:
    """A call of a module-level function as (graph keywords: tensors and plain values, held
    objects: everything else, by parameter name); every argument is passed by name. Raises
    GraphError when the call cannot be split (a ``*args`` parameter)."""
    import inspect

    sig = inspect.signature(fn)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        raise GraphError(f"the call does not fit {getattr(fn, '__name__', fn)}: {exc}") from exc
    named: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                raise GraphError(f"the call passes *{name}; a graph's call names every argument")
        elif kind is inspect.Parameter.VAR_KEYWORD:
            named.update(value)
        else:
            named[name] = value
    graph: dict[str, Any] = {}
    held: dict[str, Any] = {}
    for name, value in named.items():
        try:
            call_template((value,), {})
            graph[name] = value
        except GraphError:
            held[name] = value
    return graph, held


def _to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    t = t.detach()
    return (t.to(dtype) if t.is_floating_point() else t).to("meta")


def export_once(
    module: torch.nn.Module,
    fn: Callable[..., object],
    args: tuple[object, ...],
    kwargs: dict[str, object],
    dtype: torch.dtype,
) -> torch.export.ExportedProgram:
    """``torch.export`` of ``fn(module, *args, **kwargs)`` on meta tensors in ``dtype``,
    functionalized (``run_decompositions({})``)."""
    args_t, kwargs_t, tensors = call_template(args, kwargs)
    state = {name: _to(t, dtype) for name, (_, t) in module_tensors(module).items()}
    moved = [_to(t, dtype) for t in tensors]
    dynamic = (
        {name: {i: Dim.AUTO for i in range(t.dim())} for name, t in state.items()},
        [{i: Dim.AUTO for i in range(t.dim())} for t in moved],
    )
    program = torch.export.export(
        _Call(module, fn, args_t, kwargs_t), (state, moved), dynamic_shapes=dynamic, strict=False
    )
    functional: torch.export.ExportedProgram = program.run_decompositions({})  # untyped in torch
    return functional


def capture_method(
    module: torch.nn.Module,
    fn: Callable[..., object],
    args: tuple[object, ...],
    kwargs: dict[str, object],
    *,
    dtypes: tuple[torch.dtype, torch.dtype] = EXPORT_DTYPES,
    trusted: bool = False,
) -> GraphArtifact:
    """The graph artifact of ``fn(module, *args, **kwargs)``. Raises GraphError when the code
    cannot be one graph (it branches on the dtype, uses an op outside the allowlist, returns
    something other than tensors and plain values) and lets torch.export's own errors (data-
    dependent control flow, say) through for the caller to report. ``trusted`` (the library's
    own code, captured in the parent to compare a draft with) skips the two checks aimed at a
    draft: the export again in another process state, and the rebinding of globals."""
    args_t, kwargs_t, _ = call_template(args, kwargs)
    kinds = {name: kind for name, (kind, _) in module_tensors(module).items()}
    before = {} if trusted else global_bindings()
    exported = [export_once(module, fn, args, kwargs, d) for d in dtypes]
    if not trusted:
        _check_no_state(module, fn, args, kwargs, exported[1], dtypes[1], before)
    return _merge(exported, dtypes, kinds, args_t, kwargs_t)


def _check_no_state(
    module: torch.nn.Module,
    fn: Callable[..., object],
    args: tuple[object, ...],
    kwargs: dict[str, object],
    exported: torch.export.ExportedProgram,
    dtype: torch.dtype,
    before: dict[str, object],
) -> None:
    """Raises GraphError when the code's graph in ``dtype`` changes with the process's state, or
    when it rebound a global since ``before`` (what a draft could do; see capture_method)."""
    # Once more, with the process in another state: more threads, the code already called,
    # an environment variable changed, the clock later. A graph holds no Python state; code
    # whose graph changes with it would behave one way when proven and another when used.
    with _another_state(module, fn, args, kwargs):
        again = export_once(module, fn, args, kwargs, dtype)
    where = _first_difference(exported, again)
    if where:
        raise GraphError(
            f"the code computes differently when run again ({where}): it reads state a graph "
            "cannot hold (call counts, threads, time, environment, module attributes)"
        )
    rebound = sorted(k for k, v in global_bindings().items() if before.get(k) is not v)
    if rebound:
        raise GraphError(
            f"the code rebinds {', '.join(rebound[:5])}: a side effect on the process, which a "
            "graph cannot carry (and hfadapt would not ship)"
        )


_WATCHED = (
    "torch",
    "torch.nn",
    "torch.nn.functional",
    "torch.linalg",
    "torch.special",
    "math",
    "builtins",
    "operator",
)


def global_bindings() -> dict[str, object]:
    """Every attribute of the modules model code calls into (and of ``torch.Tensor``), by
    name: what a draft could rebind for the whole process."""
    import importlib

    found: dict[str, Any] = {}
    for name in _WATCHED:
        module = importlib.import_module(name)
        for attr, value in list(vars(module).items()):
            found[f"{name}.{attr}"] = value
    for attr, value in list(vars(torch.Tensor).items()):
        found[f"torch.Tensor.{attr}"] = value
    return found


@contextlib.contextmanager
def _another_state(
    module: torch.nn.Module, fn: Callable[..., Any], args: Any, kwargs: Any
) -> Iterator[None]:
    """Change what a draft could read besides its inputs (the thread count, the environment,
    whatever a first real call moves) for the second export."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        with settings.exported({settings.HFADAPT_CAPTURE_ROUND.name: "2"}):
            with torch.no_grad():  # a real call first: counters move, caches fill
                fn(module, *args, **kwargs)
            yield
    finally:
        torch.set_num_threads(threads)


def _first_difference(a: Any, b: Any) -> str:
    """Where two exports of the same call in the same dtype differ ("" when they do not)."""
    na = [n for n in a.graph.nodes if not (n.op == "call_function" and n.target in _SKIP)]
    nb = [n for n in b.graph.nodes if not (n.op == "call_function" and n.target in _SKIP)]
    if len(na) != len(nb):
        return f"{len(na)} vs {len(nb)} graph nodes"
    pos = {n: i for i, n in enumerate(na)} | {n: i for i, n in enumerate(nb)}

    def same(x: object, y: object) -> bool:
        if isinstance(x, torch.fx.Node) or isinstance(y, torch.fx.Node):
            return (
                isinstance(x, torch.fx.Node)
                and isinstance(y, torch.fx.Node)
                and pos.get(x) == pos.get(y)
            )
        if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            return len(x) == len(y) and all(same(p, q) for p, q in zip(x, y, strict=True))
        if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            return True
        return type(x) is type(y) and x == y

    for x, y in zip(na, nb, strict=True):
        if x.op != y.op or x.target != y.target:
            return f"at {x.name}: {x.target} vs {y.target}"
        if not same(tuple(x.args), tuple(y.args)) or set(x.kwargs) != set(y.kwargs):
            return f"at {x.name}: different arguments"
        if not all(same(x.kwargs[k], y.kwargs[k]) for k in x.kwargs):
            return f"at {x.name}: different arguments"
    for ca, cb in zip(sorted(a.constants.items()), sorted(b.constants.items()), strict=False):
        if ca[0] != cb[0] or not torch.equal(ca[1], cb[1]):
            return f"constant {ca[0]}"
    return ""


# -- turning two exports into one artifact -------------------------------------------------------


def _sym_names(programs: list[torch.export.ExportedProgram]) -> list[dict[str, str]]:
    """Per program: export's symbol name -> the artifact's canonical name (s0, s1, ... in order
    of first appearance among the inputs)."""
    out = []
    for program in programs:
        names: dict[str, str] = {}
        for node in program.graph.nodes:
            if node.op != "placeholder":
                continue
            val = node.meta.get("val")
            for size in getattr(val, "shape", ()):
                if isinstance(size, torch.SymInt) and not getattr(
                    size.node.expr, "is_number", False
                ):
                    expr = str(size.node.expr)
                    if not expr.isidentifier():
                        raise GraphError(
                            f"an input size is the expression {expr}, not a plain size"
                        )
                    names.setdefault(expr, f"s{len(names)}")
        out.append(names)
    return out


def _shape(val: torch.Tensor, names: dict[str, str]) -> tuple[int | str, ...]:
    return tuple(_size(s, names) for s in val.shape)


def _size(s: int | torch.SymInt, names: dict[str, str]) -> int | str:
    if isinstance(s, torch.SymInt):
        expr = s.node.expr
        if getattr(expr, "is_number", False):
            return int(expr)
        return names[str(expr)]
    return int(s)


def _dtype_name(
    pair: tuple[torch.dtype, torch.dtype], dtypes: tuple[torch.dtype, ...], where: str
) -> str:
    if pair == tuple(dtypes):
        return values.DTYPE_SYMBOL
    if pair[0] == pair[1]:
        name = next((k for k, v in values.DTYPES.items() if v == pair[0]), None)
        if name is not None:
            return name
    raise GraphError(
        f"{where}: dtype {pair[0]} with {dtypes[0]} inputs but {pair[1]} with {dtypes[1]}"
    )


def _merge(
    programs: list[Any],
    dtypes: tuple[torch.dtype, torch.dtype],
    kinds: dict[str, str],
    args_t: Any,
    kwargs_t: Any,
) -> GraphArtifact:
    """One artifact from the two exports of a call (one per dtype): the same nodes in the
    same order, dtypes written as the input's dtype where the two differ."""
    a, b = programs
    sym = _sym_names(programs)
    nodes_a = [n for n in a.graph.nodes if not (n.op == "call_function" and n.target in _SKIP)]
    nodes_b = [n for n in b.graph.nodes if not (n.op == "call_function" and n.target in _SKIP)]
    if len(nodes_a) != len(nodes_b):
        raise GraphError(
            f"the code computes differently in {dtypes[0]} and {dtypes[1]} "
            f"({len(nodes_a)} vs {len(nodes_b)} graph nodes): it branches on the dtype"
        )
    merged = _Merged(a, b, dtypes, kinds, sym)
    output: Any = None
    for na, nb in zip(nodes_a, nodes_b, strict=True):
        if na.op != nb.op or (na.op == "call_function" and na.target != nb.target):
            raise GraphError(
                f"the code computes differently in {dtypes[0]} and {dtypes[1]} at {na.name}: it branches on the dtype"
            )
        if na.op == "placeholder":
            merged.placeholder(na, nb)
        elif na.op == "output":
            output = _output(na, nb, merged.index, a)
            break
        elif na.op == "call_function":
            merged.call(na, nb)
        else:
            raise GraphError(f"node {na.name} is a {na.op}, which a graph does not hold")
    # inputs first, in order: placeholders always precede the nodes in an exported graph
    if merged.user_seen != len(merged.user):
        raise GraphError("not every input of the export is used as a placeholder")
    return GraphArtifact(
        merged.inputs, merged.nodes, output, _ranges(a, sym), args_t, kwargs_t, merged.constants
    )


class _Merged:
    """The artifact being built from two exports, node by node."""

    def __init__(
        self,
        a: torch.export.ExportedProgram,
        b: torch.export.ExportedProgram,
        dtypes: tuple[torch.dtype, torch.dtype],
        kinds: dict[str, str],
        sym: list[dict[str, str]],
    ) -> None:
        from torch.export.graph_signature import InputKind

        self.a, self.b, self.dtypes, self.kinds, self.sym = a, b, dtypes, kinds, sym
        self.specs = {s.arg.name: s for s in a.graph_signature.input_specs}
        self.user = [s for s in a.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
        self.state_names = list(kinds)
        self.index: dict[Any, int] = {}  # nodes of both exports -> value index
        self.inputs: list[TensorInput] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.nodes: list[Node] = []
        self.user_seen = 0

    def placeholder(self, na: torch.fx.Node, nb: torch.fx.Node) -> None:
        from torch.export.graph_signature import InputKind

        spec = self.specs[na.name]
        va, vb = na.meta["val"], nb.meta["val"]
        shape = _shape(va, self.sym[0])
        if shape != _shape(vb, self.sym[1]):
            raise GraphError(f"input {na.name} has different sizes in the two exports")
        dtype = _dtype_name((va.dtype, vb.dtype), self.dtypes, f"input {na.name}")
        if spec.kind == InputKind.USER_INPUT:
            pos = self.user.index(spec)
            n_state = len(self.state_names)
            if pos < n_state:
                name = self.state_names[pos]
                self.inputs.append(TensorInput(name, self.kinds[name], shape, dtype))
            else:
                self.inputs.append(TensorInput(f"arg{pos - n_state}", "arg", shape, dtype))
            self.user_seen += 1
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            self._constant(spec)
        else:
            raise GraphError(f"input {na.name} is a {spec.kind.name}, which a graph does not take")
        self.index[na] = self.index[nb] = len(self.inputs) - 1

    def _constant(self, spec: Any) -> None:
        ca, cb = self.a.constants[spec.target], self.b.constants[spec.target]
        if ca.dtype != cb.dtype or ca.shape != cb.shape or not torch.equal(ca, cb):
            raise GraphError(f"constant {spec.target} depends on the input dtype")
        name = f"c{len(self.constants)}"
        self.constants[name] = ca.detach().cpu().contiguous()
        dtype = _dtype_name((ca.dtype, ca.dtype), self.dtypes, name)
        self.inputs.append(TensorInput(name, "constant", tuple(ca.shape), dtype))

    def call(self, na: torch.fx.Node, nb: torch.fx.Node) -> None:
        index, dtypes = self.index, self.dtypes
        name = ops.op_name(na.target)
        ops.resolve(name)
        args = tuple(
            _pair(x, y, index, dtypes, na.name) for x, y in zip(na.args, nb.args, strict=True)
        )
        if set(na.kwargs) != set(nb.kwargs):
            raise GraphError(f"node {na.name} has different keywords in the two exports")
        kwargs = {k: _pair(na.kwargs[k], nb.kwargs[k], index, dtypes, na.name) for k in na.kwargs}
        ops.check_node(name, args, kwargs)
        self.nodes.append(Node(name, args, kwargs))
        index[na] = index[nb] = len(self.inputs) + len(self.nodes) - 1


def _ranges(
    a: torch.export.ExportedProgram, sym: list[dict[str, str]]
) -> dict[str, tuple[int, int | None]]:
    """The range of every symbolic size, as the export constrained it."""
    ranges = {}
    for export_name, ours in sym[0].items():
        rng = next((r for s, r in a.range_constraints.items() if str(s) == export_name), None)
        lo = _bound(rng.lower) if rng is not None else 0
        hi = _bound(rng.upper) if rng is not None else None
        ranges[ours] = (max(0, lo or 0), hi)
    return ranges


def _bound(value: Any) -> int | None:
    """An int range bound, or None for an unbounded one (export's ``int_oo``)."""
    try:
        return int(value)
    except (TypeError, ValueError, AttributeError, OverflowError):
        return None


def _output(na: Any, nb: Any, index: dict[Any, int], program: Any) -> Any:

    flat = [values.Ref(index[x]) if isinstance(x, torch.fx.Node) else x for x in na.args[0]]
    spec = program.call_spec.out_spec
    tree = ti.pytree.tree_unflatten(flat, spec) if spec is not None else tuple(flat)

    def check(v: object) -> Any:
        if isinstance(v, values.Ref) or v is None or isinstance(v, (bool, int, float)):
            return v
        if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
            items = [check(x) for x in v]
            return items if isinstance(v, list) else tuple(items)
        raise GraphError(
            f"the method returns a {type(v).__name__}; a graph returns tensors, tuples and lists"
        )

    return check(tree)


def _pair(
    x: object, y: object, index: dict[object, int], dtypes: tuple[torch.dtype, ...], where: str
) -> Any:
    """One argument from the two exports: the same value, or a symbol both stand for."""
    if isinstance(x, torch.fx.Node) or isinstance(y, torch.fx.Node):
        if not (isinstance(x, torch.fx.Node) and isinstance(y, torch.fx.Node)):
            raise GraphError(f"{where}: arguments differ between the exports")
        if x not in index or y not in index:
            raise GraphError(f"{where}: reads {x.name}, which comes later or is skipped")
        if index[x] != index[y]:
            raise GraphError(f"{where}: arguments differ between the exports")
        return values.Ref(index[x])
    if isinstance(x, (list, tuple)) and not isinstance(x, str):
        if not isinstance(y, (list, tuple)) or len(x) != len(y):
            raise GraphError(f"{where}: arguments differ between the exports")
        items = [_pair(p, q, index, dtypes, where) for p, q in zip(x, y, strict=True)]
        return tuple(items) if isinstance(x, tuple) else items
    if isinstance(x, torch.device):
        if not isinstance(y, torch.device) or x.type != y.type:
            raise GraphError(f"{where}: device {x} in one export, {y} in the other")
        if x.type == "meta":
            return values.Symbol(values.DEVICE_SYMBOL)
        return x
    if isinstance(x, torch.dtype):
        if x == y:
            return x
        if (x, y) == tuple(dtypes):
            return values.Symbol(values.DTYPE_SYMBOL)
        raise GraphError(f"{where}: dtype {x} in one export, {y} in the other")
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return x
    if isinstance(x, float) and isinstance(y, float) and x != y:
        found = values.finfo_symbol((x, y), dtypes)  # type: ignore[arg-type]
        if found is None:
            raise GraphError(f"{where}: the constant {x!r} becomes {y!r} with the other dtype")
        return found
    if type(x) is not type(y) or x != y:
        raise GraphError(f"{where}: argument {x!r} in one export, {y!r} in the other")
    return x


__all__ = [
    "EXPORT_DTYPES",
    "FunctionSite",
    "call_template",
    "capture_method",
    "fill_template",
    "module_tensors",
    "split_function_call",
]
