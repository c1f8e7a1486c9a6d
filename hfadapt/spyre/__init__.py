"""The simulated IBM Spyre device: a versioned device profile, DL16 numerics, an eager
``spyre`` device (PrivateUse1) and a ``torch.compile(..., backend="spyre")`` backend."""

from __future__ import annotations

from hfadapt.spyre.lowering_report import LoweringReport, SourceLocation, Violation
from hfadapt.spyre.profile import DEFAULT_PROFILE, Profile, available_profiles, load_profile

__all__ = [
    "DEFAULT_PROFILE",
    "LoweringReport",
    "Profile",
    "SourceLocation",
    "Violation",
    "available_profiles",
    "load_profile",
]
