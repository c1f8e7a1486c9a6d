"""Relative-position attention bias built on the host.

MPNet buckets relative positions with a log, integer <-> float casts and comparisons
(``relative_position_bucket``): casts the device refuses (rule dtype.cast) and a log in fp32
(rule dtype.fp32.ops). The bias depends only on the sequence length and the learned table, so
the host computes it with the stock code and sends the (batch, heads, q, k) tensor over.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hfadapt.adapters.api import adapter, host_copy, on_host


def _mpnet_bias(
    table: torch.nn.Embedding, bsz: int, qlen: int, position_ids: Tensor | None, num_buckets: int
) -> Tensor:
    """The stock bias computation (per-row positions too, which the stock method mis-shapes),
    on the host with an fp32 copy of the table; cast back to the table's dtype there."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    if position_ids is not None:
        pos = position_ids.long()
        relative = pos[:, None, :] - pos[:, :, None]
    else:
        ar = torch.arange(qlen, dtype=torch.long)
        relative = ar[None, :] - ar[:, None]
    bucket = MPNetEncoder.relative_position_bucket(relative, num_buckets=num_buckets)
    values = host_copy(table)(bucket).to(table.weight.dtype)
    values = (
        values.permute([2, 0, 1]).unsqueeze(0)
        if values.dim() == 3
        else values.permute([0, 3, 1, 2])
    )
    return values.expand((bsz, -1, qlen, qlen)).contiguous()


def _example(seed: int):
    from transformers import MPNetConfig
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    torch.manual_seed(seed)
    enc = MPNetEncoder(
        MPNetConfig(
            hidden_size=128, num_attention_heads=2, num_hidden_layers=1, intermediate_size=256
        )
    )
    x = torch.randn(2, 64, 128, dtype=torch.float64)
    return enc.double(), (x,), {}


@adapter(
    name="mpnet-position-bias-host",
    target="transformers.models.mpnet.modeling_mpnet:MPNetEncoder.compute_position_bias",
    rule="dtype.cast",
    example=_example,
)
def mpnet_position_bias(
    self, x: Tensor, position_ids: Tensor | None = None, num_buckets: int = 32
) -> Tensor:
    """The stock bucketed relative-position bias, computed on the host."""
    return on_host(
        _mpnet_bias,
        self.relative_attention_bias,
        x.size(0),
        x.size(1),
        position_ids,
        num_buckets,
        back_to=x.device,
    )
