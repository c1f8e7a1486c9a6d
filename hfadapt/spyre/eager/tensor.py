"""The tensor of the eager ``spyre`` device: a wrapper subclass on device "spyre" that holds a
CPU tensor, and the conversions between what a tensor says it is (its logical dtype) and what
the simulated card stores (DL16 values in float32, int32 for int64).

Why float32 holds DL16: DL16's range exceeds fp16's, so fp16 storage would overflow where the
card does not, and computing in fp16 on a CPU is 3.4x slower than fp32."""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from hfadapt import torch_internals as ti
from hfadapt.errors import DeviceError
from hfadapt.spyre.numerics.dl16 import round_dl16_
from hfadapt.spyre.rules.tracking import SpyreDowncastWarning, current, warn_from_model

_DL16 = frozenset({torch.float16, torch.bfloat16})
# logical dtype -> dtype of the held CPU tensor; everything else is held as itself.
_HELD = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.int64: torch.int32}

_devices: dict[int, torch.device] = {}

# What every ATen call on a device tensor goes to: hfadapt.spyre.eager.dispatch sets it when it
# is imported (by the device's registration), so this module does not import its handler.
Handler = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]
_handler: Handler | None = None


def set_handler(handler: Handler) -> None:
    """Route every ATen call on a device tensor to ``handler(func, args, kwargs)``."""
    global _handler
    _handler = handler


def spyre_device(index: int) -> torch.device:
    device = _devices.get(index)
    if device is None:
        device = _devices[index] = torch.device("spyre", index)
    return device


def held_dtype(logical: torch.dtype) -> torch.dtype:
    return _HELD.get(logical, logical)


def is_dl16(dtype: torch.dtype) -> bool:
    return dtype in _DL16


class SpyreTensor(torch.Tensor):
    """A tensor on the simulated Spyre card. ``_held`` is the CPU tensor with the card's data:
    same sizes, strides and offset as the wrapper, so a view of the wrapper is a view of it.

    A result the device has not made yet (a node of a row program, hfadapt.spyre.eager.fusion)
    holds no data: reading ``_held`` runs its program first."""

    _data: torch.Tensor | None
    _node: Any = None  # the row program node that makes this tensor, until it has run

    @staticmethod
    def __new__(cls, held: torch.Tensor, dtype: torch.dtype, device: torch.device) -> SpyreTensor:
        r = ti.make_wrapper_subclass(
            cls,
            held.size(),
            strides=held.stride(),
            storage_offset=held.storage_offset(),
            dtype=dtype,
            device=device,
        )
        r._data = held
        return r

    @property
    def _held(self) -> torch.Tensor:
        data = self._data
        if data is None:
            return _made(self)
        return data

    # Only __torch_dispatch__ (ATen level) sees the device; torch functions run as usual.
    __torch_function__ = ti.disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls,
        func: ti.OpOverload,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if _handler is None:
            raise DeviceError(
                "the simulated spyre device is not registered: call hfadapt.spyre.register()"
            )
        return _handler(func, args, kwargs or {})

    def tolist(self) -> Any:
        # torch refuses tolist() on subclasses; a device tensor lists its host copy, as CUDA does.
        return to_host(self).tolist()

    def __repr__(self, *, tensor_contents: object = None) -> str:  # type: ignore[override]
        # Printing through ATen would dispatch (and report) a dozen ops; print the host copy.
        text = repr(to_host(self))
        return f"{text[:-1]}, device='{self.device}')" if text.endswith(")") else text


def _not_traced_by_dynamo() -> None:
    """The device's dispatch is the card's runtime, not model code: Dynamo must never trace
    it (a compiled function called on device tensors falls back to running op by op; tracing
    the simulator's own rounding on fake tensors failed with "Tensor.item() cannot be called
    on meta tensors"). Skips the dispatch frame and every frame it calls (a private Dynamo
    API; where it is missing, the dispatch is disabled for Dynamo the public way). Called
    once torch._dynamo is imported (``_when_dynamo_loads``), not before: importing Dynamo
    costs ``import torch`` more than a second, and most processes never compile."""
    try:
        ti.set_skip_frame(SpyreTensor.__dict__["__torch_dispatch__"].__func__.__code__)
    except Exception:
        original = SpyreTensor.__dict__["__torch_dispatch__"].__func__
        SpyreTensor.__torch_dispatch__ = classmethod(torch.compiler.disable(original))  # type: ignore[assignment,method-assign]


