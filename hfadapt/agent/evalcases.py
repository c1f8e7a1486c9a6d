"""The code behind ``hfadapt agent-eval``'s failure cases: small modules that fail on the device
the way real model code does (docs/device-profile.md: rewrites, unsupported ops), each with an
example builder (seed -> module, args, kwargs; odd sizes that change with the seed) for the
equivalence proof and a model builder (seed -> model, inputs; stick-aligned) for the device.

gelu_new and Llama's RMSNorm are the real transformers classes; the rest stand in for code
found in many models, kept here so the suite does not move when transformers does."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Example = tuple[nn.Module, tuple[Any, ...], dict[str, Any]]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _odd(seed: int, base: int) -> int:
    return base + 2 * (seed % 3)  # 7, 9, 11 ...: odd sizes, different per seed


# -- the failing modules ------------------------------------------------------------------------


class MaskedScores(nn.Module):
    """Attention scores with masked positions filled by masked_fill (not a device op)."""

    fill = -10000.0

    def forward(self, scores: Tensor, mask: Tensor) -> Tensor:
        return scores.masked_fill(~mask, self.fill)


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryApply(nn.Module):
    """RoPE's rotate_half slices the stick dimension at an offset ("stick expression with offset")."""

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return x * cos + rotate_half(x) * sin


class CausalSoftmax(nn.Module):
    """A causal mask built on the device with tril and applied with masked_fill."""

    def forward(self, scores: Tensor) -> Tensor:
        n = scores.shape[-1]
        causal = torch.ones(n, n, dtype=torch.bool, device=scores.device).tril()
        return scores.masked_fill(~causal, torch.finfo(scores.dtype).min).softmax(dim=-1)


class SmallHeadAttention(nn.Module):
    """SDPA with head_dim 32: off the 64-element stick, the matmul does not lower."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return F.scaled_dot_product_attention(q, k, v)


class TokenTypeAdd(nn.Module):
    """A one-row token-type table gathered by index (aten::index is not a device op)."""

    def __init__(self, hidden: int = 64) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(1, hidden))

    def forward(self, hidden_states: Tensor, token_type_ids: Tensor) -> Tensor:
        return hidden_states + self.table[token_type_ids]


class L2Normalize(nn.Module):
    """x / ||x|| with the norm as pow(0.5): only pow(x, 2) lowers."""

    def forward(self, x: Tensor) -> Tensor:
        return x / x.pow(2).sum(dim=-1, keepdim=True).pow(0.5)


class Softsign(nn.Module):
    """x / (1 + |x|) written with pow(-1)."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.pow(1.0 + x.abs(), -1.0)


class PaddingMaskAdd(nn.Module):
    """An additive padding mask cast from the int64 mask on the device (int -> float cast)."""

    def forward(self, scores: Tensor, attention_mask: Tensor) -> Tensor:
        keep = attention_mask[:, None, :].to(scores.dtype)
        return scores + (1.0 - keep) * -10000.0


# -- example builders (float64, odd sizes) --------------------------------------------------


def gelu_example(seed: int) -> Example:
    from transformers.activations import NewGELUActivation

    x = torch.randn(3, _odd(seed, 7), 65, generator=_gen(seed), dtype=torch.float64) * 4
    return NewGELUActivation(), (x,), {}


def rms_norm_example(seed: int) -> Example:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    g = _gen(seed)
    # hidden 64, the case model's: a captured graph is bound to its parameters' shapes, and a
    # case's example comes from the failing model itself
    norm = LlamaRMSNorm(64, eps=1e-6).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=g, dtype=torch.float64))
    x = torch.randn(2, _odd(seed, 9), 64, generator=g, dtype=torch.float64) * 5 + 1
    return norm, (x,), {}


def masked_scores_example(seed: int) -> Example:
    g = _gen(seed)
    n = _odd(seed, 7)
    scores = torch.randn(2, 3, n, n, generator=g, dtype=torch.float64)
    mask = torch.rand(2, 1, n, n, generator=g) > 0.3
    return MaskedScores(), (scores, mask), {}


