"""How ``import torch`` finds the simulated device, the way it finds torch-spyre's card.

torch-spyre declares ``torch_spyre = "torch_spyre:_autoload"`` in the ``torch.backends`` entry
point group; ``import torch`` calls every such entry point (unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), so ``x.to("spyre")`` works with no other import. hfadapt
declares ``hfadapt_spyre = "hfadapt.spyre.eager.autoload:_autoload"`` in the same group:

- when the real ``torch_spyre`` is importable, it does nothing (the card's own entry point
  registers the device; the simulator never takes its place);
- ``HFADAPT_SPYRE_AUTOLOAD=0`` (or torch's own ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) opts out;
- it never takes PrivateUse1 from another backend: torch has one PrivateUse1 slot, and calls the
  group's entry points in an order no package controls. When the slot is already renamed, or
  another package declares a ``torch.backends`` entry point (torch's openreg example, Ascend's
  torch_npu, ...), it steps aside and records why (``stepped_aside()``); hfadapt's own device
  paths still call ``register()``, which then says which backend holds the slot;
- otherwise it registers the simulator (``hfadapt.spyre.eager.device.register``), which costs
  a few imports of hfadapt's device modules and no model code.

Explicit use, with or without the entry point::

    from hfadapt.spyre.eager.device import register
    register()                  # idempotent; returns the torch.spyre module
    torch.ones(2).to("spyre")
"""

from __future__ import annotations

import sys

from hfadapt import settings

ENV = settings.HFADAPT_SPYRE_AUTOLOAD.name
GROUP = "torch.backends"
#: This entry point's own value in the group (pyproject.toml); every other one is another backend.
OWN_ENTRY_POINT = "hfadapt.spyre.eager.autoload:_autoload"

_stepped_aside: str | None = None


def enabled() -> bool:
    """Whether the entry point should register the simulator in this process."""
    return settings.spyre_autoload()


def _device_mid_import() -> bool:
    """Whether one of hfadapt's device modules is executing its import right now: then it is
    what imports torch (a process whose first torch import came from inside hfadapt.spyre),
    it is half-initialized, and registration waits for the explicit register() hfadapt's
    device paths call. (``__spec__._initializing`` is what the import system sets meanwhile.)"""
    return any(
        (name.startswith("hfadapt.spyre") or name == "hfadapt.torch_internals")
        and getattr(getattr(module, "__spec__", None), "_initializing", False)
        for name, module in list(sys.modules.items())
    )


def other_backends() -> list[str]:
    """The other ``torch.backends`` entry points installed in this environment, by name."""
    from importlib.metadata import entry_points

    return sorted({ep.name for ep in entry_points(group=GROUP) if ep.value != OWN_ENTRY_POINT})


def stepped_aside() -> str | None:
    """Why the entry point left PrivateUse1 alone in this process (None if it did not)."""
    return _stepped_aside


def _claimant() -> str | None:
    """Why PrivateUse1 is not the simulator's to take at ``import torch``, or None."""
    from hfadapt import torch_internals as ti

    taken = ti.privateuse1_backend_name()
    if taken not in ("privateuseone", "spyre"):
        return f"PrivateUse1 is already registered as {taken!r}"
    others = other_backends()
    if others:
        return (
            f"another torch.backends entry point is installed ({', '.join(others)}) and may "
            "claim PrivateUse1"
        )
    return None


def _autoload() -> None:
    """The ``torch.backends`` entry point: register the simulated device unless opted out, the
    real torch-spyre is installed, or another backend holds or may claim PrivateUse1. Never
    raises (a failure would break ``import torch``): a device that cannot be registered here is
    reported by an explicit ``register()``."""
    global _stepped_aside
    if not enabled() or _device_mid_import():
        return
    from hfadapt.spyre.eager.device import real_torch_spyre, register

    if real_torch_spyre() is not None:
        return
    _stepped_aside = _claimant()
    if _stepped_aside is not None:
        return
    try:
        register()
    except Exception:  # PrivateUse1 taken by another backend: leave torch importable
        return