class _WhenImported(importlib.abc.MetaPathFinder):
    """Runs ``then`` right after the module ``name`` executes, whoever imports it; stays in
    ``sys.meta_path`` until then (a spec looked up and never executed changes nothing)."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname: str, path: object, target: object = None) -> Any:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        run = getattr(loader, "exec_module", None)
        if run is None:
            return spec

        def exec_module(module: ModuleType) -> None:
            run(module)
            if module.__name__ == self.name:  # a loader shared by other modules stays inert
                with contextlib.suppress(ValueError):
                    sys.meta_path.remove(self)
                self.then()

        loader.exec_module = exec_module  # this spec's own loader
        return spec


def when_imported(name: str, then: Callable[[], None]) -> None:
    """Run ``then()`` now if the module ``name`` is imported, else right after it executes
    (once: a second request for the same module and function adds nothing)."""
    if name in sys.modules:
        then()
    elif not any(
        isinstance(f, _WhenImported) and f.name == name and f.then is then for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _WhenImported(name, then))


def _when_dynamo_loads() -> None:
    when_imported(ti.DYNAMO_MODULE, _not_traced_by_dynamo)


_when_dynamo_loads()


def wrap(held: torch.Tensor, dtype: torch.dtype, device: torch.device) -> SpyreTensor:
    return SpyreTensor(held, dtype, device)


def pending(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, node: object
) -> SpyreTensor:
    """A contiguous device tensor that ``node`` of a row program will make: its data comes
    when something reads it (``_held``)."""
    r = ti.make_wrapper_subclass(SpyreTensor, shape, dtype=dtype, device=device)
    r._data = None
    r._node = node
    return r


# What makes a pending tensor's data: hfadapt.spyre.eager.fusion sets it when it is imported
# (this module does not import it), as the dispatch sets its handler.
_maker: Callable[[SpyreTensor], None] | None = None


def set_maker(maker: Callable[[SpyreTensor], None]) -> None:
    """Run ``maker(t)`` when a pending tensor ``t`` is read: it must set ``t._data``."""
    global _maker
    _maker = maker


def _made(t: SpyreTensor) -> torch.Tensor:
    if _maker is not None and t._node is not None:
        _maker(t)
    data = t._data
    if data is None:
        raise DeviceError("a device tensor whose data was never made (its row program is gone)")
    return data


def to_host(t: SpyreTensor) -> torch.Tensor:
    """The tensor a transfer to the host gives: the logical dtype, a fresh copy. DL16 values
    beyond fp16's range become inf, as the card's conversion to fp16 does."""
    return t._held.to(t.dtype, copy=True)


def _downcast_warning() -> None:
    collector = current()
    warn_from_model(collector.profile.message("int64_warning"), SpyreDowncastWarning)
    if collector.report is not None:
        collector.report.downcasts += 1


def store(held: torch.Tensor, logical: torch.dtype, *, fresh: bool, transfer: bool) -> torch.Tensor:
    """Make a CPU result into what the card holds for `logical`: float32 rounded to DL16 for
    fp16/bf16 (in place when `fresh`), int32 for int64. `transfer` marks data arriving from the
    host: an int64 downcast there warns and is counted, as torch-spyre does, and a host +-inf
    lands on +-0xEFFF's magnitude; otherwise (device arithmetic) overflow is +-inf."""
    target = held_dtype(logical)
    if held.dtype != target:
        if transfer and logical == torch.int64:
            _downcast_warning()
        held = held.to(target)
        fresh = True
    if logical in _DL16:
        if not fresh:
            held = held.clone()
        round_dl16_(held, transfer=transfer)
    return held


def copy_into(
    dst: SpyreTensor, src: torch.Tensor, src_logical: torch.dtype, transfer: bool
) -> None:
    """Write `src` (a CPU tensor of dtype `src_logical`, or a held tensor) into the card tensor
    `dst`, converting and rounding as the card stores dst's dtype. Writes through views."""
    held = dst._held
    if transfer and dst.dtype == torch.int64 and src_logical == torch.int64:
        _downcast_warning()
    held.copy_(src)
    # Device DL16 data is already on the grid; host fp16 data (10 mantissa bits) is not.
    if dst.dtype in _DL16 and (transfer or src_logical not in _DL16):
        round_dl16_(held, transfer=transfer)