def _rope_tables(n: int, d: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(n, dtype=torch.float64), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotary_example(seed: int) -> Example:
    n = _odd(seed, 7)
    x = torch.randn(2, 3, n, 64, generator=_gen(seed), dtype=torch.float64)
    cos, sin = _rope_tables(n, 64, torch.float64)
    return RotaryApply(), (x, cos, sin), {}


def causal_example(seed: int) -> Example:
    n = _odd(seed, 7)
    return (
        CausalSoftmax(),
        (torch.randn(2, 3, n, n, generator=_gen(seed), dtype=torch.float64),),
        {},
    )


def small_head_example(seed: int) -> Example:
    g = _gen(seed)
    n = _odd(seed, 7)
    q, k, v = (torch.randn(2, 3, n, 32, generator=g, dtype=torch.float64) for _ in range(3))
    return SmallHeadAttention(), (q, k, v), {}


def token_type_example(seed: int) -> Example:
    torch.manual_seed(seed)
    module = TokenTypeAdd(64).double()
    n = _odd(seed, 7)
    hidden = torch.randn(2, n, 64, generator=_gen(seed), dtype=torch.float64)
    return module, (hidden, torch.zeros(2, n, dtype=torch.long)), {}


def l2_example(seed: int) -> Example:
    x = torch.randn(3, _odd(seed, 7), 64, generator=_gen(seed), dtype=torch.float64) * 3
    return L2Normalize(), (x,), {}


def softsign_example(seed: int) -> Example:
    x = torch.randn(3, _odd(seed, 7), 65, generator=_gen(seed), dtype=torch.float64) * 5
    return Softsign(), (x,), {}


def padding_mask_example(seed: int) -> Example:
    g = _gen(seed)
    n = _odd(seed, 7)
    scores = torch.randn(2, n, n, generator=g, dtype=torch.float64)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, n - 3 :] = 0
    return PaddingMaskAdd(), (scores, mask), {}


# -- model builders (fp32 CPU models; inputs stick-aligned) ----------------------------------


class Wrap(nn.Module):
    """A tiny model around one failing module: linear in, the module, linear out."""

    def __init__(self, inner: nn.Module, width: int = 64) -> None:
        super().__init__()
        self.proj_in = nn.Linear(width, width)
        self.inner = inner
        self.proj_out = nn.Linear(width, width)

    def forward(
        self, x: Tensor, extra: Tensor | None = None, extra2: Tensor | None = None
    ) -> Tensor:
        rest = [t for t in (extra, extra2) if t is not None]
        out: Tensor = self.proj_out(self.inner(self.proj_in(x), *rest))
        return out


def _x(seed: int, *shape: int) -> Tensor:
    # fp32 on the host; the device step casts float inputs to the run's dtype.
    return torch.randn(*shape, generator=_gen(seed + 100))


def _seeded(seed: int) -> None:
    torch.manual_seed(seed)


def gelu_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers.activations import NewGELUActivation

    _seeded(seed)
    return Wrap(NewGELUActivation()), {"x": _x(seed, 2, 64, 64)}


def rms_norm_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    _seeded(seed)
    return Wrap(LlamaRMSNorm(64)), {"x": _x(seed, 2, 64, 64)}


def masked_scores_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    _seeded(seed)
    mask = torch.rand(2, 1, 64, 64, generator=_gen(seed)) > 0.3
    mask[..., 0] = True
    return Wrap(MaskedScores()), {"x": _x(seed, 2, 4, 64, 64), "extra": mask}


def rotary_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    _seeded(seed)
    cos, sin = _rope_tables(64, 64, torch.float32)
    return Wrap(RotaryApply()), {"x": _x(seed, 2, 4, 64, 64), "extra": cos, "extra2": sin}


def causal_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    _seeded(seed)
    return Wrap(CausalSoftmax()), {"x": _x(seed, 2, 4, 64, 64)}


