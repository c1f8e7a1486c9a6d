"""Attention the device computes right: Q, K and V contiguous before SDPA, head_dim
zero-padded to a whole stick, and, at 64 tokens, heads never read through the transposed view.

``attention-sdpa-contiguous``: transformers' attention modules hand SDPA ``.view(...)
.transpose(1, 2)`` views; compiled, the card reads such a view as if it were contiguous and
returns garbage (defect.transpose_sdpa_noncontiguous, hf-adapters ``hf_common.py``, REQUIRED).
The stock SDPA call with ``.contiguous()`` copies of Q, K and V is the same function.

``attention-head-dim-pad``:

Q @ K^T reduces over head_dim: a head_dim that is not a multiple of 64 puts the matmul's K off
a stick boundary and the backend compiler aborts (rule layout.matmul_k; all-MiniLM-L6-v2 has
head_dim 32). Zero-padding Q and K to the next multiple of 64 is exact: the padded columns add
0 to every dot product (V keeps its head_dim: it is not reduced over). The scale stays
1/sqrt(original head_dim). P @ V reduces over the key length, so K and V are zero-padded to
whole sticks along the sequence, with those keys masked (additive
``MASKED``, fp16's ``finfo.min / 2``: weight exactly 0): any sequence length works, and the rest of the model runs
on the real length instead of a batch padded to 64 tokens. The math is written out (matmul,
mul, add, softmax, matmul), the device's SDPA decomposition, with the mask added as given.

``attention-heads-select``: compiled, ``x.view(B, S, H, D).transpose(1, 2)`` returns wrong
values for 64-token fp16 shapes, ``.contiguous()`` or not (defect.view_transpose_64,
torch-spyre#1783). At 64 tokens this adapter re-takes the heads before attention: the
transposed view is turned back into the [B, S, H, D] view it came from (no data read), each
head is selected along the head axis (not the stick axis) and the heads are concatenated on a
new axis: a contiguous [B, H, S, D] holding the same numbers, one copy, what ``.contiguous()``
costs. Then it runs the attention ``attention-sdpa-contiguous`` or ``attention-head-dim-pad``
would run (it applies where they apply and takes the attention key over from them, priority
110). At other lengths it only delegates: sweeps probe 256 tokens, where nothing changes.
MPNet computes its attention in its own module, not through transformers' attention
functions: ``mpnet-attention-heads-select`` is its self-attention forward with the same head
re-take. Gemma3's q/k norms read the transposed view before attention (out of reach; Gemma runs
in bf16, which the defect does not match).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.nn import functional as F

from hfadapt.adapters.api import MASKED, STICK, adapter, head_dim
from hfadapt.adapters.examples import bert_at_trained_scale

# the only sequence length torch-spyre#1783 shows the head split failing at
HEAD_LAYOUT_SEQ = 64


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    if groups == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


def _example(seed: int):
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertSelfAttention

    g = torch.Generator().manual_seed(seed)
    cfg = BertConfig(hidden_size=96, num_attention_heads=3, attention_probs_dropout_prob=0.0)
    module = BertSelfAttention(cfg).double().eval()
    # 64 tokens: sequences reach the device padded to whole sticks; head_dim 32 does not.
    q, k, v = (torch.randn(2, 3, 64, 32, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.zeros(2, 1, 64, 64, dtype=torch.float64)
    mask[1, :, :, 40:] = -1e4
    return module, (q, k, v, mask), {"scaling": 32**-0.5, "dropout": 0.0}


def _example_transposed(seed: int):
    """Q, K, V as transformers' attention modules make them: [B, S, H, D] views transposed to
    [B, H, S, D] (head_dim 64, so the padding adapter does not apply)."""
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertSelfAttention

    g = torch.Generator().manual_seed(seed)
    cfg = BertConfig(hidden_size=128, num_attention_heads=2, attention_probs_dropout_prob=0.0)
    module = BertSelfAttention(cfg).double().eval()
    q, k, v = (
        torch.randn(2, 64, 2, 64, generator=g, dtype=torch.float64).transpose(1, 2)
        for _ in range(3)
    )
    mask = torch.zeros(2, 1, 64, 64, dtype=torch.float64)
    mask[1, :, :, 40:] = -1e4
    return module, (q, k, v, mask), {"scaling": 64**-0.5, "dropout": 0.0}


def _sdpa_aligned(config: Any) -> bool:
    return (
        config is not None
        and getattr(config, "_attn_implementation", None) == "sdpa"
        and (head_dim(config) or STICK) % STICK == 0
    )


def _head_dim_unaligned(config: Any) -> bool:
    return (
        config is not None
        and getattr(config, "_attn_implementation", None) in ("sdpa", "eager")
        and (head_dim(config) or STICK) % STICK != 0
    )


@adapter(
    name="attention-sdpa-contiguous",
    kind="attention",
    target="transformers.modeling_utils:PreTrainedModel",
    rule="defect.transpose_sdpa_noncontiguous",
    applies=lambda module, config: _sdpa_aligned(config),
    example=_example_transposed,
)
def contiguous_sdpa(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' SDPA attention with Q, K and V made contiguous first."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(
        module, query.contiguous(), key.contiguous(), value.contiguous(), attention_mask, **kwargs
    )


@torch.compiler.disable
def _key_pad_mask(length: int, extra: int, neg: float, like: Tensor) -> Tensor:
    """0 for the real keys, ``neg`` for the padding ones; built on the host, sent over."""
    mask = torch.zeros(length + extra, dtype=like.dtype)
    mask[length:] = neg
    return mask.to(like.device)


@adapter(
    name="attention-head-dim-pad",
    kind="attention",
    target="transformers.modeling_utils:PreTrainedModel",
    rule="layout.matmul_k",
    applies=lambda module, config: _head_dim_unaligned(config),
    example=_example,
)
def padded_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """softmax(Q K^T * scale + mask) V with Q, K, V zero-padded to whole sticks."""
    size = query.shape[-1]  # the head size
    scale = scaling if scaling is not None else size**-0.5
    groups = int(getattr(module, "num_key_value_groups", 1) or 1)
    key, value = _repeat_kv(key, groups), _repeat_kv(value, groups)
    # Q K^T reduces over head_dim, P V over the key length: those (only) become whole sticks.
    pad = (-size) % STICK
    length = key.shape[-2]
    extra = (-length) % STICK  # the padding keys are masked below
    if pad:
        query = F.pad(query, (0, pad))
    if pad or extra:
        key = F.pad(key, (0, pad, 0, extra))
    if extra:
        value = F.pad(value, (0, 0, 0, extra))
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    neg = MASKED
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            attention_mask = torch.zeros_like(attention_mask, dtype=scores.dtype).masked_fill(
                ~attention_mask, neg
            )
        attention_mask = attention_mask[..., :length]
        if extra:
            if attention_mask.shape[-1] != length:  # broadcast over keys: spell it out
                attention_mask = attention_mask.expand(*attention_mask.shape[:-1], length)
            attention_mask = F.pad(attention_mask, (0, extra), value=neg)
        scores = scores + attention_mask
    elif extra:
        scores = scores + _key_pad_mask(length, extra, neg, scores)
    probs = torch.softmax(scores, dim=-1)
    if dropout and module.training:
        probs = F.dropout(probs, p=dropout, training=True)
    out = torch.matmul(probs, value)
    return out.transpose(1, 2).contiguous(), None


def heads_by_select(t: Tensor) -> Tensor:
    """A 64-token [B, H, S, D] head split as a contiguous tensor built head by head, when ``t``
    is the transposed view of [B, S, H, D] data (otherwise ``t`` itself): the view is turned
    back (no data read), each head selected along the head axis, the heads concatenated on a
    new axis."""
    if t.dim() != 4 or t.shape[1] < 2 or t.shape[2] != HEAD_LAYOUT_SEQ:
        return t
    if not t.transpose(1, 2).is_contiguous():
        return t
    x = t.transpose(1, 2)  # [B, S, H, D], as the projection wrote it
    return torch.cat([x.select(2, h).unsqueeze(1) for h in range(x.shape[2])], dim=1)


@adapter(
    name="attention-heads-select",
    kind="attention",
    target="transformers.modeling_utils:PreTrainedModel",
    rule="defect.view_transpose_64",
    applies=lambda module, config: _sdpa_aligned(config) or _head_dim_unaligned(config),
    example=bert_at_trained_scale,  # at 64 tokens: view + transpose head splits
    proof="model",
    priority=110,  # applied after the two above: it takes the attention key over from them
)
def heads_select_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """At 64 tokens, Q, K and V re-taken head by head (never read through the transposed
    view); then the attention of attention-sdpa-contiguous or attention-head-dim-pad."""
    query, key, value = heads_by_select(query), heads_by_select(key), heads_by_select(value)
    if query.shape[-1] % STICK:
        return padded_attention(module, query, key, value, attention_mask, **kwargs)
    return contiguous_sdpa(module, query, key, value, attention_mask, **kwargs)


def _example_mpnet(seed: int):
    """MPNet's self-attention at 64 tokens, with a relative position bias and a padding mask."""
    from transformers import MPNetConfig
    from transformers.models.mpnet.modeling_mpnet import MPNetSelfAttention

    g = torch.Generator().manual_seed(seed)
    cfg = MPNetConfig(hidden_size=128, num_attention_heads=2, attention_probs_dropout_prob=0.0)
    module = MPNetSelfAttention(cfg).double().eval()
    x = torch.randn(2, 64, 128, generator=g, dtype=torch.float64)
    bias = torch.randn(1, 2, 64, 64, generator=g, dtype=torch.float64)
    mask = torch.zeros(2, 1, 1, 64, dtype=torch.float64)
    mask[1, ..., 40:] = MASKED
    return module, (x, mask, bias), {}


@adapter(
    name="mpnet-attention-heads-select",
    target="transformers.models.mpnet.modeling_mpnet:MPNetSelfAttention.forward",
    rule="defect.view_transpose_64",
    example=_example_mpnet,
)
def mpnet_heads_select(
    self: torch.nn.Module,
    hidden_states: Tensor,
    attention_mask: Tensor | None = None,
    position_bias: Tensor | None = None,
    output_attentions: bool = False,
    **kwargs: Any,
) -> tuple[Tensor, ...]:
    """MPNet's self-attention with Q, K and V re-taken head by head at 64 tokens."""
    head_size = int(self.attention_head_size)  # type: ignore[arg-type]
    shape = (*hidden_states.shape[:-1], -1, head_size)
    q, k, v = (
        heads_by_select(proj(hidden_states).view(shape).transpose(1, 2))
        for proj in (self.q, self.k, self.v)  # type: ignore[attr-defined]
    )
    scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(head_size)
    if position_bias is not None:
        scores = scores + position_bias
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = self.dropout(F.softmax(scores, dim=-1))  # type: ignore[operator]
    c = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
    out = self.o(c.view(*c.shape[:-2], self.all_head_size))  # type: ignore[operator]
    return (out, probs) if output_attentions else (out,)
