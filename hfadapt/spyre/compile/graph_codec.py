"""An ATen graph as data: what the compile cache (hfadapt.spyre.compile.cache) stores.

``encode(gm)`` turns the graph aot_autograd hands the backend into a JSON-able dict (nodes in
order, each op named ``namespace::name.overload``, arguments as typed values) and its tensor
constants (for safetensors); ``decode`` builds the graph again, with the node metadata the
backend reads: ``val`` (fake tensors of the recorded shape, stride and dtype), ``stack_trace``,
``nn_module_stack`` and ``source_fn_stack`` (the function's name). Decoding trusts nothing: an
op outside ``torch.ops``, a module class that is not already imported, or any malformed value
raises ``GraphCodecError`` (the cache then compiles afresh). A graph holding anything else
(a Python callable, a symbolic size, an opaque object) is not encoded (``GraphCodecError``)."""

from __future__ import annotations

import math
import operator
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import fx

from hfadapt import torch_internals as ti

__all__ = ["GraphCodecError", "decode", "encode"]


class GraphCodecError(ValueError):
    """A graph that cannot be stored, or stored data that does not make a graph."""


_NAMESPACES = frozenset({"aten", "prims", "hfadapt"})
_DTYPES = {
    str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)
}
_LAYOUTS = {str(x).removeprefix("torch."): x for x in (torch.strided, torch.sparse_coo)}
_FORMATS = {
    str(x).removeprefix("torch."): x
    for x in (torch.contiguous_format, torch.preserve_format, torch.channels_last)
}


# -- values --------------------------------------------------------------------------------------


def _value(v: object) -> Any:
    if v is None or isinstance(v, bool | str):
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, fx.Node):
        return {"node": v.name}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).removeprefix("torch.")}
    if isinstance(v, list | tuple):
        return {"list" if isinstance(v, list) else "tuple": [_value(x) for x in v]}
    raise GraphCodecError(f"a graph argument of type {type(v).__name__} is not stored")


def _unvalue(v: object, nodes: Mapping[str, fx.Node]) -> Any:
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if not isinstance(v, dict) or len(v) != 1:
        raise GraphCodecError(f"malformed value {str(v)[:80]}")
    ((kind, x),) = v.items()
    try:
        if kind == "node":
            return nodes[x]
        if kind == "float":
            return float(x) if x in ("inf", "-inf", "nan") else _bad(x)
        if kind == "dtype":
            return _DTYPES[x]
        if kind == "device":
            return torch.device(str(x))
        if kind == "layout":
            return _LAYOUTS[x]
        if kind == "memory_format":
            return _FORMATS[x]
        if kind in ("list", "tuple") and isinstance(x, list):
            items = [_unvalue(i, nodes) for i in x]
            return items if kind == "list" else tuple(items)
    except (KeyError, TypeError, RuntimeError) as exc:
        raise GraphCodecError(f"malformed {kind} value {str(x)[:80]}") from exc
    raise GraphCodecError(f"unknown value kind {kind!r}")


def _bad(x: object) -> Any:
    raise GraphCodecError(f"malformed value {str(x)[:80]}")


def _target_name(target: object) -> str:
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, ti.OpOverload):
        name: str = target.name()  # "aten::mm" or "aten::add.Tensor"
        if "." not in name.split("::", 1)[1]:
            name += ".default"
        if name.split("::", 1)[0] in _NAMESPACES:
            return name
    raise GraphCodecError(f"a graph calling {target!r} is not stored")


def _target(name: object) -> Any:
    if name == "getitem":
        return operator.getitem
    if not isinstance(name, str) or "::" not in name:
        raise GraphCodecError(f"malformed op name {str(name)[:80]}")
    namespace, rest = name.split("::", 1)
    op, _, overload = rest.partition(".")
    if namespace not in _NAMESPACES or not op.isidentifier() or not overload.isidentifier():
        raise GraphCodecError(f"op {name[:80]} is not one the cache may call")
    try:
        packet = getattr(getattr(torch.ops, namespace), op)
        return getattr(packet, overload)
    except (AttributeError, RuntimeError) as exc:
        raise GraphCodecError(f"no op {name[:80]} in this torch") from exc


# -- node metadata -------------------------------------------------------------------------------


def _tensor_meta(t: object) -> Any:
    if isinstance(t, torch.Tensor):
        if any(not isinstance(s, int) for s in (*t.shape, *t.stride())):
            raise GraphCodecError("a graph with symbolic sizes is not stored")
        return {
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "dtype": str(t.dtype).removeprefix("torch."),
            "device": str(t.device),
            "offset": int(t.storage_offset()),
        }
    if isinstance(t, list | tuple):
        return {"items": [_tensor_meta(x) for x in t]}
    if t is None or isinstance(t, bool | int | float):
        return {"scalar": _value(t)}
    raise GraphCodecError(f"a node value of type {type(t).__name__} is not stored")


