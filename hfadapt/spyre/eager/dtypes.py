"""The logical dtype of a device op's results: what torch gives for the logical input dtypes
(fp16 in, fp16 out; fp16 and fp32 in, fp32 out), although the op ran on float32 held data.
Found with a meta run, once per op signature."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hfadapt import torch_internals as ti

_cache: dict[Any, tuple[torch.dtype, ...]] = {}
_DL16 = (torch.float16, torch.bfloat16)


def _sig(x: object) -> Any:
    # What decides type promotion: dtypes, 0-dim-ness, Python scalar types, dtype arguments.
    if isinstance(x, torch.Tensor):
        return (x.dtype, x.dim() == 0)
    if isinstance(x, (list, tuple)):
        return tuple(_sig(v) for v in x)
    if x is None or isinstance(x, (bool, str, torch.dtype)):
        return x
    return type(x)


def logical_dtypes(
    func: ti.OpOverload, args: Sequence[object], kwargs: dict[str, object], held_result: object
) -> tuple[torch.dtype, ...]:
    """Dtypes of the op's tensor outputs, in pytree order. `args` carry the device tensors
    (logical dtypes); `held_result` is what the op returned on held data."""
    key = (func, tuple(_sig(a) for a in args), tuple((k, _sig(v)) for k, v in kwargs.items()))
    dtypes = _cache.get(key)
    if dtypes is None:
        dtypes = _cache[key] = _meta_dtypes(func, args, kwargs, held_result)
    return dtypes


def _to_meta(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, torch.device):
        return torch.device("meta")
    return x


def _meta_dtypes(
    func: ti.OpOverload, args: Sequence[object], kwargs: dict[str, object], held_result: object
) -> tuple[torch.dtype, ...]:
    margs, mkwargs = ti.pytree.tree_map(_to_meta, (list(args), kwargs))
    try:
        result = func(*margs, **mkwargs)
    except Exception:  # no meta kernel for this op
        return _promoted(args, kwargs, held_result)
    return tuple(t.dtype for t in ti.pytree.tree_leaves(result) if isinstance(t, torch.Tensor))


def _promoted(
    args: Sequence[object], kwargs: dict[str, object], held_result: object
) -> tuple[torch.dtype, ...]:
    """Map the held result's dtypes back by hand: float32 computed from DL16-held inputs alone
    is the DL16 dtype, int32 from int64-held inputs is int64."""
    leaves = ti.pytree.tree_leaves((list(args), kwargs))
    logical = [t.dtype for t in leaves if isinstance(t, torch.Tensor)]
    dl16 = next((d for d in logical if d in _DL16), None)
    out = []
    for t in ti.pytree.tree_leaves(held_result):
        if not isinstance(t, torch.Tensor):
            continue
        if t.dtype == torch.float32 and dl16 is not None and torch.float32 not in logical:
            out.append(dl16)
        elif t.dtype == torch.int32 and torch.int64 in logical:
            out.append(torch.int64)
        else:
            out.append(t.dtype)
    return tuple(out)
