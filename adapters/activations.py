"""Activations the device cannot lower as written.

- gelu_new / gelu_accurate / gelu_python_tanh compute ``torch.pow(x, 3.0)``: the device lowers
  only ``pow(x, 2)`` (rule op.pow.square), so the cube is written ``x*x*x`` (hf-adapters' rewrite).
- gelu_pytorch_tanh calls ``aten::gelu(approximate="tanh")``, compiled-only on the device (rule
  op.gelu): it is written out as the same tanh formula from native ops.
- exact gelu (erf) is compiled-only too and erf is not a device op: in eager mode it is computed
  on the host, explicitly, and the result moved back; compiled mode keeps the native gelu.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from hfadapt.adapters.api import adapter, on_host

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _tanh_gelu(x: Tensor, k: float = _SQRT_2_OVER_PI) -> Tensor:
    return 0.5 * x * (1.0 + torch.tanh(k * (x + 0.044715 * (x * x * x))))


def _example(cls_name: str, **kwargs: object):
    def make(seed: int):
        from transformers import activations

        g = torch.Generator().manual_seed(seed)
        x = torch.randn(3, 7, 65, generator=g, dtype=torch.float64) * 4
        return getattr(activations, cls_name)(**kwargs), (x,), {}

    return make


@adapter(
    name="gelu-new-cube",
    target="transformers.activations:NewGELUActivation.forward",
    rule="op.pow.square",
    example=_example("NewGELUActivation"),
)
def gelu_new(self, input: Tensor) -> Tensor:
    """gelu_new with the cube written as x*x*x (pow(x, 3.0) does not lower)."""
    return _tanh_gelu(input)


@adapter(
    name="gelu-accurate-cube",
    target="transformers.activations:AccurateGELUActivation.forward",
    rule="op.pow.square",
    example=_example("AccurateGELUActivation"),
)
def gelu_accurate(self, input: Tensor) -> Tensor:
    """gelu_accurate with the cube written as x*x*x."""
    return _tanh_gelu(input, float(self.precomputed_constant))


@adapter(
    name="gelu-tanh-explicit",
    target="transformers.activations:GELUTanh.forward",
    rule="op.gelu",
    example=_example("GELUTanh"),
)
def gelu_tanh(self, input: Tensor) -> Tensor:
    """gelu(approximate='tanh') written out from native ops (tanh, mul, add)."""
    return _tanh_gelu(input)


@adapter(
    name="gelu-exact-host",
    target="transformers.activations:GELUActivation.forward",
    rule="op.gelu",
    example=_example("GELUActivation"),
)
def gelu_exact(self, input: Tensor) -> Tensor:
    """Exact (erf) gelu: native only when compiled; in eager mode it runs on the host."""
    if input.device.type == "spyre":
        return on_host(self.act, input, back_to=input.device)
    return self.act(input)
