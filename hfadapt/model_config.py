"""What hfadapt reads a model's config as: a transformers ``PretrainedConfig`` (a subclass from
remote code too), or the same config as a mapping (a config.json as read, a cached snapshot's
config). The functions that take one read its fields through ``getattr`` or ``get`` and say
which they use; transformers is imported for type checking only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from transformers import PretrainedConfig

__all__ = ["ModelConfig"]

ModelConfig: TypeAlias = "PretrainedConfig | Mapping[str, Any]"
