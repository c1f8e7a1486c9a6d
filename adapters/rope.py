"""Rotary position embeddings the device can lower (SPYRE.md §5).

- cos/sin: the rotary module casts integer positions to fp32 on the device (a cast it refuses,
  rule dtype.cast) and calls sin/cos (host fallbacks). The stock rotary forward runs on the host
  instead, and its cos/sin are sent over: the same numbers, computed where they were anyway.
- rotate_half slices the head dimension at head_dim/2, an offset into the stick dimension
  ("stick expression with offset", rule layout.stick_slice). It is the linear map
  x -> cat(-x2, x1), so it is written as ``x @ R`` with R a fixed 0/+-1 matrix: each output is
  one input times +-1 plus exact zeros (in fp32, which the device cannot matmul, the halves are
  taken along a new non-stick axis instead). The attention forward runs as stock code with
  ``apply_rotary_pos_emb`` seeing this ``rotate_half``.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import torch
from torch import Tensor

from hfadapt.adapters.api import adapter
from hfadapt.adapters.rebind import rebind, stock_method

_PROV = {"origin": "hand-written", "author": "hfadapt", "date": "2026-11-30"}
FAMILIES = {
    "qwen3": ("transformers.models.qwen3.modeling_qwen3", "Qwen3"),
    "gemma3": ("transformers.models.gemma3.modeling_gemma3", "Gemma3"),
    "modernbert": ("transformers.models.modernbert.modeling_modernbert", "ModernBert"),
    "nomic-bert": ("transformers.models.nomic_bert.modeling_nomic_bert", "NomicBert"),
    "qwen2": ("transformers.models.qwen2.modeling_qwen2", "Qwen2"),
    "mistral": ("transformers.models.mistral.modeling_mistral", "Mistral"),
    "llama": ("transformers.models.llama.modeling_llama", "Llama"),
}
MODEL_TYPES = {
    "Qwen3": "qwen3",
    "Gemma3": "gemma3_text",
    "ModernBert": "modernbert",
    "NomicBert": "nomic_bert",
    "Qwen2": "qwen2",
    "Mistral": "mistral",
    "Llama": "llama",
}
_ROTATIONS: dict[tuple[int, torch.dtype, str], Tensor] = {}


def rotation_matrix(dim: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """R with x @ R == rotate_half(x) == cat(-x[..., d/2:], x[..., :d/2]). Built on the host
    once per (size, dtype, device); a compiled graph then sees it as a constant."""
    found = _ROTATIONS.get((dim, dtype, str(device)))
    return found if found is not None else _build_rotation(dim, dtype, device)


@torch.compiler.disable
def _build_rotation(dim: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    half = dim // 2
    r = torch.zeros(dim, dim, dtype=dtype)
    idx = torch.arange(half)
    r[idx + half, idx] = -1
    r[idx, idx + half] = 1
    found = _ROTATIONS[(dim, dtype, str(device))] = r.to(device)
    return found


def rotate_half_matmul(x: Tensor) -> Tensor:
    """rotate_half without slicing the stick dimension. fp16/bf16: ``x @ R`` (hf-adapters'
    rewrite). fp32 (ModernBERT rotates in fp32, and the device has no fp32 matmul): the halves
    are selected along a new second-to-last axis, negated and concatenated back."""
    if x.dtype == torch.float32:
        halves = x.unflatten(-1, (2, x.shape[-1] // 2))
        x1, x2 = halves.select(-2, 0), halves.select(-2, 1)
        return torch.cat((-x2, x1), dim=-1)
    return torch.matmul(x, rotation_matrix(x.shape[-1], x.dtype, x.device))


@torch.compiler.disable
def _rope_on_host(
    module: torch.nn.Module, x: Tensor, position_ids: Tensor, *args: Any, **kwargs: Any
) -> Any:
    host = copy.copy(module)
    host._buffers = {
        k: (v.cpu().float() if v is not None and v.is_floating_point() else v)
        for k, v in module._buffers.items()
    }
    stub = torch.empty(0, dtype=x.dtype)
    out = stock_method(type(module), "forward")(host, stub, position_ids.cpu(), *args, **kwargs)
    return tuple(t.to(x.device) for t in out)


def _rotary_example(module_path: str, prefix: str):
    def make(seed: int):
        import importlib

        from transformers import AutoConfig

        mod = importlib.import_module(module_path)
        model_type = MODEL_TYPES[prefix]
        cfg = AutoConfig.for_model(model_type, hidden_size=256, num_attention_heads=2, head_dim=128)
        rope = getattr(mod, f"{prefix}RotaryEmbedding")(cfg).double()
        x = torch.randn(2, 64, 256, dtype=torch.float64)
        pos = torch.arange(64)[None].expand(2, -1) + seed
        extra = (
            {"layer_type": cfg.layer_types[0]}
            if getattr(cfg, "layer_types", None) and prefix in ("Gemma3", "ModernBert")
            else {}
        )
        return rope, (x, pos), extra

    return make


def _attention_example(module_path: str, prefix: str):
    def make(seed: int):
        import importlib

        from transformers import AutoConfig

        mod = importlib.import_module(module_path)
        model_type = MODEL_TYPES[prefix]
        cfg = AutoConfig.for_model(
            model_type,
            hidden_size=256,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=128,
            attn_implementation="sdpa",
            attention_dropout=0.0,
        )
        cls = getattr(mod, f"{prefix}Attention")
        try:
            attn = cls(cfg, layer_idx=0)
        except TypeError:
            attn = cls(cfg)
        torch.manual_seed(seed)
        rope = getattr(mod, f"{prefix}RotaryEmbedding")(cfg)
        x = torch.randn(2, 64, 256)
        extra = (
            {"layer_type": cfg.layer_types[0]}
            if getattr(cfg, "layer_types", None) and prefix in ("Gemma3", "ModernBert")
            else {}
        )
        cos, sin = rope(x, torch.arange(64)[None].expand(2, -1), **extra)
        return (
            attn.double().eval(),
            (),
            {
                "hidden_states": x.double(),
                "position_embeddings": (cos.double(), sin.double()),
                "attention_mask": None,
            },
        )

    return make


def _register(family: str, module_path: str, prefix: str) -> None:
    @adapter(
        name=f"rope-host-{family}",
        target=f"{module_path}:{prefix}RotaryEmbedding.forward",
        rule="dtype.cast",
        example=_rotary_example(module_path, prefix),
        provenance=_PROV,
    )
    def rotary_on_host(
        self: torch.nn.Module, x: Tensor, position_ids: Tensor, *args: Any, **kwargs: Any
    ) -> Any:
        """The stock rotary forward (positions -> cos, sin) on the host."""
        return _rope_on_host(self, x, position_ids, *args, **kwargs)

    @adapter(
        name=f"rope-rotate-matmul-{family}",
        target=f"{module_path}:{prefix}Attention.forward",
        rule="layout.stick_slice",
        example=_attention_example(module_path, prefix),
        provenance=_PROV,
    )
    def attention_rotate_matmul(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        """The stock attention forward, its rotary step using rotate_half as a matmul."""
        home = sys.modules[type(self).__module__]
        apply = rebind(home.apply_rotary_pos_emb, rotate_half=rotate_half_matmul)
        forward = rebind(stock_method(type(self), "forward"), apply_rotary_pos_emb=apply)
        return forward(self, *args, **kwargs)


for _family, (_path, _prefix) in FAMILIES.items():
    _register(_family, _path, _prefix)