class _QKV(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(64, 32), nn.Linear(64, 32), nn.Linear(64, 32)
        self.attn = SmallHeadAttention()

    def forward(self, x: Tensor) -> Tensor:
        out = self.attn(self.q(x), self.k(x), self.v(x))
        return torch.cat((out, out), dim=-1)


def small_head_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    _seeded(seed)
    return _QKV(), {"x": _x(seed, 2, 4, 64, 64)}


def token_type_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    _seeded(seed)
    return Wrap(TokenTypeAdd(64)), {
        "x": _x(seed, 2, 64, 64),
        "extra": torch.zeros(2, 64, dtype=torch.long),
    }


def l2_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    _seeded(seed)
    return Wrap(L2Normalize()), {"x": _x(seed, 2, 64, 64)}


def softsign_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    _seeded(seed)
    return Wrap(Softsign()), {"x": _x(seed, 2, 64, 64)}


def padding_mask_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    _seeded(seed)
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, 50:] = 0
    return Wrap(PaddingMaskAdd()), {"x": _x(seed, 2, 64, 64), "extra": mask}


class _ExpWide(nn.Module):
    """exp over a last dimension of 96 (more than one stick, not a whole number of sticks): in
    fp16 on the device the card's silent ``exp_unaligned_stick`` defect, a failure that has
    nothing to do with the softsign after it."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 96)
        self.down = nn.Linear(96, 64)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down(torch.exp(self.up(x) * 0.5))
        return out


class CorruptedSoftsign(nn.Module):
    """Softsign (the failure to draft for) after a part the device gets wrong anyway."""

    def __init__(self) -> None:
        super().__init__()
        self.other = _ExpWide()
        self.inner = Softsign()
        self.proj_out = nn.Linear(64, 64)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.proj_out(self.inner(self.other(x)))
        return out


def corrupted_softsign_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The softsign failure in a model whose device run is already wrong without any draft (a
    baseline that fails end to end for another reason)."""
    _seeded(seed)
    return CorruptedSoftsign(), {"x": _x(seed, 2, 64, 64)}


# -- held-out-style cases: real transformers code on tiny models built from configs -----------

_INV_SQRT2 = 0.7071067811865476


class ErfGELU(nn.Module):
    """The exact GELU written out with erf (not a device op). The exact rewrite is the native
    gelu, which the device runs only compiled: a case judged in compiled execution."""

    def forward(self, x: Tensor) -> Tensor:
        return 0.5 * x * (1.0 + torch.erf(x * _INV_SQRT2))


def erf_gelu_example(seed: int) -> Example:
    x = torch.randn(3, _odd(seed, 7), 64, generator=_gen(seed), dtype=torch.float64) * 3
    return ErfGELU(), (x,), {}


