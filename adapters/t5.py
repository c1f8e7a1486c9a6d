"""T5 encoders (sentence-t5, GTR, ...).

- The relative-position bias buckets positions with a log, integer <-> float casts and
  comparisons (rules dtype.cast, dtype.fp32.ops): the stock ``compute_bias`` runs on the host and
  its (1, heads, q, k) bias is sent over.
- Each block guards fp16 training against overflow with ``where(isinf(h).any(), max - 1000,
  max)`` and a clamp: isinf and any are not device ops (rule op.unsupported) and the clamp bound
  is an fp32 tensor. In real arithmetic nothing is infinite, so the guard is the identity on
  every finite value; the block runs as stock code with that fp16-only branch not taken (DL16's
  range is wider than fp16's, which is what the guard protects against).
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import Tensor

from hfadapt.adapters.api import adapter, host_copy, on_host
from hfadapt.adapters.rebind import rebind, stock_method

_T5 = "transformers.models.t5.modeling_t5"


def _stock_bias(
    attn: torch.nn.Module, query_length: int, key_length: int, past_seen_tokens: Any
) -> Tensor:
    """The stock ``compute_bias`` on the host with an fp32 copy of the bias table, cast back to
    the table's dtype there."""
    host = host_copy(attn, "relative_attention_bias")
    values = stock_method(type(attn), "compute_bias")(
        host,
        query_length,
        key_length,
        device=torch.device("cpu"),
        past_seen_tokens=past_seen_tokens,
    )
    return values.to(attn.relative_attention_bias.weight.dtype)


def _t5_config(**overrides: Any) -> Any:
    from transformers import T5Config

    fields = {
        "d_model": 128,
        "d_kv": 64,
        "num_heads": 2,
        "d_ff": 256,
        "num_layers": 1,
        "vocab_size": 96,
        "feed_forward_proj": "relu",
        "dropout_rate": 0.0,
        "is_decoder": False,
        "use_cache": False,
    }
    return T5Config(**{**fields, **overrides})


def _bias_example(seed: int):
    from transformers.models.t5.modeling_t5 import T5Attention

    torch.manual_seed(seed)
    attn = T5Attention(_t5_config(), has_relative_attention_bias=True).double()
    return attn, (64 + 64 * (seed % 2), 64 + 64 * (seed % 2)), {}


@adapter(
    name="t5-position-bias-host",
    target=f"{_T5}:T5Attention.compute_bias",
    rule="dtype.cast",
    example=_bias_example,
)
def t5_position_bias(
    self: torch.nn.Module,
    query_length: int,
    key_length: int,
    device: Any = None,
    past_seen_tokens: Any = 0,
) -> Tensor:
    """The stock bucketed relative-position bias, computed on the host."""
    table = self.relative_attention_bias.weight
    back_to = device if device is not None else table.device
    return on_host(_stock_bias, self, query_length, key_length, past_seen_tokens, back_to=back_to)


def _torch_without_fp16_guard() -> types.ModuleType:
    """``torch`` as the block's code sees it, but with a float16 no tensor dtype equals."""
    proxy = types.ModuleType("hfadapt_torch_without_fp16_guard")
    proxy.__dict__.update(
        {k: v for k, v in torch.__dict__.items() if k not in ("__name__", "__spec__", "__loader__")}
    )
    proxy.float16 = object()  # type: ignore[attr-defined]
    return proxy


_TORCH_NO_GUARD = _torch_without_fp16_guard()


def _block_example(seed: int):
    from transformers.models.t5.modeling_t5 import T5Block

    torch.manual_seed(seed)
    block = T5Block(_t5_config(), has_relative_attention_bias=True, layer_idx=0).double().eval()
    x = torch.randn(2, 64, 128, dtype=torch.float64)
    return block, (x,), {}


@adapter(
    name="t5-block-no-fp16-guard",
    target=f"{_T5}:T5Block.forward",
    rule="op.unsupported",
    example=_block_example,
)
def t5_block(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The stock T5 block without its fp16 overflow guard (the identity on finite values)."""
    return rebind(stock_method(type(self), "forward"), torch=_TORCH_NO_GUARD)(self, *args, **kwargs)
