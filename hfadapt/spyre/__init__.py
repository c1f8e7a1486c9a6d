"""The simulated IBM Spyre device: a versioned device profile, DL16 numerics, an eager
``spyre`` device (PrivateUse1) and a ``torch.compile(..., backend="spyre")`` backend.

Its parts by role, lowest first (hfadapt.layers): ``numerics/`` (DL16, the C kernels, AMX, the
kernels of ops with DL16 intermediates: functions of plain parameters), ``rules/`` (the profile
and its data, the op and layout rules, the card's defects, the lowering report, tracking), the
modules here that both halves share, then the halves ``eager/`` and ``compile/``, and
``runner`` over both."""

from __future__ import annotations

from types import ModuleType

from hfadapt.spyre.rules.lowering_report import LoweringReport, SourceLocation, Violation
from hfadapt.spyre.rules.profile import DEFAULT_PROFILE, Profile, available_profiles, load_profile

__all__ = [
    "DEFAULT_PROFILE",
    "LoweringReport",
    "Profile",
    "SourceLocation",
    "Violation",
    "available_profiles",
    "load_profile",
    "register",
]


def register(force: bool = False) -> ModuleType:
    """Register the simulated ``spyre`` device in this process (idempotent) and return the
    ``torch.spyre`` module. ``import torch`` already does this through the ``torch.backends``
    entry point unless ``HFADAPT_SPYRE_AUTOLOAD=0``; call it explicitly after opting out, or in a
    process that imported torch before hfadapt was installed. Raises DeviceError when the real
    torch-spyre is installed (``force=True`` simulates anyway)."""
    from hfadapt.spyre.eager.device import register as register_device

    return register_device(force=force)
