"""The simulated device: DL16 numerics, the eager device, the compile backend, the op and layout
rules, the card's defects, the lowering report. The shared fixtures this part's tests use, from
tests/support."""

from __future__ import annotations

from support.device import spyre, spyre_backend
from support.models import minilm_path

__all__ = ["minilm_path", "spyre", "spyre_backend"]
