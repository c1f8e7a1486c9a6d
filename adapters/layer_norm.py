"""LayerNorm unfused, with its reductions in fp32.

Fused LayerNorm on DL16 data keeps its statistics in DL16 and cancels catastrophically
(hf-adapters saw NaN; profile rule numerics.layer_norm_dl16_stats). Upcasting to fp32 (an
allowed cast), then mean, subtract, square-mean, add eps and rsqrt (all fp32-capable device ops)
computes exactly the same function in real arithmetic; the affine part runs in the model dtype.
"""

from __future__ import annotations

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


@adapter(
    name="layer-norm-fp32-unfused",
    target="torch.nn.modules.normalization:LayerNorm.forward",
    rule="numerics.layer_norm_dl16_stats",
    example=_example,
)
def layer_norm(self, input: Tensor) -> Tensor:
    """(x - mean) * rsqrt(var + eps) * weight + bias, statistics in fp32."""
    dims = tuple(range(-len(self.normalized_shape), 0))
    x = input.to(torch.promote_types(input.dtype, torch.float32))  # fp16 -> fp32; fp64 stays
    mean = x.mean(dim=dims, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(dim=dims, keepdim=True)
    y = (centered * torch.rsqrt(var + self.eps)).to(input.dtype)
    if self.weight is not None:
        y = y * self.weight
    if self.bias is not None:
        y = y + self.bias
    return y
