"""The PrivateUse1 kernels of the ``spyre`` device: what runs when no device tensor exists yet
(``torch.empty(..., device="spyre")``, the allocation behind ``tensor.to("spyre")``,
``torch.arange(..., device="spyre")``). Every other op reaches ``SpyreTensor``'s
``__torch_dispatch__``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hfadapt.spyre.eager.dispatch import dispatch, op_entry
from hfadapt.spyre.eager.selection import thread_index
from hfadapt.spyre.eager.tensor import held_dtype, spyre_device, store, wrap
from hfadapt.spyre.rules.op_rules import judge
from hfadapt.spyre.rules.profile import FALLBACK
from hfadapt.spyre.rules.tracking import SpyreFallbackWarning, current, refuse, warn_from_model

aten = torch.ops.aten


def _device(device: Any) -> torch.device:
    d = torch.device(device) if device is not None else torch.device("spyre")
    return spyre_device(thread_index() if d.index is None else d.index)


def _allocate(
    func: Any,
    size: Sequence[int],
    stride: Sequence[int] | None,
    dtype: torch.dtype | None,
    device: Any,
) -> torch.Tensor:
    collector = current()
    entry = op_entry(collector.profile, collector.mode, func)
    if collector.report is not None:
        collector.report.ops_seen[entry.name] += 1
    dtype = dtype or torch.get_default_dtype()
    meta = torch.empty(size, dtype=dtype, device="meta")
    # float64 or complex refused here, at the first allocation: the card has no such storage.
    _, _, found = judge(
        collector.profile, entry.name, (), {"dtype": dtype}, collector.mode, outputs=meta
    )
    refuse(collector, found)
    if stride is None:
        held = torch.empty(size, dtype=held_dtype(dtype))
    else:
        held = torch.empty_strided(size, stride, dtype=held_dtype(dtype))
    return wrap(held, dtype, _device(device))


def empty_memory_format(
    size: Sequence[int],
    dtype: torch.dtype | None = None,
    layout: object = None,
    device: object = None,
    pin_memory: bool | None = None,
    memory_format: object = None,
) -> torch.Tensor:
    return _allocate(aten.empty.memory_format, size, None, dtype, device)


def empty_strided(
    size: Sequence[int],
    stride: Sequence[int],
    dtype: torch.dtype | None = None,
    layout: object = None,
    device: object = None,
    pin_memory: bool | None = None,
) -> torch.Tensor:
    return _allocate(aten.empty_strided.default, size, stride, dtype, device)


def copy_from(self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return dispatch(aten._copy_from.default, (self, dst, non_blocking), {})  # type: ignore[no-any-return]


def copy_from_and_resize(self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    return dispatch(aten._copy_from_and_resize.default, (self, dst), {})  # type: ignore[no-any-return]


def _host_factory(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """A creation op the profile makes a fallback (arange): made on the host, warned, counted,
    copied to the device."""
    collector = current()
    entry = op_entry(collector.profile, collector.mode, func)
    if collector.report is not None:
        collector.report.ops_seen[entry.name] += 1
    device = _device(kwargs.get("device"))
    host = func(*args, **{**kwargs, "device": torch.device("cpu")})
    outcome, _, found = judge(
        collector.profile, entry.name, args, kwargs, collector.mode, outputs=host
    )
    refuse(collector, found)
    if outcome == FALLBACK:
        message = collector.profile.message("fallback_warning", op=entry.name)
        warn_from_model(message, SpyreFallbackWarning)
        if collector.report is not None:
            collector.report.fallbacks[entry.name] += 1
    return wrap(store(host, host.dtype, fresh=True, transfer=True), host.dtype, device)


def arange(end: object, **kwargs: object) -> torch.Tensor:
    return _host_factory(aten.arange.default, (end,), kwargs)


def arange_start(start: object, end: object, **kwargs: object) -> torch.Tensor:
    return _host_factory(aten.arange.start, (start, end), kwargs)


def arange_start_step(
    start: object, end: object, step: object = 1, **kwargs: object
) -> torch.Tensor:
    return _host_factory(aten.arange.start_step, (start, end, step), kwargs)


def sdpa(*args: object, **kwargs: object) -> torch.Tensor:
    # Registered so that autograd does not decompose SDPA before the device sees it (a
    # PrivateUse1 kernel hides the CompositeImplicit one); device tensors go to dispatch.
    return dispatch(aten.scaled_dot_product_attention.default, args, kwargs)  # type: ignore[no-any-return]


def rms_norm(*args: object, **kwargs: object) -> torch.Tensor:
    # The card's rms_norm is native in the input's dtype: registered so that PyTorch does not
    # decompose it into an fp32 upcast and pow first (hfadapt.spyre.compile.native_ops).
    return dispatch(aten.rms_norm.default, args, kwargs)  # type: ignore[no-any-return]


def softmax_int(*args: object, **kwargs: object) -> torch.Tensor:
    # softmax(x, dim, dtype=...) is one native softmax on the card, not a cast then _softmax.
    return dispatch(aten.softmax.int, args, kwargs)  # type: ignore[no-any-return]


def register_kernels() -> torch.library.Library:
    """Register the PrivateUse1 kernels; keep the returned Library alive."""
    lib = torch.library.Library("aten", "IMPL")
    for name, fn in (
        ("empty.memory_format", empty_memory_format),
        ("empty_strided", empty_strided),
        ("_copy_from", copy_from),
        ("_copy_from_and_resize", copy_from_and_resize),
        ("arange", arange),
        ("arange.start", arange_start),
        ("arange.start_step", arange_start_step),
        ("scaled_dot_product_attention", sdpa),
        ("rms_norm", rms_norm),
        ("softmax.int", softmax_int),
    ):
        lib.impl(name, fn, "PrivateUse1")
    return lib
