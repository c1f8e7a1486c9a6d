"""The cheapest instance of a structural signature. Models that share a signature share a
lowering verdict (docs/design.md, "Structural signature"), so a structural sweep may judge a signature
on *any* config that has it. The model_type defaults of decoder families are 4096 wide (a
2-layer Qwen3 stand-in is 700M parameters and takes minutes on a CPU); ``narrowed`` keeps
head_dim, the alignment of hidden and intermediate sizes modulo the stick, grouped-query
attention, rope, norms, activations and every other signature field, and cuts the number of
heads (hence hidden_size) and the intermediate size. The narrowed config is used only when
its lowering class (the signature without the sizes, ``lowering_signature``) is verifiably the
same; otherwise the real width is judged. The unit keeps its own full signature and row."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hfadapt.loading.structural import ALIGNMENT, config_from_dict, lowering_signature

__all__ = ["NARROW_ABOVE", "Narrowed", "narrowed"]

# Narrow only configs costing more than this many multiply-adds per token (2 truncated layers):
# four BERT-base layers. Smaller models run in seconds as they are.
NARROW_ABOVE = 4 * (768 * (4 * 768 + 3 * 3072))

_HIDDEN = ("hidden_size", "d_model", "dim", "n_embd", "emb_dim")
_HEADS = ("num_attention_heads", "num_heads", "n_heads", "n_head")
_KV_HEADS = ("num_key_value_heads",)
_HEAD_DIM = ("head_dim", "d_kv", "attention_head_size")
_INTER = ("intermediate_size", "hidden_dim", "ffn_dim", "d_ff", "n_inner", "mlp_dim")


@dataclass
class Narrowed:
    """A narrower config of the same lowering class (hfadapt.loading.signature.lowering_signature:
    the signature without its sizes, their alignment kept), and what changed (field -> (old, new))."""

    config: dict[str, Any]
    changes: dict[str, tuple[int, int]]
    signature: str

    def describe(self) -> str:
        parts = ", ".join(f"{k} {a}->{b}" for k, a, b in ((k, *v) for k, v in self.changes.items()))
        return f"judged on a narrowed instance of the signature ({parts})"


def _find(data: dict[str, object], names: tuple[str, ...]) -> tuple[str, int] | None:
    for name in names:
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def _aligned(residue: int, at_least: int, divisor: int = 1) -> int:
    """The smallest value >= at_least that is congruent to ``residue`` modulo the stick size
    and divisible by ``divisor``."""
    value = max(residue, 1)
    while value < at_least or value % ALIGNMENT != residue or value % divisor:
        value += 1
    return value


def narrowed(
    raw: dict[str, object], *, layers: int = 2, above: float = NARROW_ABOVE
) -> Narrowed | None:
    """A narrower config dict with the same structural signature as ``raw``, or None when
    ``raw`` is cheap already, is composite (``text_config``), or cannot be narrowed safely."""
    if not isinstance(raw.get("model_type"), str) or "text_config" in raw:
        return None
    try:
        config = config_from_dict(raw)
        data = config.to_dict()
    except Exception:
        return None
    if any(isinstance(v, dict) and "hidden_size" in v for v in data.values()):
        return None  # a composite config the signature does not look inside
    hidden, heads = _find(data, _HIDDEN), _find(data, _HEADS)
    if hidden is None or heads is None:
        return None
    inter = _find(data, _INTER)
    depth = min(int(data.get("num_hidden_layers") or layers), layers)
    width = inter[1] if inter else 4 * hidden[1]
    if depth * hidden[1] * (4 * hidden[1] + 3 * width) <= above:
        return None
    explicit = _find(data, _HEAD_DIM)
    head_dim = explicit[1] if explicit else hidden[1] // heads[1]
    if not head_dim:
        return None
    kv = _find(data, _KV_HEADS)
    gqa = kv is not None and kv[1] != heads[1]
    group = heads[1] // kv[1] if kv is not None and gqa else 1
    if gqa and heads[1] % group:
        return None
    residue = hidden[1] % ALIGNMENT
    choice: tuple[int, int] | None = None
    # The fewest heads (whole groups under grouped-query attention) that keep the residue.
    for h in range(group if gqa else min(heads[1], 2), heads[1] + 1, group):
        if explicit:  # hidden_size is free of heads * head_dim: any aligned value will do
            choice = (h, _aligned(residue, h * head_dim))
            break
        if (h * head_dim) % ALIGNMENT == residue:
            choice = (h, h * head_dim)
            break
    if choice is None:
        return None
    new_heads, new_hidden = choice
    new_kv = new_heads // group if gqa else new_heads
    if new_hidden >= hidden[1]:
        return None
    out = dict(raw)
    changes: dict[str, tuple[int, int]] = {}

    def put(name: str, old: int, new: int) -> None:
        out[name] = new
        if new != old:
            changes[name] = (old, new)

    put(hidden[0], hidden[1], new_hidden)
    put(heads[0], heads[1], new_heads)
    if kv is not None:
        put(kv[0], kv[1], new_kv)
    if explicit:
        put(explicit[0], explicit[1], head_dim)
    if inter:
        put(inter[0], inter[1], _aligned(inter[1] % ALIGNMENT, 2 * new_hidden))
    signature = lowering_signature(raw)
    try:
        same = lowering_signature(out) == signature
    except Exception:
        return None
    return Narrowed(out, changes, signature) if same else None
