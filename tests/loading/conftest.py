"""Loading a model to judge: weights, structural stand-ins, translations, probes. The shared
fixtures this part's tests use, from tests/support."""

from __future__ import annotations

from support.device import one_thread
from support.hub import fake_hub, hub_with_tiny_bert, online
from support.models import minilm_path, tiny_bert, tiny_model_dirs
from support.timing import sleeps

__all__ = [
    "fake_hub",
    "hub_with_tiny_bert",
    "minilm_path",
    "one_thread",
    "online",
    "sleeps",
    "tiny_bert",
    "tiny_model_dirs",
]