def _untensor_meta(m: torch.nn.Module, mode: Any) -> Any:
    if not isinstance(m, dict):
        raise GraphCodecError("malformed node value")
    if "items" in m:
        return [_untensor_meta(x, mode) for x in m["items"]]
    if "scalar" in m:
        return _unvalue(m["scalar"], {})
    try:
        shape = [int(s) for s in m["shape"]]
        stride = [int(s) for s in m["stride"]]
        dtype, device, offset = _DTYPES[m["dtype"]], torch.device(m["device"]), int(m["offset"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise GraphCodecError("malformed tensor metadata") from exc
    if len(shape) != len(stride) or min([*shape, *stride, offset, 0]) < 0:
        raise GraphCodecError("malformed tensor metadata")
    with mode:
        base = torch.empty_strided(shape, stride, dtype=dtype, device=device)
        return base.as_strided(shape, stride, offset) if offset else base


def _class_name(cls: object) -> list[str]:
    if isinstance(cls, type):
        return [cls.__module__, cls.__qualname__]
    return ["", str(cls)]


def _class(module: str, qualname: str) -> type | str:
    """The class, from a module already imported (the cache never imports anything)."""
    if not module:
        return qualname
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, type):
        raise GraphCodecError(f"module class {module}.{qualname} is not loaded")
    return obj


class _Fn:
    """What the backend reads of a ``source_fn_stack`` function: its name."""

    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __repr__(self) -> str:
        return self.__name__


def _meta(node: fx.Node) -> dict[str, object]:
    meta: dict[str, Any] = {}
    if "val" in node.meta:
        meta["val"] = _tensor_meta(node.meta["val"])
    if isinstance(node.meta.get("stack_trace"), str):
        meta["stack_trace"] = node.meta["stack_trace"]
    stack = node.meta.get("nn_module_stack")
    if stack:
        meta["nn_module_stack"] = [
            [str(key), str(value[0]), *_class_name(value[1])] for key, value in stack.items()
        ]
    fns = node.meta.get("source_fn_stack")
    if fns:
        meta["source_fn_stack"] = [
            [str(name), getattr(fn, "__name__", str(fn))] for name, fn in fns
        ]
    return meta


def _unmeta(m: Mapping[str, Any], mode: Any) -> dict[str, object]:
    meta: dict[str, Any] = {}
    if "val" in m:
        meta["val"] = _untensor_meta(m["val"], mode)
    if "stack_trace" in m:
        meta["stack_trace"] = str(m["stack_trace"])
    try:
        if "nn_module_stack" in m:
            meta["nn_module_stack"] = {
                str(k): (str(path), _class(str(mod), str(qual)))
                for k, path, mod, qual in m["nn_module_stack"]
            }
        if "source_fn_stack" in m:
            meta["source_fn_stack"] = [(str(n), _Fn(str(f))) for n, f in m["source_fn_stack"]]
    except (TypeError, ValueError) as exc:
        raise GraphCodecError("malformed module stack") from exc
    return meta


# -- graphs --------------------------------------------------------------------------------------


def encode(gm: fx.GraphModule) -> tuple[dict[str, object], dict[str, torch.Tensor]]:
    """(the graph as JSON-able data, its tensor constants by name)."""
    nodes: list[dict[str, Any]] = []
    constants: dict[str, torch.Tensor] = {}
    for node in gm.graph.nodes:
        entry: dict[str, Any] = {"op": node.op, "name": node.name, "meta": _meta(node)}
        if node.op == "get_attr":
            value = getattr(gm, str(node.target))
            if not isinstance(value, torch.Tensor):
                raise GraphCodecError(f"a graph attribute of type {type(value).__name__}")
            constants[node.name] = value.detach().contiguous().clone()
        elif node.op == "call_function":
            entry["target"] = _target_name(node.target)
        elif node.op not in ("placeholder", "output"):
            raise GraphCodecError(f"a {node.op} node is not stored")
        entry["args"] = _value(tuple(node.args))
        entry["kwargs"] = {str(k): _value(v) for k, v in node.kwargs.items()}
        nodes.append(entry)
    return {"nodes": nodes}, constants


def decode(data: Mapping[str, object], constants: Mapping[str, torch.Tensor]) -> fx.GraphModule:
    """The graph ``encode`` described, checked (``GraphCodecError`` on anything malformed)."""

    mode = ti.fake_tensor_mode()
    graph = fx.Graph()
    root = torch.nn.Module()
    made: dict[str, fx.Node] = {}
    items = data.get("nodes") if isinstance(data, Mapping) else None
    if not isinstance(items, list) or not items:
        raise GraphCodecError("no nodes")
    for item in items:
        if not isinstance(item, dict):
            raise GraphCodecError("malformed node")
        op, name = item.get("op"), item.get("name")
        if not isinstance(name, str) or not name.isidentifier() or name in made:
            raise GraphCodecError(f"malformed node name {str(name)[:80]}")
        args = _unvalue(item.get("args"), made)
        kwargs = {str(k): _unvalue(v, made) for k, v in (item.get("kwargs") or {}).items()}
        if not isinstance(args, tuple):
            raise GraphCodecError("malformed node arguments")
        if op == "placeholder":
            node = graph.placeholder(name)
        elif op == "get_attr":
            value = constants.get(name)
            if not isinstance(value, torch.Tensor):
                raise GraphCodecError(f"constant {name} missing")
            root.register_buffer(name, value)
            node = graph.get_attr(name)
        elif op == "call_function":
            node = graph.create_node(op, _target(item.get("target")), args, kwargs, name=name)
        elif op == "output":
            if len(args) != 1:
                raise GraphCodecError("malformed output")
            node = graph.output(args[0])
        else:
            raise GraphCodecError(f"unknown node kind {str(op)[:40]}")
        if node.name != name:
            raise GraphCodecError(f"node name {name} not kept")
        node.meta.update(_unmeta(item.get("meta") or {}, mode))
        made[name] = node
    try:
        graph.lint()
    except Exception as exc:  # fx raises RuntimeError and others for a malformed graph
        raise GraphCodecError(f"the stored graph does not lint: {exc}") from exc
    return fx.GraphModule(root, graph, class_name="CachedAtenGraph")


def input_meta(inputs: Sequence[object]) -> list[object]:
    """The inputs' metadata as stored (shape, stride, dtype, device, offset, or the scalar)."""
    return [
        _tensor_meta(x) if isinstance(x, torch.Tensor) else {"scalar": _value(x)} for x in inputs
    ]
