"""The package as a whole: layers, function length, public API, settings, README, the library front
door, every error raise site. The shared fixtures this part's tests use, from tests/support."""

from __future__ import annotations

from support.device import spyre
from support.hub import fake_hub, hub_with_tiny_bert, online
from support.models import minilm_path, tiny_model_dirs

__all__ = ["fake_hub", "hub_with_tiny_bert", "minilm_path", "online", "spyre", "tiny_model_dirs"]
