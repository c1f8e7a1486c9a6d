"""Native classes hfadapt ships for remote-code families transformers has no class for,
re-implemented from their public descriptions (never the remote code): each registers its
model_type with transformers' Auto classes, so a translated config builds and loads like any
native one (hfadapt/loading/translate.py, docs/remote-code.md)."""

from __future__ import annotations

import functools

__all__ = ["NATIVE_TYPES", "register_native_classes"]

# model_type -> the module of this package that defines it
NATIVE_TYPES = {"jina_bert_v2": "jina_bert_v2"}


@functools.cache
def register_native_classes() -> None:
    """Register every native class with AutoConfig and AutoModel, once per process."""
    from transformers import AutoConfig, AutoModel

    from hfadapt.loading.native.jina_bert_v2 import MODEL_TYPE, JinaBertV2Config, JinaBertV2Model

    AutoConfig.register(MODEL_TYPE, JinaBertV2Config, exist_ok=True)
    AutoModel.register(JinaBertV2Config, JinaBertV2Model, exist_ok=True)