def erf_gelu_model(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    _seeded(seed)
    return Wrap(ErfGELU()), {"x": _x(seed, 2, 64, 64)}


def _tiny_config(model_type: str, **fields: object) -> Any:
    """A one-layer model of ``model_type`` with widths on sticks (no download: from a config)."""
    from transformers import AutoConfig

    return AutoConfig.for_model(
        model_type,
        hidden_size=128,
        num_attention_heads=2,
        intermediate_size=256,
        num_hidden_layers=1,
        vocab_size=100,
        max_position_embeddings=128,
        **fields,
    )


def _token_inputs(seed: int, batch: int, length: int, pad_from: int) -> dict[str, Tensor]:
    """Token ids and an attention mask whose last sequence is padded from ``pad_from``."""
    ids = torch.randint(3, 100, (batch, length), generator=_gen(seed + 200))
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[-1, pad_from:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def deberta_model(seed: int) -> tuple[nn.Module, dict[str, Any]]:
    """A one-layer DeBERTa-v2: its embeddings and its attention both cast the int64 mask on
    the device, in two ``forward`` methods of one file (two failures told apart by class)."""
    from transformers import DebertaV2Model

    _seeded(seed)
    model = DebertaV2Model(_tiny_config("deberta-v2"))
    return model.eval(), _token_inputs(seed, 2, 64, 40)


def deberta_embeddings_example(seed: int) -> Example:
    from transformers.models.deberta_v2.modeling_deberta_v2 import DebertaV2Embeddings

    _seeded(seed)
    module = DebertaV2Embeddings(_tiny_config("deberta-v2")).double().eval()
    n = _odd(seed, 7)
    inputs = _token_inputs(seed, 2, n, n - 3)
    # the model's own call: every argument by keyword
    ids = inputs["input_ids"]
    kwargs = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "position_ids": None}
    return module, (), {**kwargs, "mask": inputs["attention_mask"], "inputs_embeds": None}


def roformer_model(seed: int) -> tuple[nn.Module, dict[str, Any]]:
    """A one-layer RoFormer: its rotary embedding is a staticmethod that slices the stick."""
    from transformers import RoFormerModel

    _seeded(seed)
    model = RoFormerModel(_tiny_config("roformer", embedding_size=128))
    return model.eval(), _token_inputs(seed, 2, 64, 40)


def roformer_rotary_example(seed: int) -> Example:
    """RoFormerSelfAttention with the rotary staticmethod's own arguments: the sinusoidal
    table [1, 1, n, d] and query and key layers [batch, heads, n, d] (head size 64)."""
    from transformers.models.roformer.modeling_roformer import (
        RoFormerSelfAttention,
        RoFormerSinusoidalPositionalEmbedding,
    )

    _seeded(seed)
    config = _tiny_config("roformer", embedding_size=128)
    module = RoFormerSelfAttention(config).double().eval()
    n = _odd(seed, 7)
    table = RoFormerSinusoidalPositionalEmbedding(128, 64)
    with torch.no_grad():
        table.weight.copy_(table.create_weight())
        sinusoidal = table(torch.Size((1, n))).to(torch.float64)[None, None, :, :]
    g = _gen(seed)
    q, k = (torch.randn(2, 2, n, 64, generator=g, dtype=torch.float64) for _ in range(2))
    return module, (sinusoidal, q, k), {}


def minilm_like_model(seed: int) -> tuple[nn.Module, dict[str, Any]]:
    """A one-layer BERT shaped like MiniLM (hidden 384 = 6 sticks, 12 heads of 32): without
    the post-LN hand-off clone, the card silently gets the next layer's input wrong."""
    from transformers import BertModel

    _seeded(seed)
    config = _tiny_config("bert")
    config.hidden_size, config.num_attention_heads, config.intermediate_size = 384, 12, 1536
    return BertModel(config).eval(), _token_inputs(seed, 2, 64, 40)


def minilm_embeddings_example(seed: int) -> Example:
    """MiniLM-like BERT's embeddings with the call BertModel.forward makes on the device (every
    argument by keyword; token_type_ids the zeros the registry's token-type-ids-host builds):
    the module whose LayerNorm output the next compiled graph misreads."""
    from transformers.models.bert.modeling_bert import BertEmbeddings

    _seeded(seed)
    config = _tiny_config("bert")
    config.hidden_size = 384
    module = BertEmbeddings(config).double().eval()
    n = _odd(seed, 7)
    ids = _token_inputs(seed, 2, n, n - 3)["input_ids"]
    kwargs = {"position_ids": None, "token_type_ids": torch.zeros_like(ids), "inputs_embeds": None}
    return module, (), {"input_ids": ids, **kwargs, "cache_length": 0}


def roformer_mask_example(seed: int) -> Example:
    """The masking utility's call as RoFormerModel.forward makes it: the config held by a
    FunctionSite (in the place a module takes in the other examples; its attention
    implementation the model's, eager), the tensors and ``cache`` by name."""
    from hfadapt.graphs.capture import FunctionSite

    _seeded(seed)
    config = _tiny_config("roformer", embedding_size=128)
    config._attn_implementation = "eager"
    n = _odd(seed, 7)
    embeds = torch.randn(2, n, 128, generator=_gen(seed), dtype=torch.float64)
    # the padded sequence first: a batch cut to its first row still masks something (an
    # all-ones mask is no mask: the stock function returns None for it)
    mask = _token_inputs(seed, 2, n, n - 3)["attention_mask"].flip(0)
    site = FunctionSite({"config": config})
    return site, (), {"inputs_embeds": embeds, "attention_mask": mask, "cache": None}
