"""How sharp a model's attention is, measured and drawn. A trained attention's logits spread far
wider than a seeded one's: all-MiniLM-L6-v2's first layer holds positional heads whose query
rows stand up to 50 above their mean (a previous-token head), its later layers rows at 10-15
above it, while its structural stand-in's logits spread a sixth of that in the first layer. The
card rounds a logit by a share of its size, so a sharper softmax carries a larger device error:
fed the same probes, the real model's per-token cosine error is twice its flat stand-in's. The
spread is measured as the standard deviation of a layer's content logits (``logit_spread``) and
drawn by scaling each attention's query (``sharpen``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from hfadapt.spyre.rules import layout_rules

__all__ = [
    "Attention",
    "Sharpened",
    "attentions",
    "head_dim",
    "logit_spread",
    "seeded_row",
    "sharpen",
    "spread_of_layers",
]

# The query, key and value projections of one attention, by the names the families give them.
_QKV_NAMES = (
    ("query", "key", "value"),
    ("q_proj", "k_proj", "v_proj"),
    ("q_lin", "k_lin", "v_lin"),
    ("q", "k", "v"),
)
# A per-head norm a family applies to the queries (and the keys) after their projection (Qwen3,
# Gemma3, OLMo2): the query's scale is then that norm's, not the projection's, and the logits
# are taken between the normed queries and keys.
_QUERY_NORM_NAMES = ("q_norm", "query_norm", "q_layernorm")
_KEY_NORM_NAMES = ("k_norm", "key_norm", "k_layernorm")
# The ids of ``seeded_row``: from this one on (past WordPiece's specials and unused rows) when
# the vocabulary is larger, else from 0; this many tokens.
ORDINARY_FROM = 1000
ROW_LENGTH = 64
# ``sharpen`` stops when every layer's spread is within this share of its target, or after
# this many measure-and-scale rounds (a layer's inputs move when the layers before it change).
SPREAD_TOLERANCE = 0.05
SHARPEN_ROUNDS = 3


@dataclass(frozen=True, eq=False)
class Attention:
    """One attention's parts: its projections, the per-head norms it applies after the query's
    and the key's (None: none), and the factor it multiplies query . key by when the module
    keeps its own (``scaling``: 1.0 in T5, whose initialization folds it into the query; None:
    the usual 1 / sqrt(head_dim))."""

    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    query_norm: nn.Module | None = None
    key_norm: nn.Module | None = None
    scaling: float | None = None

    @property
    def query_out(self) -> nn.Module:
        """The module whose output is the query the logits are taken with."""
        return self.query if self.query_norm is None else self.query_norm

    @property
    def key_out(self) -> nn.Module:
        """The module whose output is the key the logits are taken with."""
        return self.key if self.key_norm is None else self.key_norm


def _named(children: Mapping[str, nn.Module], names: Sequence[str]) -> nn.Module | None:
    return next((children[n] for n in names if n in children), None)


def _own_scaling(module: nn.Module) -> float | None:
    scaling = getattr(module, "scaling", None)
    if isinstance(scaling, (int, float)) and not isinstance(scaling, bool):
        return float(scaling)
    return None


def attentions(model: nn.Module) -> list[Attention]:
    """Each attention of ``model``, in layer order (one walk over its modules)."""
    found = []
    for module in model.modules():
        children = dict(module.named_children())
        for names in _QKV_NAMES:
            q, k, v = (children.get(n) for n in names)
            if isinstance(q, nn.Linear) and isinstance(k, nn.Linear) and isinstance(v, nn.Linear):
                query_norm = _named(children, _QUERY_NORM_NAMES)
                key_norm = _named(children, _KEY_NORM_NAMES)
                found.append(Attention(q, k, v, query_norm, key_norm, _own_scaling(module)))
                break
    return found


def head_dim(model: nn.Module) -> int | None:
    """The attention head size of ``model``'s config (:func:`layout_rules.head_dim`), None
    without a config."""
    config = getattr(model, "config", None)
    return None if config is None else layout_rules.head_dim(config)


def seeded_row(
    vocab_size: int, start_ids: Sequence[int] = (), seed: int = 0
) -> dict[str, torch.Tensor]:
    """One row of ROW_LENGTH seeded ordinary ids (the first the start token when one is given),
    all real: what ``sharpen`` measures a stand-in on when it has no sentences."""
    gen = torch.Generator().manual_seed(seed)
    low = ORDINARY_FROM if vocab_size > 2 * ORDINARY_FROM else 0
    ids = torch.randint(low, vocab_size, (1, ROW_LENGTH), generator=gen)
    if start_ids and 0 <= start_ids[0] < vocab_size:
        ids[0, 0] = start_ids[0]
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def logit_spread(model: nn.Module, inputs: Mapping[str, torch.Tensor]) -> list[float]:
    """Per attention, in layer order: the standard deviation of its content logits (query . key
    times the attention's scaling, after its per-head norms, before any rotary turn or
    position bias, each minus its row's mean over the real keys) over every real query, real
    key other than the first (the start token: its sink logit is drawn apart) and head, on
    ``inputs``. Empty when the attentions cannot be found."""
    found, dim = attentions(model), head_dim(model)
    if not found or dim is None:
        return []
    seen: dict[int, torch.Tensor] = {}
    watched = {id(m): m for a in found for m in (a.query_out, a.key_out)}
    handles = [
        m.register_forward_hook(lambda m, _a, out: seen.__setitem__(id(m), out))
        for m in watched.values()
    ]
    training = model.training  # a model built from its config is in training mode: dropout
    model.eval()
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        model.train(training)
        for h in handles:
            h.remove()
    real = inputs["attention_mask"].bool()
    keys = real.clone()
    keys[:, 0] = False
    spreads = []
    for attention in found:
        qo, ko = seen.get(id(attention.query_out)), seen.get(id(attention.key_out))
        if qo is None or ko is None:
            continue
        scaling = attention.scaling if attention.scaling is not None else 1 / math.sqrt(dim)
        # [batch, heads, seq, dim]; grouped keys repeated over their queries' heads (a per-head
        # norm's output may already be [batch, seq, heads, dim]: the reshape takes either)
        qs, ks = (t.reshape(t.shape[0], t.shape[1], -1, dim).transpose(1, 2) for t in (qo, ko))
        ks = ks.repeat_interleave(qs.shape[1] // ks.shape[1], dim=1)
        scores = (qs @ ks.transpose(-1, -2)).double() * scaling
        kk = keys[:, None, None, :]
        mean = scores.masked_fill(~kk, 0).sum(-1, keepdim=True) / kk.sum(-1, keepdim=True)
        pairs = (real[:, None, :, None] & kk).expand_as(scores)
        spreads.append(float((scores - mean)[pairs].std()))
    return spreads


def spread_of_layers(spreads: Sequence[float]) -> tuple[float, float]:
    """(the first attention's spread, the median of the later ones'); (0.0, 0.0) when none."""
    if not spreads:
        return 0.0, 0.0
    later = statistics.median(spreads[1:]) if len(spreads) > 1 else spreads[0]
    return spreads[0], later


@dataclass(frozen=True)
class Sharpened:
    """What ``sharpen`` did: each attention's spread before and after (empty: not drawn), and
    why not when it could not."""

    before: tuple[float, ...]
    after: tuple[float, ...]
    skipped: str | None = None

    def describe(self) -> str:
        if self.skipped is not None:
            return f"attention logits not sharpened ({self.skipped})"
        after = ", ".join(f"{s:.2f}" for s in self.after)
        return f"attention logits sharpened to a trained spread (std {after} by layer)"


def _scale_query(attention: Attention, factor: float) -> None:
    """Multiply an attention's query by ``factor``: its per-head norm's scale when it has one (a
    norm after the projection would undo scaling the projection), else the projection's weight
    (its bias, which carries the drawn attention sink, stays)."""
    norm = attention.query_norm
    weight = getattr(norm, "weight", None) if norm is not None else None
    with torch.no_grad():
        if isinstance(weight, nn.Parameter):
            weight.mul_(factor)
        else:
            attention.query.weight.mul_(factor)


def sharpen(
    model: nn.Module, first: float, later: float, inputs: Mapping[str, torch.Tensor]
) -> Sharpened:
    """Scale each attention's query so its content logits spread as a trained model's do: the
    first attention to ``first``, the others to ``later`` (``logit_spread`` on ``inputs``),
    measuring again after each round. A model whose attentions cannot be found or run is left
    as it is, and the result says why."""
    if first <= 0 or later <= 0:
        return Sharpened((), (), "no spread to draw")
    if any(p.is_meta for p in model.parameters()):
        return Sharpened((), (), "a model without weights")
    found = attentions(model)
    try:
        before = spreads = logit_spread(model, inputs)
    except (RuntimeError, ValueError, TypeError, IndexError, KeyError) as exc:
        return Sharpened((), (), f"its forward did not run on the seeded row: {type(exc).__name__}")
    if not spreads or len(spreads) != len(found):
        return Sharpened((), (), "no attention projections found")
    targets = [first] + [later] * (len(found) - 1)
    for _ in range(SHARPEN_ROUNDS):
        if all(abs(s / t - 1) <= SPREAD_TOLERANCE for s, t in zip(spreads, targets, strict=True)):
            break
        for attention, spread, target in zip(found, spreads, targets, strict=True):
            if spread > 0:
                _scale_query(attention, target / spread)
        spreads = logit_spread(model, inputs)
    return Sharpened(tuple(before), tuple(spreads))
