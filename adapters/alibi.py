"""The ALiBi attention bias on the host (jina-bert v2, hfadapt/loading/native/jina_bert_v2.py).

The bias ``-slope_h * |i - j|`` is built from ``arange`` (falls back), an integer subtraction
and ``abs``, and fp32 slopes cast to the model dtype: eagerly, that fp32 -> fp16 cast is
defect.eager_fp32_cast (torch-spyre#2314: on the adapter's own example the device proof
measures a stock error of 0.49 and 0 adapted). The bias depends only on the sequence length,
the head count and the dtype: the model's own bias function runs on the host once per (length,
heads, dtype) and the device gets the cached tensor (a constant to a compiled graph), as
adapters/rope.py does with cos/sin. Same code, same numbers."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hfadapt.adapters.api import adapter, host_constant

_NATIVE = "hfadapt.loading.native.jina_bert_v2"


def _host_bias(length: int, heads: int, dtype: torch.dtype) -> Tensor:
    """The model's own bias function, run where ``on_host`` runs it (the host)."""
    from hfadapt.loading.native.jina_bert_v2 import alibi_bias

    return alibi_bias(length, heads, dtype)


def _example(seed: int) -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    from hfadapt.loading.native.jina_bert_v2 import JinaBertV2Config, JinaBertV2Encoder

    heads = (2, 12, 6)[seed % 3]  # a power of two, and two that are not (ALiBi's two rules)
    config = JinaBertV2Config(
        hidden_size=64 * heads, num_hidden_layers=0, num_attention_heads=heads
    )
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(2, 64 + 64 * (seed % 2), 64 * heads, generator=g, dtype=torch.float64)
    return JinaBertV2Encoder(config).double(), (hidden,), {}


@adapter(
    name="alibi-bias-host",
    target=f"{_NATIVE}:JinaBertV2Encoder.alibi_bias",
    rule="dtype.cast",
    example=_example,
)
def alibi_bias_host(self: torch.nn.Module, hidden_states: Tensor) -> Tensor:
    """The stock ALiBi bias, built on the host once per (length, heads, dtype)."""
    length, dtype = int(hidden_states.shape[1]), hidden_states.dtype
    heads = int(self.num_attention_heads)
    return host_constant(
        "alibi-bias", _host_bias, length, heads, dtype, back_to=hidden_states.device
    )
