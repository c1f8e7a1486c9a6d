"""A graph artifact: one rewritten method as data. What a drafted adapter becomes when it leaves
the sandbox, and the only form in which hfadapt ever runs it.

It holds the tensors the method reads (the module's parameters and buffers by name, the call's
tensor arguments, constant tensors), the template of the call (which arguments are tensors and
which are plain values, recorded as they were), the ATen nodes in order, the output, and the
symbolic sizes with their ranges. ``graph.json`` holds everything but the constants, which are in
``constants.safetensors``. Reading either never runs code: JSON parsed with bounds, tensors
through safetensors, every op resolved through the allowlist of :mod:`hfadapt.graphs.ops`."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hfadapt.errors import GraphError, UntrustedDataError
from hfadapt.graphs import ops, values
from hfadapt.untrusted import parse_json

FORMAT = "hfadapt-graph"
VERSION = 1
GRAPH_FILE = "graph.json"
CONSTANTS_FILE = "constants.safetensors"
MAX_NODES = 20_000
MAX_INPUTS = 4_000
MAX_SYMBOLS = 256
MAX_GRAPH_BYTES = 16 * 1024 * 1024
MAX_CONSTANT_BYTES = 256 * 1024 * 1024
KINDS = ("param", "buffer", "arg", "constant")
_PARAM_NAME = re.compile(r"^[A-Za-z0-9_.]{1,200}$")
_SYMBOL = re.compile(r"^s[0-9]{1,4}$")
_KWARG = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class TensorInput:
    """A tensor the graph reads. ``name``: a parameter or buffer path inside the module, a
    constant's name, or ``argN`` for the call's N-th tensor. ``shape``: sizes or symbol names.
    ``dtype``: a dtype name, or ``$dtype`` for the call's floating-point dtype."""

    name: str
    kind: str
    shape: tuple[int | str, ...]
    dtype: str


@dataclass(frozen=True)
class Node:
    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Slot:
    """The place of the call's N-th tensor argument in the call template."""

    index: int


