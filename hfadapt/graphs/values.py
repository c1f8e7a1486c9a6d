"""The literal values of a graph artifact, as tagged JSON, and the few symbols that stand for
what a call decides: the dtype of its floating-point tensors (``$dtype``), the device they are
on (``$device``), and limits of that dtype (``finfo``: ``torch.finfo($dtype).min / 2``).

Encoded forms (anything else does not decode):

    null, true, false, 12                  None, bools, ints
    {"f": 0.5} / {"f": "-inf"}             floats (inf and nan as strings)
    {"s": "tanh"}                          short strings of letters, digits and ``_,.->`` (gelu's
                                           approximation, an einsum equation)
    {"list": [...]} / {"tuple": [...]}     sequences
    {"ref": 7}                             an earlier value of the graph (inputs, then nodes)
    {"dtype": "float32"|"$dtype"}          a dtype
    {"device": "cpu"|"$device"}            the host, or the call's device
    {"layout": "strided"}, {"memory_format": "contiguous_format"}
    {"finfo": "min", "scale": 0.5}         scale * torch.finfo($dtype).min
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from hfadapt.errors import GraphError

MAX_DEPTH = 6
MAX_ITEMS = 64
DTYPE_SYMBOL = "$dtype"
DEVICE_SYMBOL = "$device"
_STRING = re.compile(r"^[A-Za-z0-9_,.>\- ]{0,64}$")
DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
    )
}
LAYOUTS = {"strided": torch.strided}
MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "preserve_format": torch.preserve_format,
    "channels_last": torch.channels_last,
}
FINFO_ATTRS = ("min", "max", "eps", "tiny")
FINFO_SCALES = (1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.25, -0.25)


@dataclass(frozen=True)
class Ref:
    """A reference to an earlier value of the graph (index into inputs, then nodes)."""

    index: int


@dataclass(frozen=True)
class Symbol:
    """A value the call decides: ``$dtype``, ``$device``, or ``scale * finfo($dtype).attr``."""

    name: str
    scale: float = 1.0

    def resolve(
        self, dtype: torch.dtype, device: torch.device
    ) -> float | torch.device | torch.dtype:
        if self.name == DTYPE_SYMBOL:
            return dtype
        if self.name == DEVICE_SYMBOL:
            return device
        return self.scale * float(getattr(torch.finfo(dtype), self.name))


def _name_of(table: dict[str, Any], value: Any) -> str | None:
    return next((k for k, v in table.items() if v == value), None)


def encode(value: Any, ref_of: Any) -> Any:
    """The tagged JSON of one literal argument; ``ref_of(node)`` gives a Ref's index.
    GraphError for a value of a kind the format does not hold."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return {"f": value if math.isfinite(value) else str(value)}
    if isinstance(value, Symbol):
        if value.name in (DTYPE_SYMBOL,):
            return {"dtype": value.name}
        if value.name == DEVICE_SYMBOL:
            return {"device": value.name}
        return {"finfo": value.name, "scale": value.scale}
    if isinstance(value, Ref):
        return {"ref": value.index}
    if isinstance(value, str):
        if not _STRING.match(value):
            raise GraphError(f"string argument {value[:40]!r} is not a plain word")
        return {"s": value}
    if isinstance(value, (list, tuple)):
        tag = "list" if isinstance(value, list) else "tuple"
        return {tag: [encode(v, ref_of) for v in value]}
    if isinstance(value, torch.dtype):
        name = _name_of(DTYPES, value)
        if name is None:
            raise GraphError(f"dtype {value} is not one a graph may use")
        return {"dtype": name}
    if isinstance(value, torch.device):
        if value.type != "cpu":
            raise GraphError(f"device {value} is neither the host nor the call's device")
        return {"device": "cpu"}
    if isinstance(value, torch.layout):
        name = _name_of(LAYOUTS, value)
        if name is None:
            raise GraphError(f"layout {value} is not one a graph may use")
        return {"layout": name}
    if isinstance(value, torch.memory_format):
        name = _name_of(MEMORY_FORMATS, value)
        if name is None:
            raise GraphError(f"memory format {value} is not one a graph may use")
        return {"memory_format": name}
    ref = ref_of(value)
    if ref is not None:
        return {"ref": ref}
    raise GraphError(f"an argument of type {type(value).__name__} cannot be stored in a graph")


