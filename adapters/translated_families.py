"""Adapters for the native classes remote-code models are translated to (hfadapt.loading.translate):
GTE (Alibaba ``new``), jina-embeddings-v3 and EuroBERT. Their rotary embeddings use the rope
rewrites of ``rope.py`` (cos/sin on the host, ``rotate_half`` as ``x @ R``): those families are
rows of its one RoPE table. What is left here is EuroBERT's RMSNorm, which squares with
``pow(2)`` in fp32 (rule dtype.fp32.ops): ``x*x`` instead, its mean a prescaled sum in the model
dtype, as adapters/rms_norm.py explains (docs/device-profile.md, "Rewrites").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hfadapt.adapters.api import adapter


def _rms_example(seed: int):  # type: ignore[no-untyped-def]
    from transformers.models.eurobert.modeling_eurobert import EuroBertRMSNorm

    g = torch.Generator().manual_seed(seed)
    norm = EuroBertRMSNorm(64, eps=1e-5).to(torch.float64)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=g, dtype=torch.float64))
    return norm, (torch.randn(2, 9, 64, generator=g, dtype=torch.float64) * 5,), {}


@adapter(
    name="rms-norm-square-eurobert",
    target="transformers.models.eurobert.modeling_eurobert:EuroBertRMSNorm.forward",
    rule="dtype.fp32.ops",
    example=_rms_example,
)
def eurobert_rms_norm(self: torch.nn.Module, hidden_states: Tensor) -> Tensor:
    """weight * (x * rsqrt(mean(x*x) + eps)), in the model dtype (a prescaled sum)."""
    scaled = hidden_states * (1.0 / math.sqrt(hidden_states.shape[-1]))
    variance = (scaled * scaled).sum(-1, keepdim=True)
    # 0 where the variance is 0 (then x is 0): an eps below DL16's smallest normal flushes on
    # the card, and rsqrt(0) would be the NaN code (adapters/rms_norm.py)
    inv = torch.where(
        variance > 0, torch.rsqrt(variance + self.variance_epsilon), torch.zeros_like(variance)
    )
    return self.weight * (hidden_states * inv)
