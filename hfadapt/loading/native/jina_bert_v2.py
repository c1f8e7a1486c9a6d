"""jina-bert v2 (jina-embeddings-v2 small/base: ``JinaBertModel`` of jinaai/jina-bert-implementation)
as a native class, so a model of the family is judged without running its remote code.

Written from the public description of the architecture, not from the remote file:

- BERT's embeddings without position embeddings (word + token type, LayerNorm);
- attention with linear biases (ALiBi, Press, Smith and Lewis, "Train Short, Test Long",
  ICLR 2022): head ``h`` adds ``-m_h * |i - j|`` to the score of query ``i`` and key ``j``,
  symmetric because the encoder is bidirectional; the slopes are the paper's geometric
  sequence ``m_h = 2^(-8 h / n)`` for ``n`` a power of two, and for other head counts the ``n'``
  = largest power of two below slopes followed by every other slope of ``2 n'`` heads (the
  paper's reference code);
- post-LN blocks: ``LN(x + Attn(x))``, then a gated linear unit MLP (MosaicBERT's, which
  jina-bert v2 inherits: one bias-free projection to ``2 * intermediate``, ``act(first half)
  * second half``, a projection back, ``LN(h + residual)``), GELU (exact) for ``geglu`` and ReLU
  for ``reglu`` (Shazeer 2020, "GLU Variants Improve Transformer");
- BERT's tanh pooler on the first token.

Parameter names are the remote checkpoint's (``encoder.layer.N.mlp.gated_layers`` ...), so
its weights load as they are (hfadapt/data/remote_families.json drops the MLM head's ``bert.``
prefix). The mask comes from transformers' ``create_bidirectional_mask`` and attention from
its attention functions, so the device rewrites of every BERT apply here too; the ALiBi
bias is one method of the encoder (``alibi_bias``) that the ``alibi-bias-host`` adapter runs on
the host. The remote code's qk-post-norm variant (jina-embeddings-v2-base-code:
``layer_norm_q``/``layer_norm_k``, ``up_gated_layer``) is a different computation and is not
this class.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from huggingface_hub.dataclasses import strict
from torch import Tensor, nn
from transformers import PreTrainedConfig, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.masking_utils import create_bidirectional_mask
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

__all__ = [
    "MODEL_TYPE",
    "JinaBertV2Config",
    "JinaBertV2Encoder",
    "JinaBertV2Model",
    "alibi_bias",
    "alibi_slopes",
]

MODEL_TYPE = "jina_bert_v2"
# feed_forward_type -> the activation of the gated half
GLU_ACTIVATIONS = {"geglu": "gelu", "reglu": "relu"}


@strict
class JinaBertV2Config(PreTrainedConfig):
    """The fields jina-bert v2 computes with (the remote JinaBertConfig's, BERT's defaults)."""

    model_type = MODEL_TYPE

    vocab_size: int = 30528
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    feed_forward_type: str = "geglu"
    hidden_dropout_prob: float | int = 0.1
    attention_probs_dropout_prob: float | int = 0.0
    max_position_embeddings: int = 8192
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0

    def validate_architecture(self) -> None:
        """Part of transformers' ``@strict`` validation: what the class can compute."""
        if self.feed_forward_type not in GLU_ACTIVATIONS:
            raise ValueError(
                f"feed_forward_type={self.feed_forward_type!r}: jina-bert v2 has "
                f"{', '.join(GLU_ACTIVATIONS)}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )


def alibi_slopes(heads: int) -> list[float]:
    """ALiBi's per-head slopes (Press et al. 2022): ``2^(-8 h / n)``, h = 1..n, for a power of
    two ``n``; otherwise those of the largest power of two below, then every other slope of
    twice that many heads, up to ``heads``."""

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (h + 1) for h in range(n)]

    if heads & (heads - 1) == 0:
        return geometric(heads)
    lower = 2 ** math.floor(math.log2(heads))
    return geometric(lower) + alibi_slopes(2 * lower)[0::2][: heads - lower]


def alibi_bias(length: int, heads: int, dtype: torch.dtype, device: Any = None) -> Tensor:
    """ALiBi's bidirectional bias, [1, heads, length, length]: ``-slope_h * |i - j|``."""
    positions = torch.arange(length, device=device)
    distance = (positions[None, :] - positions[:, None]).abs()
    slopes = torch.tensor(alibi_slopes(heads), device=device)
    return (-slopes[:, None, None] * distance[None]).unsqueeze(0).to(dtype)


class JinaBertV2Embeddings(nn.Module):
    def __init__(self, config: JinaBertV2Config) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # BERT's buffer: all-zero token types when none are passed (hfadapt's
        # token-type-ids-host adapter passes them from the host instead)
        self.register_buffer(
            "token_type_ids",
            torch.zeros((1, config.max_position_embeddings), dtype=torch.long),
            persistent=False,
        )

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        batch, length = input_ids.shape
        if token_type_ids is None:
            buffered: Tensor = self.token_type_ids  # type: ignore[assignment]
            token_type_ids = buffered[:, :length].expand(batch, length)
        embeddings = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(embeddings))  # type: ignore[no-any-return]


