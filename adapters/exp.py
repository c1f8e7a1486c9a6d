"""exp over whole sticks (defect.exp_unaligned, torch-spyre#3799).

Compiled, an fp16 ``exp`` whose last dimension is wider than one 64-element stick and not a
whole number of them returns wrong values past each row's first stick. Zero-padding the last
dimension to whole sticks, taking exp, and keeping the real columns is the same function (exp
is elementwise; the padded columns are computed and dropped), and the slice starts at offset
0, which the stick layout allows. Cost: exp over up to 63 more columns per row.

No bundled family calls exp on such an extent (their softmax is the native op, not exp); the
adapter targets ``hfadapt.adapters.examples:ExpFeatures``, and ``stick_padded_exp`` is the
rewrite a family adapter would call where its code has ``torch.exp(x)``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from hfadapt.adapters.api import STICK, adapter


def stick_padded_exp(x: Tensor) -> Tensor:
    """``torch.exp(x)`` computed over the last dimension zero-padded to whole sticks."""
    width = x.shape[-1]
    pad = (-width) % STICK
    if width <= STICK or not pad:
        return torch.exp(x)
    return torch.exp(F.pad(x, (0, pad)))[..., :width]


def _example(seed: int):
    from hfadapt.adapters.examples import ExpFeatures

    g = torch.Generator().manual_seed(seed)
    module = ExpFeatures().double()
    with torch.no_grad():
        module.proj.weight.copy_(torch.randn(100, 64, generator=g, dtype=torch.float64) / 8)
    x = torch.randn(2, 64, 64, generator=g, dtype=torch.float64)
    return module, (x,), {}


@adapter(
    name="exp-stick-pad",
    target="hfadapt.adapters.examples:ExpFeatures.forward",
    rule="defect.exp_unaligned",
    example=_example,
)
def exp_features_stick_padded(self: torch.nn.Module, x: Tensor) -> Tensor:
    """exp(x W^T + b) with the exp taken over whole sticks."""
    return stick_padded_exp(self.proj(x))
