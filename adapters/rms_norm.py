"""RMSNorm with the square written as ``x*x`` and its mean as a prescaled sum, and
torch.nn.RMSNorm on contiguous input.

The stock RMSNorms upcast to fp32 and call ``pow(2)``: pow is not among the ops the device
runs in fp32 (rule dtype.fp32.ops). hf-adapters' card path, ``(x*x).mean()`` in fp16, lowers but
carries the card's reduced-precision mean (1.7-5% mean relative error on hidden 1024-4096:
numerics.reduced_precision_mean); an fp32 island is wrong on the card as well (an fp32
``mean(-1)`` past 32 rows, torch-spyre#3804; an eager fp32 -> fp16 cast, torch-spyre#2314). fp16
``sum`` is right (torch-spyre#2400), so the variance here is ``sum((x / sqrt(n))^2)``, in the
model dtype: the same function in real arithmetic, no cast, a square that cannot overflow where
the mean itself fits (docs/device-profile.md, "Rewrites").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hfadapt.adapters.api import adapter


def _example(module_path: str, cls_name: str, zero_centered: bool = False):
    def make(seed: int):
        import importlib

        cls = getattr(importlib.import_module(module_path), cls_name)
        g = torch.Generator().manual_seed(seed)
        norm = cls(64, eps=1e-6).to(torch.float64)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(64, generator=g, dtype=torch.float64))
        x = torch.randn(2, 9, 64, generator=g, dtype=torch.float64) * 5
        return norm, (x,), {}

    return make


def _guarded_rsqrt(var: Tensor, eps: float) -> Tensor:
    """rsqrt(var + eps), 0 where var is 0 (then x is 0: the stock product, 0). An eps below
    DL16's smallest normal (4.7e-10) flushes on the card, and rsqrt(0) would be the NaN code."""
    return torch.where(var > 0, torch.rsqrt(var + eps), torch.zeros_like(var))


def _rms(x: Tensor, eps: float) -> Tensor:
    """x * rsqrt(mean(x^2) + eps), the mean a sum of prescaled squares."""
    scaled = x * (1.0 / math.sqrt(x.shape[-1]))
    return x * _guarded_rsqrt((scaled * scaled).sum(-1, keepdim=True), eps)


@adapter(
    name="rms-norm-square-qwen3",
    target="transformers.models.qwen3.modeling_qwen3:Qwen3RMSNorm.forward",
    rule="dtype.fp32.ops",
    example=_example("transformers.models.qwen3.modeling_qwen3", "Qwen3RMSNorm"),
)
def qwen3_rms_norm(self, hidden_states: Tensor) -> Tensor:
    """weight * (x * rsqrt(mean(x*x) + eps)), in the model dtype (see the module doc)."""
    return self.weight * _rms(hidden_states, self.variance_epsilon)


@adapter(
    name="rms-norm-square-t5",
    target="transformers.models.t5.modeling_t5:T5LayerNorm.forward",
    rule="dtype.fp32.ops",
    example=_example("transformers.models.t5.modeling_t5", "T5LayerNorm"),
)
def t5_layer_norm(self, hidden_states: Tensor) -> Tensor:
    """T5's scale-only RMS norm, the variance a prescaled sum in the model dtype."""
    return self.weight * _rms(hidden_states, self.variance_epsilon)


# The same two forms in the other decoder families that embedding models build on.
_LLAMA_STYLE = {
    "qwen2": "transformers.models.qwen2.modeling_qwen2:Qwen2RMSNorm",
    "mistral": "transformers.models.mistral.modeling_mistral:MistralRMSNorm",
    "llama": "transformers.models.llama.modeling_llama:LlamaRMSNorm",
    # the text tower of Qwen3-VL embedders (hfadapt.loading.translate.text_tower)
    "qwen3-vl": "transformers.models.qwen3_vl.modeling_qwen3_vl:Qwen3VLTextRMSNorm",
}


def _register_llama_style(family: str, target: str) -> None:
    module_path, cls_name = target.split(":")

    @adapter(
        name=f"rms-norm-square-{family}",
        target=f"{target}.forward",
        rule="dtype.fp32.ops",
        example=_example(module_path, cls_name),
    )
    def llama_style_rms_norm(self, hidden_states: Tensor) -> Tensor:
        """weight * (x * rsqrt(mean(x*x) + eps)), in the model dtype."""
        return self.weight * _rms(hidden_states, self.variance_epsilon)


for _family, _target in _LLAMA_STYLE.items():
    _register_llama_style(_family, _target)


def _register_gemma_style(family: str, module_path: str, cls_name: str) -> None:
    @adapter(
        name=f"rms-norm-square-{family}",
        target=f"{module_path}:{cls_name}.forward",
        rule="dtype.fp32.ops",
        example=_example(module_path, cls_name),
    )
    def gemma_style_rms_norm(self, x: Tensor) -> Tensor:
        """Gemma's (1 + weight) RMSNorm in the model dtype, the variance a prescaled sum."""
        return _rms(x, self.eps) * (1.0 + self.weight)


_register_gemma_style("gemma3", "transformers.models.gemma3.modeling_gemma3", "Gemma3RMSNorm")
_register_gemma_style("gemma2", "transformers.models.gemma2.modeling_gemma2", "Gemma2RMSNorm")


def _example_heads(seed: int):
    """torch.nn.RMSNorm over head_dim of a [B, H, S, D] view (torch-spyre#1781's shape)."""
    g = torch.Generator().manual_seed(seed)
    norm = torch.nn.RMSNorm(64, eps=1e-6).to(torch.float64)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64, generator=g, dtype=torch.float64))
    x = torch.randn(2, 64, 2, 64, generator=g, dtype=torch.float64).transpose(1, 2) * 3
    return norm, (x,), {}


@adapter(
    name="rms-norm-contiguous",
    target="torch.nn.modules.normalization:RMSNorm.forward",
    rule="defect.rms_norm_noncontiguous",
    example=_example_heads,
)
def contiguous_rms_norm(self, x: Tensor) -> Tensor:
    """torch.nn.RMSNorm on ``x.contiguous()`` with its variance as a prescaled sum: the card's
    native RMSNorm misreads a non-contiguous view (torch-spyre#1781) and carries the
    reduced-precision mean (numerics.reduced_precision_mean)."""
    x = x.contiguous()
    dims = tuple(range(-len(self.normalized_shape), 0))
    n = math.prod(self.normalized_shape)
    eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
    scaled = x * (1.0 / math.sqrt(n))
    y = x * _guarded_rsqrt((scaled * scaled).sum(dim=dims, keepdim=True), eps)
    return y * self.weight if self.weight is not None else y
