"""How ``import torch`` finds the simulated device, the way it finds torch-spyre's card.

torch-spyre declares ``torch_spyre = "torch_spyre:_autoload"`` in the ``torch.backends`` entry
point group; ``import torch`` calls every such entry point (unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``), so ``x.to("spyre")`` works with no other import. hfadapt
declares ``hfadapt_spyre = "hfadapt.spyre.eager.autoload:_autoload"`` in the same group:

- when the real ``torch_spyre`` is importable, it does nothing (the card's own entry point
  registers the device; the simulator never takes its place);
- ``HFADAPT_SPYRE_AUTOLOAD=0`` (or torch's own ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) opts out;
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


def enabled() -> bool:
    """Whether the entry point should register the simulator in this process."""
    return settings.spyre_autoload()


def _device_mid_import() -> bool:
    """Whether one of hfadapt's device modules is executing its import right now: then it is
    what imports torch (a process whose first torch import came from inside hfadapt.spyre),
    it is half-initialized, and registration waits for the explicit register() hfadapt's
    device paths call. (``__spec__._initializing`` is what the import system sets meanwhile.)"""
    return any(
        name.startswith("hfadapt.spyre")
        and getattr(getattr(module, "__spec__", None), "_initializing", False)
        for name, module in list(sys.modules.items())
    )


def _autoload() -> None:
    """The ``torch.backends`` entry point: register the simulated device unless opted out or
    the real torch-spyre is installed. Never raises (a failure would break ``import torch``):
    a device that cannot be registered here is reported by an explicit ``register()``."""
    if not enabled() or _device_mid_import():
        return
    from hfadapt.spyre.eager.device import real_torch_spyre, register

    if real_torch_spyre() is not None:
        return
    try:
        register()
    except Exception:  # PrivateUse1 taken by another backend: leave torch importable
        return