def eager_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T * scaling + bias) V, [B, H, L, D] in, [B, L, H, D] out (transformers'
    attention-function convention)."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class JinaBertV2SelfAttention(nn.Module):
    def __init__(self, config: JinaBertV2Config) -> None:
        super().__init__()
        self.config = config
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.scaling = self.attention_head_size**-0.5
        self.is_causal = False
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def forward(self, hidden_states: Tensor, attention_bias: Tensor, **kwargs: object) -> Tensor:
        shape = (*hidden_states.shape[:-1], -1, self.attention_head_size)
        query = self.query(hidden_states).view(shape).transpose(1, 2)
        key = self.key(hidden_states).view(shape).transpose(1, 2)
        value = self.value(hidden_states).view(shape).transpose(1, 2)
        attention: Callable[..., Any] = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention
        )
        out, _ = attention(
            self,
            query,
            key,
            value,
            attention_bias,
            dropout=self.dropout.p if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        return out.reshape(*hidden_states.shape[:-1], -1).contiguous()  # type: ignore[no-any-return]


class JinaBertV2SelfOutput(nn.Module):
    def __init__(self, config: JinaBertV2Config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)  # type: ignore[no-any-return]


class JinaBertV2Attention(nn.Module):
    def __init__(self, config: JinaBertV2Config) -> None:
        super().__init__()
        self.self = JinaBertV2SelfAttention(config)
        self.output = JinaBertV2SelfOutput(config)

    def forward(self, hidden_states: Tensor, attention_bias: Tensor, **kwargs: object) -> Tensor:
        return self.output(self.self(hidden_states, attention_bias, **kwargs), hidden_states)  # type: ignore[no-any-return]


class JinaBertV2GLUMLP(nn.Module):
    """LN(x + W_o (act(x W_g) * x W_u)), W_g and W_u the halves of one bias-free projection."""

    def __init__(self, config: JinaBertV2Config) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gated_layers = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.act = ACT2FN[GLU_ACTIVATIONS[config.feed_forward_type]]
        self.wo = nn.Linear(config.intermediate_size, config.hidden_size)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: Tensor) -> Tensor:
        both = self.gated_layers(hidden_states)
        gated = both[..., : self.intermediate_size]
        non_gated = both[..., self.intermediate_size :]
        out = self.wo(self.dropout(self.act(gated) * non_gated))
        return self.layernorm(out + hidden_states)  # type: ignore[no-any-return]


class JinaBertV2Layer(nn.Module):
    def __init__(self, config: JinaBertV2Config) -> None:
        super().__init__()
        self.attention = JinaBertV2Attention(config)
        self.mlp = JinaBertV2GLUMLP(config)

    def forward(self, hidden_states: Tensor, attention_bias: Tensor, **kwargs: object) -> Tensor:
        return self.mlp(self.attention(hidden_states, attention_bias, **kwargs))  # type: ignore[no-any-return]


class JinaBertV2Encoder(nn.Module):
    def __init__(self, config: JinaBertV2Config) -> None:
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.layer = nn.ModuleList(
            [JinaBertV2Layer(config) for _ in range(config.num_hidden_layers)]
        )

    def alibi_bias(self, hidden_states: Tensor) -> Tensor:
        """The bias for ``hidden_states`` ([B, L, hidden]): [1, heads, L, L] in its dtype, on its
        device (:func:`alibi_bias`)."""
        length = hidden_states.shape[1]
        return alibi_bias(
            length, self.num_attention_heads, hidden_states.dtype, hidden_states.device
        )

    def forward(self, hidden_states: Tensor, attention_bias: Tensor, **kwargs: object) -> Tensor:
        """The layers, each adding ``attention_bias`` (ALiBi plus the padding mask) to its
        attention scores."""
        for layer in self.layer:
            hidden_states = layer(hidden_states, attention_bias, **kwargs)
        return hidden_states


class JinaBertV2Pooler(nn.Module):
    def __init__(self, config: JinaBertV2Config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.activation(self.dense(hidden_states[:, 0]))  # type: ignore[no-any-return]


def additive_mask(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A mask builder's output as an additive mask: a boolean mask (True: attend) becomes 0 /
    ``finfo(dtype).min``; an additive one is returned as it is."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(
        ~mask, torch.finfo(dtype).min
    )


class JinaBertV2PreTrainedModel(PreTrainedModel):
    config_class = JinaBertV2Config
    base_model_prefix = "bert"
    _supports_sdpa = True
    _supports_attention_backend = True
    _no_split_modules = ["JinaBertV2Layer"]  # noqa: RUF012 (transformers' own attribute)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class JinaBertV2Model(JinaBertV2PreTrainedModel):
    """jina-bert v2's encoder: last hidden state and the tanh pooler's output."""

    def __init__(self, config: JinaBertV2Config, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = JinaBertV2Embeddings(config)
        self.encoder = JinaBertV2Encoder(config)
        self.pooler = JinaBertV2Pooler(config) if add_pooling_layer else None
        self.post_init()  # type: ignore[no-untyped-call]

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embeddings.word_embeddings = value  # type: ignore[assignment]

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,  # ALiBi: positions are relative, none to pass
        **kwargs: object,
    ) -> BaseModelOutputWithPooling:
        if input_ids is None:
            raise ValueError("jina-bert v2 needs input_ids")
        hidden_states = self.embeddings(input_ids, token_type_ids)
        mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask
        )
        # built here, where the host-built mask already breaks a compiled graph: a host step
        # inside the encoder would split it from the pooler's graph
        bias = self.encoder.alibi_bias(hidden_states)
        mask = additive_mask(mask, hidden_states.dtype)
        if mask is not None:
            bias = bias + mask
        kwargs.pop("output_attentions", None)
        kwargs.pop("output_hidden_states", None)
        kwargs.pop("return_dict", None)
        last = self.encoder(hidden_states, bias, **kwargs)
        pooled = self.pooler(last) if self.pooler is not None else None
        return BaseModelOutputWithPooling(last_hidden_state=last, pooler_output=pooled)