@dataclass
class GraphArtifact:
    inputs: list[TensorInput]
    nodes: list[Node]
    output: Any  # a tree of values.Ref / None / lists / tuples
    symbols: dict[str, tuple[int, int | None]]
    call_args: tuple[Any, ...]  # the call template: Slot for tensors, plain values as recorded
    call_kwargs: dict[str, Any]
    constants: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def n_values(self) -> int:
        return len(self.inputs) + len(self.nodes)

    def inputs_of(self, kind: str) -> list[TensorInput]:
        return [i for i in self.inputs if i.kind == kind]

    # -- JSON ---------------------------------------------------------------------------------

    def to_json(self) -> dict[str, object]:
        def ref_of(_: object) -> None:
            return None

        return {
            "format": FORMAT,
            "version": VERSION,
            "inputs": [
                {"name": i.name, "kind": i.kind, "shape": list(i.shape), "dtype": i.dtype}
                for i in self.inputs
            ],
            "call": {
                "args": [_encode_call(v) for v in self.call_args],
                "kwargs": {k: _encode_call(v) for k, v in self.call_kwargs.items()},
            },
            "nodes": [
                {
                    "op": n.op,
                    "args": [values.encode(a, ref_of) for a in n.args],
                    "kwargs": {k: values.encode(v, ref_of) for k, v in n.kwargs.items()},
                }
                for n in self.nodes
            ],
            "output": values.encode(self.output, ref_of),
            "symbols": {k: [lo, hi] for k, (lo, hi) in self.symbols.items()},
        }

    @classmethod
    def from_json(
        cls, data: object, constants: dict[str, torch.Tensor] | None = None
    ) -> GraphArtifact:
        """Validate and decode; GraphError naming the first thing wrong."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise GraphError(f"not an {FORMAT} file")
        if data.get("version") != VERSION:
            raise GraphError(
                f"graph format version {data.get('version')!r}; this hfadapt reads {VERSION}"
            )
        symbols = _symbols(data.get("symbols"))
        inputs = _inputs(data.get("inputs"), symbols)
        n_args = sum(1 for i in inputs if i.kind == "arg")
        call = data.get("call")
        if not isinstance(call, dict) or not isinstance(call.get("args"), list):
            raise GraphError("the call template is missing")
        kwargs_raw = call.get("kwargs")
        if not isinstance(kwargs_raw, dict) or not all(
            isinstance(k, str) and _KWARG.match(k) for k in kwargs_raw
        ):
            raise GraphError("the call template's keyword names are not identifiers")
        seen: set[int] = set()
        call_args = tuple(_decode_call(v, n_args, seen) for v in call["args"])
        call_kwargs = {k: _decode_call(v, n_args, seen) for k, v in kwargs_raw.items()}
        if seen != set(range(n_args)):
            raise GraphError("the call template does not place every tensor argument exactly once")
        nodes_raw = data.get("nodes")
        if not isinstance(nodes_raw, list) or len(nodes_raw) > MAX_NODES:
            raise GraphError(f"nodes must be a list of at most {MAX_NODES}")
        nodes: list[Node] = []
        for i, raw in enumerate(nodes_raw):
            if not isinstance(raw, dict) or set(raw) != {"op", "args", "kwargs"}:
                raise GraphError(f"node {i} is not {{op, args, kwargs}}")
            ops.resolve(raw["op"])  # the allowlist, before anything else reads the node
            if not isinstance(raw["args"], list) or not isinstance(raw["kwargs"], dict):
                raise GraphError(f"node {i} ({raw['op']}): args must be a list, kwargs an object")
            bound = len(inputs) + i  # only earlier values
            args = tuple(values.decode(a, bound) for a in raw["args"])
            if not all(isinstance(k, str) and _KWARG.match(k) for k in raw["kwargs"]):
                raise GraphError(f"node {i} ({raw['op']}): a keyword is not an identifier")
            kwargs = {k: values.decode(v, bound) for k, v in raw["kwargs"].items()}
            ops.check_node(raw["op"], args, kwargs)
            nodes.append(Node(raw["op"], args, kwargs))
        output = values.decode(data.get("output"), len(inputs) + len(nodes))
        art = cls(inputs, nodes, output, symbols, call_args, call_kwargs, dict(constants or {}))
        art.check_constants()
        return art

    def check_constants(self) -> None:
        """Every constant input has its tensor, of the declared shape and dtype, and nothing else
        is carried."""
        wanted = {i.name: i for i in self.inputs_of("constant")}
        if set(wanted) != set(self.constants):
            extra = sorted(set(self.constants) ^ set(wanted))[:3]
            raise GraphError(f"constants do not match the graph's constant inputs: {extra}")
        for name, spec in wanted.items():
            t = self.constants[name]
            if spec.dtype not in values.DTYPES or t.dtype != values.DTYPES[spec.dtype]:
                raise GraphError(f"constant {name} is {t.dtype}, declared {spec.dtype}")
            if list(t.shape) != list(spec.shape):
                raise GraphError(
                    f"constant {name} has shape {list(t.shape)}, declared {list(spec.shape)}"
                )

    # -- files --------------------------------------------------------------------------------

    def write(self, folder: Path) -> None:
        import json

        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        (folder / GRAPH_FILE).write_text(
            json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8"
        )
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.constants.items()}
        save_file(tensors, str(folder / CONSTANTS_FILE))

    @classmethod
    def read(cls, folder: Path) -> GraphArtifact:
        """The artifact in ``folder`` (graph.json and constants.safetensors), validated."""
        graph = read_plain_file(folder / GRAPH_FILE, MAX_GRAPH_BYTES)
        blob = read_plain_file(folder / CONSTANTS_FILE, MAX_CONSTANT_BYTES)
        return cls.from_bytes(graph, blob)

    @classmethod
    def from_bytes(cls, graph: bytes, constants: bytes | None) -> GraphArtifact:
        from safetensors.torch import load

        try:
            data = parse_json(graph, max_bytes=MAX_GRAPH_BYTES, max_depth=values.MAX_DEPTH + 6)
        except UntrustedDataError as exc:
            raise GraphError(f"{GRAPH_FILE}: {exc}") from exc
        tensors: dict[str, torch.Tensor] = {}
        if constants:
            try:
                tensors = load(constants)
            except Exception as exc:  # untrusted bytes: any parse failure is the artifact's
                raise GraphError(f"{CONSTANTS_FILE} does not read as safetensors: {exc}") from exc
        return cls.from_json(data, tensors)


def read_plain_file(path: Path, max_bytes: int) -> bytes:
    """A regular file's bytes, never through a symlink, at most ``max_bytes``; GraphError
    otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise GraphError(f"{path.name}: cannot be read ({exc.strerror or exc})") from exc
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise GraphError(f"{path.name} is not a regular file")
        if info.st_size > max_bytes:
            raise GraphError(f"{path.name} is {info.st_size} bytes, more than {max_bytes}")
        return fh.read(max_bytes + 1)[:max_bytes]


