"""SPLADE's ``log1p`` through the device's ``log`` (rule op.unsupported).

sentence-transformers' SpladePooling (``sparse_encoder/modules/splade_pooling.py``) turns MLM
logits into term weights as ``log1p(relu(logits * mask))`` (twice ``log1p`` for the
``log1p_relu`` activation), then takes the max or the sum over the tokens. ``aten::log1p`` is
not a device op (torch-spyre's supported operations list ``log``, not ``log1p``: the profile's
``op.unary``), so a SparseEncoder does not lower. ``log`` is native.

The rewrite is Goldberg's (D. Goldberg, "What every computer scientist should know about
floating-point arithmetic", ACM Computing Surveys 23(1), 1991, Theorem 4): with
``u = 1 + x`` rounded and ``d = u - 1``, ``log1p(x) = log(u) * x / d`` when ``d != 0`` and
``x`` when ``d == 0``. In real arithmetic ``d = x`` and it is ``log(1 + x)`` exactly. In
floating point it keeps log1p's relative accuracy for small ``x`` (at most 5 epsilon for
``0 <= x < 3/4`` when ``log`` is within half an ulp), where the plain ``log(1 + x)`` loses all of
it: below half an ulp of 1 (2^-11 in fp16, 2^-10 in DL16) ``1 + x`` rounds to 1 and a small
weight becomes 0. Zeros stay exact zeros (``d == 0`` gives ``x``), so the vector stays as sparse
as the stock one. tests/adapters/test_splade_pooling.py measures both forms on the simulated
device against float64.

The max over the tokens is ``torch.max(x, dim=1)`` as in the stock (``amax`` is compiled-only
on the device); the stock's ``chunk_size`` only bounds memory and changes no value (the max or
sum of per-chunk maxes or sums).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch
from torch import Tensor

from hfadapt.adapters.api import adapter


def log1p_by_log(x: Tensor) -> Tensor:
    """``log1p(x)`` for ``x >= 0`` through ``log`` only, accurate for small ``x`` (Goldberg)."""
    u = 1 + x
    d = u - 1
    rounded_away = d == 0  # 1 + x is 1: log1p(x) = x to within x^2 / 2
    ratio = x / torch.where(rounded_away, torch.ones_like(d), d)
    return torch.where(rounded_away, x, torch.log(u) * ratio)


def _term_weights(module: torch.nn.Module, logits: Tensor) -> Tensor:
    weights = log1p_by_log(torch.relu(logits))
    if module.activation_function == "log1p_relu":  # type: ignore[comparison-overlap]
        weights = log1p_by_log(weights)
    return weights


def _pool(module: torch.nn.Module, weights: Tensor, dim: int) -> Tensor:
    if module.pooling_strategy == "max":  # type: ignore[comparison-overlap]
        return torch.max(weights, dim=dim)[0]
    return torch.sum(weights, dim=dim)


def _example(seed: int):
    from sentence_transformers.sparse_encoder.modules.splade_pooling import SpladePooling

    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 64, 128, generator=g, dtype=torch.float64) * 3
    logits[0, :, :8] = torch.rand(64, 8, generator=g, dtype=torch.float64) * 1e-4  # log1p ~ x
    mask = torch.ones(3, 64, dtype=torch.long)
    mask[1, 40:] = 0
    mask[2, 7:] = 0
    module = SpladePooling(pooling_strategy="max", activation_function="log1p_relu")
    return module, ({"token_embeddings": logits, "attention_mask": mask},), {}


@adapter(
    name="splade-log1p-by-log",
    target="sentence_transformers.sparse_encoder.modules.splade_pooling:SpladePooling.forward",
    rule="op.unsupported",
    example=_example,
)
def splade_pooling_by_log(self: torch.nn.Module, features: dict[str, Any]) -> dict[str, Any]:
    """SpladePooling with each ``log1p`` taken through ``log`` (Goldberg's form)."""
    logits = features["token_embeddings"]
    if "cu_seq_lens_q" in features:  # unpadded (flattened) logits: one segment per sequence
        flat = logits.squeeze(0)
        bounds = features["cu_seq_lens_q"].tolist()
        pooled = torch.stack(
            [
                _pool(self, _term_weights(self, flat[start:end]), 0)
                for start, end in pairwise(bounds)
            ]
        )
    else:
        mask = features["attention_mask"].unsqueeze(-1).to(logits.dtype)
        pooled = _pool(self, _term_weights(self, logits * mask), 1)
    if self.embedding_dimension is None:
        self.embedding_dimension = pooled.shape[-1]
    features["sentence_embedding"] = pooled
    return features
