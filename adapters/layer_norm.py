"""LayerNorm unfused, its statistics as prescaled fp16 sums: the form that holds on the card.

Fused LayerNorm on DL16 data keeps its statistics in DL16 and cancels catastrophically
(hf-adapters saw NaN; profile rule numerics.layer_norm_dl16_stats). hf-adapters' card path
unfuses it with fp32 reductions, but an fp32 island is not exact on the card either: an fp32
``mean(-1)`` over more than 32 rows comes back wrong (torch-spyre#3804, fixed after mid-2026:
defect.fp32_reduction_rows), and an eager fp32 -> fp16 cast scrambles its elements
(torch-spyre#2314: defect.eager_fp32_cast). fp16 ``sum`` is right where fp16 ``mean`` is
reduced-precision (torch-spyre#2400), so the statistics here are sums of prescaled terms in the
model dtype: mean = sum(x / n); the mean is refined once by the sum of the centred values (its
own DL16 rounding would otherwise shift every row by up to 2^-10 of a large mean);
var = sum((d / sqrt(n))^2); a zero variance is not handed to rsqrt (``guarded_rsqrt``). The same
function in real arithmetic; no cast, no fp32 reduction, no square that can overflow.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from hfadapt.adapters.api import adapter


def _example(seed: int):
    g = torch.Generator().manual_seed(seed)
    ln = nn.LayerNorm(96, eps=1e-12, dtype=torch.float64)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(96, generator=g, dtype=torch.float64))
        ln.bias.copy_(torch.randn(96, generator=g, dtype=torch.float64))
    # A large mean next to a small spread, as residual streams have: E[x^2] - E[x]^2 cancels.
    x = torch.randn(2, 5, 96, generator=g, dtype=torch.float64) + 30
    return ln, (x,), {}


def centred_stats(x: Tensor, dims: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """(x - mean, mean of its square) over ``dims``, as sums of prescaled terms: the form whose
    every reduction is an fp16 sum on the card."""
    n = 1
    for d in dims:  # a loop, not math.prod over a generator: Dynamo traces it without a break
        n *= x.shape[d]
    mean = (x * (1.0 / n)).sum(dim=dims, keepdim=True)
    centred = x - mean
    centred = centred - (centred * (1.0 / n)).sum(dim=dims, keepdim=True)
    scaled = centred * (1.0 / math.sqrt(n))
    return centred, (scaled * scaled).sum(dim=dims, keepdim=True)


def guarded_rsqrt(var: Tensor, eps: float) -> Tensor:
    """rsqrt(var + eps), and 0 where var is 0. A BERT-style eps (1e-12) is below DL16's
    smallest normal (4.7e-10): on the card var + eps of a constant row (a padding position
    whose embedding is one table row) is 0, its rsqrt overflows to the NaN code and
    ``0 * NaN`` spreads through attention. Where var is 0 the centred row is 0 too, so the
    product is the stock one, 0, in real arithmetic."""
    return torch.where(var > 0, torch.rsqrt(var + eps), torch.zeros_like(var))


@adapter(
    name="layer-norm-unfused",
    target="torch.nn.modules.normalization:LayerNorm.forward",
    rule="numerics.layer_norm_dl16_stats",
    example=_example,
)
def layer_norm(self, input: Tensor) -> Tensor:
    """(x - mean) * rsqrt(var + eps) * weight + bias, statistics as prescaled sums."""
    dims = tuple(range(-len(self.normalized_shape), 0))
    centred, var = centred_stats(input, dims)
    y = centred * guarded_rsqrt(var, self.eps)
    if self.weight is not None:
        y = y * self.weight
    if self.bias is not None:
        y = y + self.bias
    return y
