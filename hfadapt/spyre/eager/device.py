"""The eager ``spyre`` device: PrivateUse1 renamed "spyre" through PyTorch's Python backend
registration (no C++ build), and the ``torch.spyre`` module (``is_available``,
``device_count``, ``current_device``, ``set_device``, ``synchronize``, ``device(...)``).

Registration is lazy: importing hfadapt registers nothing; ``register()`` or the first call of
this module's device functions does. If the real ``torch_spyre`` package is importable, the
simulator does not take its place unless asked to (``register(force=True)``)."""

from __future__ import annotations

import importlib.util
import sys
import threading
import warnings
from types import ModuleType, TracebackType
from typing import Any

import torch

from hfadapt import torch_internals as ti
from hfadapt.errors import DeviceError
from hfadapt.spyre.eager.selection import (
    DEVICE_COUNT,
    DEVICE_TYPE,
    set_thread_index,
    thread_index,
)
from hfadapt.spyre.rules.tracking import (
    SpyreDowncastWarning,
    SpyreFallbackWarning,
    active_profile,
    set_profile,
    tracking,
)

__all__ = [
    "SpyreDowncastWarning",
    "SpyreFallbackWarning",
    "active_profile",
    "current_device",
    "device",
    "device_count",
    "is_available",
    "is_registered",
    "is_simulated",
    "register",
    "set_device",
    "set_profile",
    "synchronize",
    "tracking",
]


_lock = threading.Lock()
_registered = False
_library: torch.library.Library | None = None


def real_torch_spyre() -> str | None:
    """Where the real torch-spyre package is, if it is importable (None if not)."""
    module = sys.modules.get("torch_spyre")
    if module is not None:
        return str(getattr(module, "__file__", None) or "torch_spyre (already imported)")
    try:
        spec = importlib.util.find_spec("torch_spyre")
    except (ImportError, ValueError):
        return None
    return None if spec is None else str(spec.origin or "torch_spyre")


def register(force: bool = False) -> ModuleType:
    """Register the simulated ``spyre`` device (idempotent) and return the ``torch.spyre``
    module. Raises DeviceError when the real torch-spyre is installed (use the card, or pass
    ``force=True`` to simulate anyway) or PrivateUse1 is taken by another backend."""
    global _registered, _library
    real = real_torch_spyre()
    if real is not None and not force:
        raise DeviceError(
            f"the real torch-spyre is installed ({real}): the simulated Spyre device does not "
            "take its place. Run on the card, or call hfadapt.spyre.eager.device.register(force=True) "
            "to simulate anyway."
        )
    with _lock:
        if _registered:
            return sys.modules[__name__]
        taken = ti.privateuse1_backend_name()
        if taken != "privateuseone":
            raise DeviceError(
                f"the PrivateUse1 backend is already registered as {taken!r}; the simulated "
                "Spyre device cannot be registered in this process"
            )
        if real is not None:
            warnings.warn(
                f"simulating the Spyre device although torch-spyre is installed ({real})",
                UserWarning,
                stacklevel=2,
            )
        ti.setup_privateuse1_python_backend(
            DEVICE_TYPE,
            backend_module=sys.modules[__name__],
            hook=_Hooks(),
            device_guard=_Guard(),
        )
        from hfadapt.spyre.eager.default_backend import install
        from hfadapt.spyre.eager.factories import register_kernels

        _library = register_kernels()
        # torch.compile(model) with the default backend compiles for the device, as on the card
        install()
        _registered = True
    return sys.modules[__name__]


def is_registered() -> bool:
    return _registered


def _ensure() -> None:
    if not _registered:
        register()


class _Hooks(ti.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(ti.DeviceGuard):
    def type_(self) -> Any:
        return ti.privateuse1_device_type()


# -- the torch.spyre module ---------------------------------------------------------------


def is_simulated() -> bool:
    """True: this is hfadapt's simulated card, not torch-spyre on hardware."""
    return True


def is_available() -> bool:
    """True once the simulated device is (or can be) registered; False if it declines
    (the real torch-spyre is installed). Never raises."""
    if _registered:
        return True
    try:
        register()
    except DeviceError:
        return False
    return True


def is_initialized() -> bool:
    return _registered


def device_count() -> int:
    _ensure()
    return DEVICE_COUNT


def _index(dev: int | str | torch.device | None) -> int:
    if dev is None:
        return current_device()
    if isinstance(dev, int):
        index = dev
    else:
        d = torch.device(dev)
        if d.type != DEVICE_TYPE:
            raise ValueError(f"expected a {DEVICE_TYPE} device, got {d}")
        index = current_device() if d.index is None else d.index
    if not 0 <= index < DEVICE_COUNT:
        raise RuntimeError(
            f"Invalid device index {index}: {DEVICE_COUNT} simulated spyre device(s) "
            "(HFADAPT_SPYRE_DEVICES sets how many)"
        )
    return index


def current_device() -> int:
    _ensure()
    return thread_index()


def set_device(dev: int | str | torch.device) -> None:
    _ensure()
    set_thread_index(_index(dev))


def synchronize(dev: int | str | torch.device | None = None) -> None:
    """Wait for the device: every simulated op has finished when it returns, so a no-op."""
    _ensure()
    _index(dev)


class device:
    """Context manager that makes ``dev`` the current spyre device in this thread."""

    def __init__(self, dev: int | str | torch.device | None) -> None:
        _ensure()
        self.index = None if dev is None else _index(dev)
        self.previous = 0

    def __enter__(self) -> device:
        self.previous = current_device()
        if self.index is not None:
            set_thread_index(self.index)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        set_thread_index(self.previous)


# What torch asks a registered device module for (AMP, seeding, fork safety).
def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def _is_in_bad_fork() -> bool:
    return False


def manual_seed(seed: int) -> None:
    """Random ops fall back to the host, whose generator ``torch.manual_seed`` seeds."""


def manual_seed_all(seed: int) -> None:
    """See manual_seed."""


def _lazy_init() -> None:
    _ensure()
