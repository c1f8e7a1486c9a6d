"""The ops every backend implements itself: transfers between host and device (``.to``,
``copy_``), on-device casts, and reading a scalar. On-device casts are judged by the profile
(rule dtype.cast); a transfer converts on the host side and rounds or downcasts on arrival."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hfadapt.spyre.eager.defects import eager_defects, fired
from hfadapt.spyre.eager.tensor import (
    SpyreTensor,
    copy_into,
    held_dtype,
    is_dl16,
    store,
    to_host,
    wrap,
)
from hfadapt.spyre.numerics.dl16 import round_dl16_
from hfadapt.spyre.rules.op_rules import judge
from hfadapt.spyre.rules.profile import FALLBACK
from hfadapt.spyre.rules.tracking import Collector, SpyreFallbackWarning, refuse, warn_from_model

aten = torch.ops.aten


def _judged(
    collector: Collector,
    name: str,
    args: Sequence[object],
    kwargs: dict[str, object],
    outputs: object = None,
) -> None:
    _, _, found = judge(collector.profile, name, args, kwargs, collector.mode, outputs=outputs)
    refuse(collector, found)


def to_copy(
    collector: Collector, name: str, func: Any, args: Sequence[Any], kwargs: dict[str, Any]
) -> SpyreTensor | torch.Tensor:
    src = args[0]
    dtype = kwargs.get("dtype") or src.dtype
    device = kwargs.get("device")
    memory_format = kwargs.get("memory_format") or torch.preserve_format
    if device is not None and torch.device(device).type != "spyre":
        # to the host: the card's data in its logical dtype, converted there
        return to_host(src).to(device=device, dtype=dtype, memory_format=memory_format)
    target = src.device if device is None else torch.device(device)
    place = target if target.index is not None else src.device
    meta = torch.empty(src.shape, dtype=dtype, device="meta")
    outcome, _, found = judge(collector.profile, name, args, kwargs, collector.mode, outputs=meta)
    refuse(collector, found)
    if outcome == FALLBACK:  # a cast the device cannot do runs on the host (torch-spyre#1691)
        warn_from_model(
            collector.profile.message("fallback_warning", op=name), SpyreFallbackWarning
        )
        if collector.report is not None:
            collector.report.fallbacks[name] += 1
        host = to_host(src).to(dtype=dtype, memory_format=memory_format)
        return wrap(store(host, dtype, fresh=True, transfer=True), dtype, place)
    held = src._held.to(held_dtype(dtype), memory_format=memory_format, copy=True)
    if is_dl16(dtype) and not is_dl16(src.dtype):
        round_dl16_(held)
        defects = eager_defects(collector.profile, name, collector.mode)
        card = fired(collector, defects, name, args, kwargs, None)
        if card is not None:  # an eager fp32 -> fp16 cast returns the staggered order
            held = card([held], {})
    return wrap(held, dtype, place)


def copy(
    collector: Collector, name: str, func: Any, args: Sequence[Any], kwargs: dict[str, Any]
) -> Any:
    if func is aten.copy_.default:
        dst, src = args[0], args[1]
    else:  # _copy_from(self, dst) and _copy_from_and_resize(self, dst)
        src, dst = args[0], args[1]
    if isinstance(dst, SpyreTensor) and isinstance(src, SpyreTensor):
        # A copy between device tensors may be an on-device cast; host <-> device transfers
        # were judged when the device tensor was allocated.
        _judged(collector, name, (dst, src), {})
    if isinstance(dst, SpyreTensor):
        if isinstance(src, SpyreTensor):
            copy_into(dst, src._held, src.dtype, transfer=False)
        else:
            copy_into(dst, src, src.dtype, transfer=True)
    else:
        dst.copy_(to_host(src))
    return dst


def scalar(
    collector: Collector, name: str, func: Any, args: Sequence[Any], kwargs: dict[str, Any]
) -> int | float:
    _judged(collector, name, args, kwargs)
    return to_host(args[0]).item()


TRANSFERS: dict[Any, Callable[..., Any]] = {
    aten._to_copy.default: to_copy,
    aten.copy_.default: copy,
    aten._copy_from.default: copy,
    aten._copy_from_and_resize.default: copy,
    aten._local_scalar_dense.default: scalar,
}