def _symbols(raw: object) -> dict[str, tuple[int, int | None]]:
    if not isinstance(raw, dict) or len(raw) > MAX_SYMBOLS:
        raise GraphError(f"symbols must be an object of at most {MAX_SYMBOLS}")
    out: dict[str, tuple[int, int | None]] = {}
    for name, rng in raw.items():
        ok = (
            isinstance(name, str)
            and _SYMBOL.match(name)
            and isinstance(rng, list)
            and len(rng) == 2
            and isinstance(rng[0], int)
            and not isinstance(rng[0], bool)
            and rng[0] >= 0
            and (
                rng[1] is None
                or (isinstance(rng[1], int) and not isinstance(rng[1], bool) and rng[1] >= rng[0])
            )
        )
        if not ok:
            raise GraphError(f"symbol {str(name)[:20]!r}: range must be [low, high or null]")
        out[name] = (rng[0], rng[1])
    return out


def _inputs(raw: object, symbols: dict[str, tuple[int, int | None]]) -> list[TensorInput]:
    if not isinstance(raw, list) or len(raw) > MAX_INPUTS:
        raise GraphError(f"inputs must be a list of at most {MAX_INPUTS}")
    out: list[TensorInput] = []
    names: set[tuple[str, str]] = set()
    n_args = 0
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or set(item) != {"name", "kind", "shape", "dtype"}:
            raise GraphError(f"input {i} is not {{name, kind, shape, dtype}}")
        kind, name, shape, dtype = item["kind"], item["name"], item["shape"], item["dtype"]
        if kind not in KINDS:
            raise GraphError(f"input {i}: kind {str(kind)[:20]!r} is not one of {', '.join(KINDS)}")
        if kind == "arg":
            if name != f"arg{n_args}":
                raise GraphError(f"input {i}: tensor arguments are named arg0, arg1, ... in order")
            n_args += 1
        elif not isinstance(name, str) or not _PARAM_NAME.match(name):
            raise GraphError(f"input {i}: name {str(name)[:40]!r} is not a module path")
        if (kind, name) in names:
            raise GraphError(f"input {i}: {kind} {name} appears twice")
        names.add((kind, name))
        if not isinstance(shape, list) or len(shape) > 8:
            raise GraphError(f"input {name}: shape must be a list of at most 8 sizes")
        for s in shape:
            if isinstance(s, bool) or not (
                (isinstance(s, int) and 0 <= s < 2**40) or (isinstance(s, str) and s in symbols)
            ):
                raise GraphError(
                    f"input {name}: size {str(s)[:20]!r} is not a size or a known symbol"
                )
        if dtype != values.DTYPE_SYMBOL and dtype not in values.DTYPES:
            raise GraphError(f"input {name}: dtype {str(dtype)[:20]!r} is not one a graph may use")
        out.append(TensorInput(name, kind, tuple(shape), dtype))
    return out


def _encode_call(value: object) -> Any:
    if isinstance(value, Slot):
        return {"tensor": value.index}
    if isinstance(value, (list, tuple)):
        return {"list" if isinstance(value, list) else "tuple": [_encode_call(v) for v in value]}
    if isinstance(value, dict):
        return {"dict": {k: _encode_call(v) for k, v in value.items()}}
    return {"value": values.encode(value, lambda _: None)}


def _decode_call(raw: object, n_args: int, seen: set[int], depth: int = 0) -> Any:
    if depth > 4 or not isinstance(raw, dict) or len(raw) != 1:
        raise GraphError("the call template is malformed")
    tag, body = next(iter(raw.items()))
    if tag == "tensor":
        if (
            not isinstance(body, int)
            or isinstance(body, bool)
            or not 0 <= body < n_args
            or body in seen
        ):
            raise GraphError(f"call template: tensor slot {body!r} is out of range or repeated")
        seen.add(body)
        return Slot(body)
    if tag in ("list", "tuple"):
        if not isinstance(body, list) or len(body) > values.MAX_ITEMS:
            raise GraphError("call template: a sequence is malformed")
        items = [_decode_call(v, n_args, seen, depth + 1) for v in body]
        return items if tag == "list" else tuple(items)
    if tag == "dict":
        if not isinstance(body, dict) or not all(
            isinstance(k, str) and _KWARG.match(k) for k in body
        ):
            raise GraphError("call template: a mapping's keys are not identifiers")
        return {k: _decode_call(v, n_args, seen, depth + 1) for k, v in body.items()}
    if tag == "value":
        value = values.decode(body, 0)
        if not (value is None or isinstance(value, (bool, int, float, str))):
            raise GraphError("call template: a recorded value is not a plain literal")
        return value
    raise GraphError(f"call template: unknown tag {str(tag)[:20]!r}")


__all__ = [
    "CONSTANTS_FILE",
    "GRAPH_FILE",
    "GraphArtifact",
    "Node",
    "Slot",
    "TensorInput",
    "read_plain_file",
]
