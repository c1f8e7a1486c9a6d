"""Numbers an op takes as values (schema type Scalar, or a number where a Tensor goes): on the
card they are device constants, converted like host data, so DL16-rounded and a -inf landing on
0xEFFF (hf-adapters ``hf_common.py``). The compile backend rounds them once, when it builds a
graph's program; the eager device when it runs the op: both the same way."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch

from hfadapt.spyre.numerics.dl16 import DL16Format, round_dl16


@lru_cache(maxsize=1024)
def value_arguments(target: object) -> tuple[frozenset[int], frozenset[str]]:
    """Positions and names of an op's Scalar- and Tensor-typed arguments."""
    schema = getattr(target, "_schema", None)
    if schema is None:
        return frozenset(), frozenset()
    values = [
        (i, a.name)
        for i, a in enumerate(schema.arguments)
        if str(a.type).removeprefix("Optional[").removesuffix("]") in ("number", "Tensor")
    ]
    return frozenset(i for i, _ in values), frozenset(n for _, n in values)


@lru_cache(maxsize=4096)
def _device_number(value: float, fmt: DL16Format) -> float:
    return float(round_dl16(torch.tensor([value]), fmt, transfer=True)[0])


def device_number(value: object, fmt: DL16Format) -> Any:
    """A number as the device holds it (ints, floats; bools and other values unchanged)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _device_number(float(value), fmt)
    return value


_NUMBERS = (int, float)  # bools pass too (device_number leaves them unchanged)


def device_numbers(
    target: object, args: Sequence[object], kwargs: dict[str, object], fmt: DL16Format
) -> tuple[tuple[object, ...], dict[str, object]]:
    """``args`` and ``kwargs`` with every number the op takes as a value converted to DL16;
    sizes, dims, eps and probabilities (other schema types) are left alone."""
    if not any(isinstance(a, _NUMBERS) for a in args) and not any(
        isinstance(v, _NUMBERS) for v in kwargs.values()
    ):
        return tuple(args), kwargs  # no number given: nothing to convert
    positions, names = value_arguments(target)
    if not positions and not names:
        return tuple(args), kwargs
    out = tuple(device_number(a, fmt) if i in positions else a for i, a in enumerate(args))
    return out, {k: device_number(v, fmt) if k in names else v for k, v in kwargs.items()}