def decode(data: Any, n_values: int, depth: int = 0) -> Any:
    """A literal from its tagged JSON (refs must point below ``n_values``: earlier values only).
    GraphError for anything malformed or unknown."""
    if depth > MAX_DEPTH:
        raise GraphError("an argument nests too deep")
    if data is None or isinstance(data, bool):
        return data
    if isinstance(data, int):
        if abs(data) > 2**63:
            raise GraphError("an integer argument is out of range")
        return data
    if not isinstance(data, dict) or len(data) not in (1, 2):
        raise GraphError(f"argument {str(data)[:60]!r} is not a tagged value")
    if len(data) == 2 and set(data) != {"finfo", "scale"}:
        raise GraphError(f"argument {str(data)[:60]!r} is not a tagged value")
    tag, raw = next(iter(data.items()))
    if tag == "f":
        return _float(raw)
    if tag == "s":
        if not isinstance(raw, str) or not _STRING.match(raw):
            raise GraphError("a string argument is not a plain word")
        return raw
    if tag in ("list", "tuple"):
        if not isinstance(raw, list) or len(raw) > MAX_ITEMS:
            raise GraphError(f"a {tag} argument is not a list of at most {MAX_ITEMS} items")
        items = [decode(v, n_values, depth + 1) for v in raw]
        return items if tag == "list" else tuple(items)
    if tag == "ref":
        if not isinstance(raw, int) or isinstance(raw, bool) or not 0 <= raw < n_values:
            raise GraphError(f"reference {raw!r} does not point at an earlier value")
        return Ref(raw)
    if tag == "dtype":
        if raw == DTYPE_SYMBOL:
            return Symbol(DTYPE_SYMBOL)
        return _lookup(DTYPES, raw, "dtype")
    if tag == "device":
        if raw == DEVICE_SYMBOL:
            return Symbol(DEVICE_SYMBOL)
        if raw != "cpu":
            raise GraphError(f"device {str(raw)[:20]!r} is neither 'cpu' nor {DEVICE_SYMBOL}")
        return torch.device("cpu")
    if tag == "layout":
        return _lookup(LAYOUTS, raw, "layout")
    if tag == "memory_format":
        return _lookup(MEMORY_FORMATS, raw, "memory format")
    if tag == "finfo":
        scale = _float(data.get("scale"))
        if raw not in FINFO_ATTRS or scale not in FINFO_SCALES:
            raise GraphError(f"finfo {str(raw)[:20]!r} x {scale} is not a known dtype limit")
        return Symbol(raw, scale)
    raise GraphError(f"unknown argument tag {str(tag)[:20]!r}")


def _float(raw: object) -> float:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if raw in ("inf", "-inf", "nan"):
        return float(raw)
    raise GraphError(f"float argument {str(raw)[:30]!r} is not a number")


def _lookup(table: dict[str, Any], raw: Any, what: str) -> Any:
    if not isinstance(raw, str) or raw not in table:
        raise GraphError(f"{what} {str(raw)[:30]!r} is not one a graph may use")
    return table[raw]


def substitute(
    value: object, values: list[object], dtype: torch.dtype, device: torch.device
) -> Any:
    """A decoded argument with refs replaced by their values and symbols resolved."""
    if isinstance(value, Ref):
        return values[value.index]
    if isinstance(value, Symbol):
        return value.resolve(dtype, device)
    if isinstance(value, list):
        return [substitute(v, values, dtype, device) for v in value]
    if isinstance(value, tuple):
        return tuple(substitute(v, values, dtype, device) for v in value)
    return value


def refs_in(value: object) -> list[int]:
    """Every Ref index inside a decoded argument."""
    if isinstance(value, Ref):
        return [value.index]
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in refs_in(v)]
    return []


def finfo_symbol(
    pair: tuple[float, float], dtypes: tuple[torch.dtype, torch.dtype]
) -> Symbol | None:
    """The finfo symbol two exports' float literals stand for (the same scale of the same
    limit of each export's dtype), or None."""
    for attr in FINFO_ATTRS:
        for scale in FINFO_SCALES:
            want = [scale * float(getattr(torch.finfo(d), attr)) for d in dtypes]
            if all(math.isclose(w, p, rel_tol=1e-12) for w, p in zip(want, pair, strict=True)):
                return Symbol(attr, scale)
    return None


__all__ = [
    "DEVICE_SYMBOL",
    "DTYPES",
    "DTYPE_SYMBOL",
    "Ref",
    "Symbol",
    "decode",
    "encode",
    "finfo_symbol",
    "refs_in",
    "substitute",
]
