"""Device numerics that are not "compute in fp32, round the output to DL16": kernels for the
ops whose intermediate results the device keeps in DL16. Shared by the eager device and the
compile backend.

A kernel takes the op's positional args and kwargs with tensors given as float32 CPU tensors
that hold DL16 values, plus the DL16 format, and returns what the ATen op returns (float32,
rounded to DL16)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

import torch

from hfadapt.spyre.dl16 import DL16Format, round_dl16_
from hfadapt.spyre.profile import Profile

Kernel = Callable[[Sequence[Any], dict[str, Any], DL16Format], Any]


def _arg(args: Sequence[Any], kwargs: dict[str, Any], i: int, name: str, default: Any) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


def _layer_norm_dl16(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    fmt: DL16Format,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # The fused kernel keeps its statistics in DL16 and takes the variance as E[x^2] - E[x]^2:
    # with a large mean both terms are huge and 10 significant bits cancel to noise (or to a
    # negative variance and NaN), which is what hf-adapters saw and unfused.
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    mean = round_dl16_(x.mean(dims, keepdim=True), fmt)
    mean_sq = round_dl16_((x * x).mean(dims, keepdim=True), fmt)
    var = round_dl16_(mean_sq - round_dl16_(mean * mean, fmt), fmt)
    rstd = round_dl16_(torch.rsqrt(var + eps), fmt)
    out = (x - mean).mul_(rstd)
    if weight is not None:
        out.mul_(weight)
    if bias is not None:
        out.add_(bias)
    return round_dl16_(out, fmt), mean, rstd


def native_layer_norm(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
    """aten::native_layer_norm(input, normalized_shape, weight, bias, eps) -> (out, mean, rstd)."""
    return _layer_norm_dl16(
        args[0],
        _arg(args, kwargs, 1, "normalized_shape", ()),
        _arg(args, kwargs, 2, "weight", None),
        _arg(args, kwargs, 3, "bias", None),
        float(_arg(args, kwargs, 4, "eps", 1e-5)),
        fmt,
    )


def layer_norm(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
    """aten::layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable) -> out."""
    return _layer_norm_dl16(
        args[0],
        _arg(args, kwargs, 1, "normalized_shape", ()),
        _arg(args, kwargs, 2, "weight", None),
        _arg(args, kwargs, 3, "bias", None),
        float(_arg(args, kwargs, 4, "eps", 1e-5)),
        fmt,
    )[0]


def _rms_norm_dl16(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    eps: float | None,
    fmt: DL16Format,
) -> torch.Tensor:
    """The card's native RMSNorm: the variance accumulated in DL16, one element at a time
    (fp16-only variance and rsqrt, no fp32 upcast: hf-adapters' spyre-numerical-findings.md),
    so small squares stagnate against a large running sum."""
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    flat = x.flatten(dims[0]) if len(dims) > 1 else x
    squares = round_dl16_(flat * flat, fmt)
    acc = torch.zeros(squares.shape[:-1], dtype=torch.float32)
    for i in range(squares.shape[-1]):
        round_dl16_(acc.add_(squares[..., i]), fmt)
    n = squares.shape[-1]
    var = round_dl16_(acc / n, fmt)
    eps_value = torch.finfo(torch.float16).eps if eps is None else eps
    rstd = round_dl16_(torch.rsqrt(round_dl16_(var + eps_value, fmt)), fmt)
    shape = rstd.shape + (1,) * len(dims)
    out = round_dl16_(x * rstd.reshape(shape), fmt)
    if weight is not None:
        out = round_dl16_(out * weight, fmt)
    return out


def rms_norm(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
    """aten::rms_norm(input, normalized_shape, weight, eps) -> out."""
    return _rms_norm_dl16(
        args[0],
        _arg(args, kwargs, 1, "normalized_shape", ()),
        _arg(args, kwargs, 2, "weight", None),
        _arg(args, kwargs, 3, "eps", None),
        fmt,
    )


def _softmax_floor(x: torch.Tensor, dim: int, floor: float) -> torch.Tensor:
    """softmax whose exp never returns less than ``floor`` (the card's masked-position leak):
    a key masked with -inf (the device holds it as -0xEFFF) keeps floor / sum(exp) of the
    probability instead of 0. A row with every key masked stays uniform, as on the CPU."""
    e = torch.exp(x - x.amax(dim, keepdim=True)).clamp_min_(floor)
    return e.div_(e.sum(dim, keepdim=True))


def _dl16_result(dtype: Any) -> bool:
    return dtype is None or dtype in (torch.float16, torch.bfloat16)


def softmax_kernel(floor: float) -> tuple[Kernel, Kernel]:
    """Kernels for aten::_softmax(self, dim, half_to_float) and aten::softmax.int(self, dim,
    dtype) with the exp floor; the result is rounded to DL16 unless it is fp32."""

    def _softmax(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
        out = _softmax_floor(args[0], int(_arg(args, kwargs, 1, "dim", -1)), floor)
        return out if _arg(args, kwargs, 2, "half_to_float", False) else round_dl16_(out, fmt)

    def softmax(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
        out = _softmax_floor(args[0], int(_arg(args, kwargs, 1, "dim", -1)), floor)
        return round_dl16_(out, fmt) if _dl16_result(_arg(args, kwargs, 2, "dtype", None)) else out

    return _softmax, softmax


# -- matmul: chunked accumulation, each chunk's partial product truncated --------------------

STICK = 64  # fp16 elements in one 128-byte stick: chunk boundaries fall on whole sticks


def truncate_partial_(p: torch.Tensor, mantissa_bits: int) -> torch.Tensor:
    """Round an fp32 partial product to ``mantissa_bits`` in place, as the hardware-simulating
    Triton matmul does (``round_and_trun``): add half of the dropped field to the bit pattern
    (half-up in magnitude) and clear it."""
    dropped = 23 - mantissa_bits
    bits = p.view(torch.int32)
    bits.add_(1 << (dropped - 1)).bitwise_and_(-(1 << dropped))
    return p


def chunked_matmul(
    a: torch.Tensor, b: torch.Tensor, chunks: int, mantissa_bits: int
) -> torch.Tensor:
    """a @ b (2-D or batched) with K split into ``chunks`` stick-aligned pieces: each piece's
    fp32 product is truncated to ``mantissa_bits`` before it joins the fp32 accumulator
    (``tl_matmul_chunk_truncate``, truncate-then-accumulate). One piece when K is a stick or less."""
    k = a.shape[-1]
    sticks = -(-k // STICK)
    pieces = max(1, min(chunks, sticks))
    if pieces == 1:
        return truncate_partial_(torch.matmul(a, b), mantissa_bits)
    per = -(-sticks // pieces) * STICK
    out: torch.Tensor | None = None
    for start in range(0, k, per):
        part = truncate_partial_(
            torch.matmul(a[..., start : start + per], b[..., start : start + per, :]),
            mantissa_bits,
        )
        out = part if out is None else out.add_(part)
    assert out is not None
    return out


def matmul_kernels(chunks: int, mantissa_bits: int) -> dict[str, Kernel]:
    """Kernels for aten::mm, bmm, addmm and baddbmm with chunked, truncated accumulation; the
    bias term of addmm/baddbmm joins in fp32 and the result is rounded to DL16."""

    def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return chunked_matmul(a, b, chunks, mantissa_bits)

    def mm(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
        return round_dl16_(product(args[0], args[1]), fmt)

    def addmm(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
        beta = _arg(args, kwargs, 3, "beta", 1)
        alpha = _arg(args, kwargs, 4, "alpha", 1)
        out = product(args[1], args[2])
        if alpha != 1:
            out.mul_(alpha)
        return round_dl16_(out.add_(args[0], alpha=beta) if beta != 0 else out, fmt)

    return {"aten::mm": mm, "aten::bmm": mm, "aten::addmm": addmm, "aten::baddbmm": addmm}


# op -> (kernel, the profile numerics entry that enables it)
_KERNELS: dict[str, tuple[Kernel, str]] = {
    "aten::native_layer_norm": (native_layer_norm, "layer_norm_stats"),
    "aten::layer_norm": (layer_norm, "layer_norm_stats"),
    "aten::rms_norm": (rms_norm, "rms_norm_stats"),
}
# softmax ops (their kernels take the exp floor from the profile's "softmax_exp_floor"): op ->
# its place in softmax_kernel's pair
_SOFTMAX_OPS = {"aten::_softmax": 0, "aten::softmax.int": 1}
_MATMUL_OPS = frozenset({"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"})


@lru_cache(maxsize=8)
def _matmul_kernels(chunks: int, mantissa_bits: int) -> dict[str, Kernel]:
    return matmul_kernels(chunks, mantissa_bits)


def native_kernel(op_name: str, profile: Profile | None = None) -> Kernel | None:
    """The device-numerics kernel for an ATen op ("aten::native_layer_norm", with or without
    ".default"), or None when the device computes it as "fp32, then round the output". With a
    profile, a kernel whose numerics rule the profile disables is None too."""
    name = op_name.removesuffix(".default")
    if name in _MATMUL_OPS:
        spec = profile.numerics.get("matmul_chunks", {}) if profile is not None else {}
        if not spec.get("enabled", False):
            return None
        return _matmul_kernels(int(spec["chunks"]), int(spec["partial_mantissa_bits"]))[name]
    if name in _SOFTMAX_OPS:
        spec = profile.numerics.get("softmax_exp_floor", {}) if profile is not None else {}
        if not spec.get("enabled", False):
            return None
        return softmax_kernel(float(spec["exp_floor"]))[_SOFTMAX_OPS[name]]
    entry = _KERNELS.get(name)
    if entry is None:
        return None
    kernel, numerics_key = entry
    if profile is not None and not profile.numerics_enabled(numerics_key):
        return None
    return kernel
