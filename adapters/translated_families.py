"""Adapters for the native classes remote-code models are translated to (hfadapt.judge.translate):
GTE (Alibaba ``new``), jina-embeddings-v3 and EuroBERT. The same rewrites as ``rope.py`` and
``rms_norm.py`` make for the decoder families (SPYRE.md §5), written out here for these classes:

- cos/sin on the host: the rotary module casts integer positions to fp32 (rule dtype.cast) and
  calls sin/cos; the stock rotary forward runs on the host and its cos/sin are sent over.
- rotate_half as ``x @ R``: slicing the head dimension at head_dim/2 is an offset into the stick
  dimension (rule layout.stick_slice); R is a fixed 0/+-1 matrix, so each output is one input
  times +-1 plus exact zeros. The stock attention forward runs with this ``rotate_half``.
- EuroBERT's RMSNorm squares with ``pow(2)`` in fp32 (rule dtype.fp32.ops): ``x*x`` instead.

(nomic_bert's rope already has adapters in rope.py.)
"""

from __future__ import annotations

import copy
import importlib
import sys
from typing import Any

import torch
from torch import Tensor

from hfadapt.adapters.api import adapter
from hfadapt.adapters.rebind import rebind, stock_method

_PROV = {"origin": "hand-written", "author": "hfadapt", "date": "2026-12-01"}
# family -> (module, class prefix, model_type)
FAMILIES = {
    "gte": ("transformers.models.gte.modeling_gte", "Gte", "gte"),
    "jina-v3": (
        "transformers.models.jina_embeddings_v3.modeling_jina_embeddings_v3",
        "JinaEmbeddingsV3",
        "jina_embeddings_v3",
    ),
    "eurobert": ("transformers.models.eurobert.modeling_eurobert", "EuroBert", "eurobert"),
}
_ROTATIONS: dict[tuple[int, torch.dtype, str], Tensor] = {}


@torch.compiler.disable
def _rotation(dim: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """R with x @ R == cat(-x[..., d/2:], x[..., :d/2]), built on the host once per key."""
    key = (dim, dtype, str(device))
    if key not in _ROTATIONS:
        half = dim // 2
        r = torch.zeros(dim, dim, dtype=dtype)
        idx = torch.arange(half)
        r[idx + half, idx] = -1
        r[idx, idx + half] = 1
        _ROTATIONS[key] = r.to(device)
    return _ROTATIONS[key]


def rotate_half_matmul(x: Tensor) -> Tensor:
    """rotate_half without slicing the stick dimension (fp32: along a new non-stick axis)."""
    if x.dtype == torch.float32:
        halves = x.unflatten(-1, (2, x.shape[-1] // 2))
        return torch.cat((-halves.select(-2, 1), halves.select(-2, 0)), dim=-1)
    return torch.matmul(x, _rotation(x.shape[-1], x.dtype, x.device))


@torch.compiler.disable
def _rope_on_host(module: torch.nn.Module, x: Tensor, position_ids: Tensor, *args: Any) -> Any:
    host = copy.copy(module)
    host._buffers = {
        k: (v.cpu().float() if v is not None and v.is_floating_point() else v)
        for k, v in module._buffers.items()
    }
    stub = torch.empty(0, dtype=x.dtype)
    out = stock_method(type(module), "forward")(host, stub, position_ids.cpu(), *args)
    return tuple(t.to(x.device) for t in out)


def _config(model_type: str) -> Any:
    from transformers import AutoConfig

    return AutoConfig.for_model(
        model_type, hidden_size=256, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=512, head_dim=128, attention_dropout=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="sdpa",
    )  # fmt: skip


def _rotary_example(module_path: str, prefix: str, model_type: str):  # type: ignore[no-untyped-def]
    def make(seed: int):  # type: ignore[no-untyped-def]
        mod = importlib.import_module(module_path)
        rope = getattr(mod, f"{prefix}RotaryEmbedding")(_config(model_type)).double()
        x = torch.randn(2, 64, 256, dtype=torch.float64)
        pos = torch.arange(64)[None].expand(2, -1) + seed
        return rope, (x, pos), {}

    return make


def _attention_example(module_path: str, prefix: str, model_type: str):  # type: ignore[no-untyped-def]
    def make(seed: int):  # type: ignore[no-untyped-def]
        mod = importlib.import_module(module_path)
        cfg = _config(model_type)
        cls = getattr(mod, f"{prefix}Attention")
        try:
            attn = cls(cfg, layer_idx=0)
        except TypeError:
            attn = cls(cfg)
        torch.manual_seed(seed)
        rope = getattr(mod, f"{prefix}RotaryEmbedding")(cfg)
        x = torch.randn(2, 64, 256)
        cos, sin = rope(x, torch.arange(64)[None].expand(2, -1))
        kwargs = {
            "hidden_states": x.double(),
            "position_embeddings": (cos.double(), sin.double()),
            "attention_mask": None,
        }
        return attn.double().eval(), (), kwargs

    return make


def _register(family: str, module_path: str, prefix: str, model_type: str) -> None:
    @adapter(
        name=f"rope-host-{family}",
        target=f"{module_path}:{prefix}RotaryEmbedding.forward",
        rule="dtype.cast",
        example=_rotary_example(module_path, prefix, model_type),
        provenance=_PROV,
    )
    def rotary_on_host(self: torch.nn.Module, x: Tensor, position_ids: Tensor, *args: Any) -> Any:
        """The stock rotary forward (positions -> cos, sin) on the host."""
        return _rope_on_host(self, x, position_ids, *args)

    @adapter(
        name=f"rope-rotate-matmul-{family}",
        target=f"{module_path}:{prefix}Attention.forward",
        rule="layout.stick_slice",
        example=_attention_example(module_path, prefix, model_type),
        provenance=_PROV,
    )
    def attention_rotate_matmul(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        """The stock attention forward, its rotary step using rotate_half as a matmul."""
        home = sys.modules[type(self).__module__]
        apply = rebind(home.apply_rotary_pos_emb, rotate_half=rotate_half_matmul)
        forward = rebind(stock_method(type(self), "forward"), apply_rotary_pos_emb=apply)
        return forward(self, *args, **kwargs)


for _family, (_path, _prefix, _type) in FAMILIES.items():
    _register(_family, _path, _prefix, _type)


def _rms_example(seed: int):  # type: ignore[no-untyped-def]
    from transformers.models.eurobert.modeling_eurobert import EuroBertRMSNorm

    g = torch.Generator().manual_seed(seed)
    norm = EuroBertRMSNorm(64, eps=1e-5).to(torch.float64)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=g, dtype=torch.float64))
    return norm, (torch.randn(2, 9, 64, generator=g, dtype=torch.float64) * 5,), {}


@adapter(
    name="rms-norm-square-eurobert",
    target="transformers.models.eurobert.modeling_eurobert:EuroBertRMSNorm.forward",
    rule="dtype.fp32.ops",
    example=_rms_example,
    provenance=_PROV,
)
def eurobert_rms_norm(self: torch.nn.Module, hidden_states: Tensor) -> Tensor:
    """weight * (x * rsqrt(mean(x*x) + eps)), statistics in fp32."""
    input_dtype = hidden_states.dtype
    x = hidden_states.to(torch.float32)
    x = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.variance_epsilon)
    return self.weight * x.to(input_dtype)
