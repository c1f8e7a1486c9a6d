"""RMSNorm with the square written as ``x*x``, and torch.nn.RMSNorm on contiguous input.

The stock RMSNorms upcast to fp32 and call ``pow(2)``: pow is not among the ops the device
runs in fp32 (rule dtype.fp32.ops). ``(x*x).mean()`` is the same function
(docs/device-profile.md, "Rewrites").
"""

from __future__ import annotations

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


def _rms(x: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)


@adapter(
    name="rms-norm-square-qwen3",
    target="transformers.models.qwen3.modeling_qwen3:Qwen3RMSNorm.forward",
    rule="dtype.fp32.ops",
    example=_example("transformers.models.qwen3.modeling_qwen3", "Qwen3RMSNorm"),
)
def qwen3_rms_norm(self, hidden_states: Tensor) -> Tensor:
    """weight * (x * rsqrt(mean(x*x) + eps)), statistics in fp32."""
    input_dtype = hidden_states.dtype
    x = _rms(hidden_states.to(torch.float32), self.variance_epsilon)
    return self.weight * x.to(input_dtype)


@adapter(
    name="rms-norm-square-t5",
    target="transformers.models.t5.modeling_t5:T5LayerNorm.forward",
    rule="dtype.fp32.ops",
    example=_example("transformers.models.t5.modeling_t5", "T5LayerNorm"),
)
def t5_layer_norm(self, hidden_states: Tensor) -> Tensor:
    """T5's scale-only RMS norm with the variance as mean(x*x) in fp32."""
    x32 = hidden_states.to(torch.float32)
    variance = (x32 * x32).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    if self.weight.dtype in (torch.float16, torch.bfloat16):
        hidden_states = hidden_states.to(self.weight.dtype)
    return self.weight * hidden_states


# The same two forms in the other decoder families that embedding models build on.
_LLAMA_STYLE = {
    "qwen2": "transformers.models.qwen2.modeling_qwen2:Qwen2RMSNorm",
    "mistral": "transformers.models.mistral.modeling_mistral:MistralRMSNorm",
    "llama": "transformers.models.llama.modeling_llama:LlamaRMSNorm",
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
        """weight * (x * rsqrt(mean(x*x) + eps)), statistics in fp32."""
        input_dtype = hidden_states.dtype
        x = _rms(hidden_states.to(torch.float32), self.variance_epsilon)
        return self.weight * x.to(input_dtype)


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
        """Gemma's (1 + weight) RMSNorm, statistics in fp32, square as x*x."""
        output = _rms(x.float(), self.eps)
        output = output * (1.0 + self.weight.float())
        return output.type_as(x)


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
    """torch.nn.RMSNorm on ``x.contiguous()``: the card's native RMSNorm misreads a
    non-contiguous view (torch-spyre#1781); on a contiguous input it is the same call."""
    return torch.nn.functional.rms_norm(
        x.contiguous(), self.normalized_shape, self.weight, self.eps
    )
