"""Device numerics that are not "compute in fp32, round the output to DL16": kernels for the
ops whose intermediate results the device keeps in DL16. Shared by the eager device and the
compile backend.

A kernel takes the op's positional args and kwargs with tensors given as float32 CPU tensors
that hold DL16 values, plus the DL16 format, and returns what the ATen op returns (float32,
rounded to DL16)."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from hfadapt.spyre.numerics import amx
from hfadapt.spyre.numerics.add_kernel import add_zero_code_inplace, add_zero_code_kernel
from hfadapt.spyre.numerics.dl16 import (
    STICK_ELEMENTS,
    DL16Format,
    native_rounding_args,
    optional_rounding_args,
    round_dl16_,
)

Kernel = Callable[[Sequence[Any], dict[str, Any], DL16Format], Any]


def _arg(
    args: Sequence[object], kwargs: dict[str, object], i: int, name: str, default: object
) -> Any:
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
    # negative variance and NaN), which is what hf-adapters saw and unfused. The two means are
    # summed in float64, so that the C kernel (one pass per row) and these ops agree.
    fast = _layer_norm_rows(x, normalized_shape, weight, bias, eps, fmt)
    if fast is not None:
        return fast
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    wide = x.double()
    mean = round_dl16_(wide.mean(dims, keepdim=True).float(), fmt)
    mean_sq = round_dl16_((wide * wide).mean(dims, keepdim=True).float(), fmt)
    var = round_dl16_(mean_sq - round_dl16_(mean * mean, fmt), fmt)
    rstd = round_dl16_(torch.rsqrt(var + eps), fmt)
    out = (x - mean).mul_(rstd)
    if weight is not None:
        out.mul_(weight)
    if bias is not None:
        out.add_(bias)
    return round_dl16_(out, fmt), mean, rstd


def _plain_rows(t: torch.Tensor | None, numel: int) -> bool:
    """A weight or bias the C kernel can read: absent, or ``numel`` contiguous float32s."""
    return t is None or (
        type(t) is torch.Tensor
        and t.dtype == torch.float32
        and t.numel() == numel
        and t.is_contiguous()
        and not t.requires_grad
    )


def _layer_norm_rows(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
    fmt: DL16Format,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """_layer_norm_dl16 by the C kernel, one pass per row; None when the kernel is not
    built or the tensors are not plain contiguous float32 (then the torch ops compute it)."""
    from hfadapt.spyre.numerics.dl16_native import load_layer_norm

    kernel = load_layer_norm()
    k = len(normalized_shape)
    if (
        kernel is None
        or type(x) is not torch.Tensor
        or x.dtype != torch.float32
        or k == 0
        or x.dim() < k
        or tuple(x.shape[x.dim() - k :]) != tuple(normalized_shape)
        or x.requires_grad
        or not x.is_contiguous()
        or x.numel() == 0
    ):
        return None
    cols = math.prod(normalized_shape)
    if not (_plain_rows(weight, cols) and _plain_rows(bias, cols)):
        return None
    out = torch.empty_like(x)
    stats = (*x.shape[: x.dim() - k], *([1] * k))
    mean = torch.empty(stats, dtype=torch.float32)
    rstd = torch.empty(stats, dtype=torch.float32)
    kernel(
        x,
        cols,
        weight,
        bias,
        float(eps),
        native_rounding_args(fmt),
        out,
        mean,
        rstd,
        torch.get_num_threads(),
    )
    return out, mean, rstd


def native_layer_norm(
    args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten::native_layer_norm(input, normalized_shape, weight, bias, eps) -> (out, mean, rstd);
    aten::layer_norm's arguments begin with the same five."""
    return _layer_norm_dl16(
        args[0],
        _arg(args, kwargs, 1, "normalized_shape", ()),
        _arg(args, kwargs, 2, "weight", None),
        _arg(args, kwargs, 3, "bias", None),
        float(_arg(args, kwargs, 4, "eps", 1e-5)),
        fmt,
    )


def layer_norm(args: Sequence[object], kwargs: dict[str, object], fmt: DL16Format) -> torch.Tensor:
    """aten::layer_norm(input, normalized_shape, weight, bias, eps, cudnn_enable) -> out."""
    return native_layer_norm(args, kwargs, fmt)[0]


@dataclass(frozen=True)
class Accumulator:
    """How the card's reduced-precision reductions (fp16/bf16 ``mean``; the native RMSNorm's
    variance) accumulate: ``lanes`` interleaved partial sums, each add truncated toward zero to
    ``mantissa_bits`` (an adder without a round bit), the partials then combined the same way
    (profile ``numerics.reduced_precision_mean``)."""

    mantissa_bits: int = 11
    lanes: int = 3
    # the quotient sum / n truncated to this many mantissa bits (None: not): the published
    # RMSNorm errors' intercept (hf-adapters' line sits at +0.49%, not through zero)
    result_mantissa_bits: int | None = None
    # torch-spyre#2400: a mean below ``small_below`` comes back ``small_ratio`` times the fp32
    # mean (1.0: not modelled)
    small_below: float = 0.0
    small_ratio: float = 1.0

    def __post_init__(self) -> None:
        bits = self.mantissa_bits
        if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits <= 23:
            raise ValueError(
                f"Accumulator: mantissa_bits = {self.mantissa_bits!r}, must be an integer from "
                "0 to 23 (of float32's 23)"
            )
        if isinstance(self.lanes, bool) or not isinstance(self.lanes, int) or self.lanes < 1:
            raise ValueError(f"Accumulator: lanes = {self.lanes!r}, must be a positive integer")
        result = self.result_mantissa_bits
        if result is not None and (
            isinstance(result, bool) or not isinstance(result, int) or not 0 <= result <= 23
        ):
            raise ValueError(
                f"Accumulator: result_mantissa_bits = {result!r}, must be None or an integer "
                "from 0 to 23"
            )
        if not (self.small_below >= 0 and self.small_ratio > 0):
            raise ValueError(
                f"Accumulator: small_below = {self.small_below!r} and small_ratio = "
                f"{self.small_ratio!r}: must be >= 0 and > 0"
            )

    def mean_last(self, x: torch.Tensor) -> torch.Tensor:
        """The mean over the last dimension of a float32 tensor: the accumulated sum divided by
        the count, the quotient truncated to ``result_mantissa_bits``; a mean whose fp32 value
        lies below ``small_below`` in magnitude is ``small_ratio`` times that value instead."""
        n = max(1, x.shape[-1])
        out = self.sum_last(x) / n
        if self.result_mantissa_bits is not None:
            out.view(torch.int32).bitwise_and_(-(1 << (23 - self.result_mantissa_bits)))
        if self.small_ratio != 1.0 and self.small_below > 0:
            exact = x.mean(-1)
            small = exact.abs() < self.small_below
            if bool(small.any()):
                out = torch.where(small, exact * self.small_ratio, out)
        return out

    def sum_last(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the last dimension of a float32 tensor, accumulated as described."""
        n = x.shape[-1]
        pad = (-n) % self.lanes
        if pad:
            x = torch.nn.functional.pad(x, (0, pad))
        steps = x.reshape(*x.shape[:-1], -1, self.lanes)
        keep = -(1 << (23 - self.mantissa_bits))
        acc = torch.zeros((*x.shape[:-1], self.lanes), dtype=torch.float32)
        bits = acc.view(torch.int32)
        for i in range(steps.shape[-2]):
            acc.add_(steps[..., i, :])
            bits.bitwise_and_(keep)
        out = acc[..., 0].clone()
        for lane in range(1, self.lanes):
            out.add_(acc[..., lane]).view(torch.int32).bitwise_and_(keep)
        return out


@dataclass(frozen=True)
class NumericParams:
    """The numbers the kernels compute with, one field per numerics rule of a device profile
    (built by hfadapt.spyre.rules.profile's ``Profile.numeric_params``; these kernels never read
    a profile). A rule that is off is None (``sdpa_unaligned_keys``: 0). The defaults are the
    kernels without a profile: the layer-norm statistics and the default accumulator only."""

    # numerics.matmul_chunks: (chunk_elements, partial_mantissa_bits)
    matmul_chunks: tuple[int, int] | None = None
    softmax_exp_floor: float | None = None  # numerics.softmax_exp_floor.exp_floor
    # numerics.sdpa_unaligned_keys.stick: the stick a key length must fill for SDPA's softmax
    # to be right (torch-spyre#3113)
    sdpa_unaligned_keys: int = 0
    add_zero_code: float | None = None  # numerics.add_zero_code.value (torch-spyre#1972)
    accumulator: Accumulator | None = Accumulator()  # numerics.reduced_precision_mean
    layer_norm_stats: bool = True  # numerics.layer_norm_stats.enabled


NO_PROFILE = NumericParams()


def _rms_norm_dl16(
    x: torch.Tensor,
    normalized_shape: Sequence[int],
    weight: torch.Tensor | None,
    eps: float | None,
    fmt: DL16Format,
    acc: Accumulator,
) -> torch.Tensor:
    """The card's native RMSNorm: fp16-only variance and rsqrt, no fp32 upcast (hf-adapters'
    spyre-numerical-findings.md), the variance a reduced-precision mean of the squares."""
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    flat = x.flatten(dims[0]) if len(dims) > 1 else x
    squares = round_dl16_(flat * flat, fmt)
    var = round_dl16_(acc.mean_last(squares), fmt)
    eps_value = torch.finfo(torch.float16).eps if eps is None else eps
    rstd = round_dl16_(torch.rsqrt(round_dl16_(var + eps_value, fmt)), fmt)
    shape = rstd.shape + (1,) * len(dims)
    out = round_dl16_(x * rstd.reshape(shape), fmt)
    if weight is not None:
        out = round_dl16_(out * weight, fmt)
    return out


def rms_norm_kernel(acc: Accumulator) -> Kernel:
    """aten::rms_norm(input, normalized_shape, weight, eps) -> out, with ``acc``'s variance."""

    def rms_norm(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
        return _rms_norm_dl16(
            args[0],
            _arg(args, kwargs, 1, "normalized_shape", ()),
            _arg(args, kwargs, 2, "weight", None),
            _arg(args, kwargs, 3, "eps", None),
            fmt,
            acc,
        )

    return rms_norm


def mean_kernel(acc: Accumulator) -> Kernel:
    """aten::mean(self, dim=None, keepdim=False, dtype=None) on DL16 data: the reduced dims
    summed by ``acc``, divided by their count, rounded to DL16 (a dtype=float32 mean is an
    fp32 reduction: exact here)."""

    def mean(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
        x = args[0]
        dim = _arg(args, kwargs, 1, "dim", None)
        keepdim = bool(_arg(args, kwargs, 2, "keepdim", False))
        dtype = _arg(args, kwargs, 3, "dtype", None)
        if not _dl16_result(dtype):
            return torch.mean(x, dim=dim, keepdim=keepdim)
        dims = list(range(x.dim())) if dim in (None, [], ()) else dim
        dims = sorted(
            {
                int(d) % max(1, x.dim())
                for d in (dims if isinstance(dims, (list, tuple)) else [dims])
            }
        )
        kept = [d for d in range(x.dim()) if d not in dims]
        moved = x.permute(*kept, *dims).reshape(*[x.shape[d] for d in kept], -1)
        out = acc.mean_last(moved)
        if keepdim:
            out = out.reshape([1 if d in dims else x.shape[d] for d in range(x.dim())])
        return round_dl16_(out, fmt)

    return mean


def _softmax_floor(x: torch.Tensor, dim: int, floor: float, code: float) -> torch.Tensor:
    """softmax whose exp of a key at the -inf code never returns less than ``floor`` (the
    card's masked-position leak): a key masked with -inf (the device holds it as -0xEFFF,
    ``code``) keeps floor / sum(exp) of the probability instead of 0; a key masked with a
    finite fill (finfo.min / 2, hf-adapters' masks) gets exactly 0, as ``hf_common.py`` says.
    A row with every key masked stays uniform, as on the CPU.

    The exponent is clamped first at -87 (exp there is below fp32's smallest normal, far below
    any probability DL16 keeps): the CPU's exp is 5-10x slower on large negative arguments
    (the coded keys' -3.35e7) than on ordinary ones."""
    fast = _softmax_rows(x, dim, floor, code)
    if fast is not None:
        return fast[0]
    return _softmax_shifted(x, x.amax(dim, keepdim=True), dim, floor, code)


def _native_softmax() -> Callable[..., None] | None:
    """The softmax's C kernel (dl16_native.load_softmax_floor), None when not built."""
    from hfadapt.spyre.numerics.dl16_native import load_softmax_floor

    return load_softmax_floor()


def _softmax_rows(
    x: torch.Tensor, dim: int, floor: float, code: float, fmt: DL16Format | None = None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """_softmax_floor over the last dimension of a plain contiguous float32 tensor by the C
    kernel, one pass per row: (probabilities, the rows' max with keepdim), the probabilities
    rounded to ``fmt`` when given (a block at a time, while it is in the cache); None when the
    kernel is not built or the tensor is not of that kind (then the torch ops compute it).
    The two differ only in the last bits of fp32 (the kernel's exp and its order of the sum),
    which the DL16 rounding of the result almost always removes."""
    kernel = _native_softmax()
    if (
        kernel is None
        or type(x) is not torch.Tensor
        or x.dtype != torch.float32
        or x.dim() == 0
        or x.numel() == 0
        or dim % x.dim() != x.dim() - 1
        or x.requires_grad
        or not x.is_contiguous()
    ):
        return None
    out = torch.empty_like(x)
    top = torch.empty((*x.shape[:-1], 1), dtype=torch.float32)
    kernel(
        x, out, top, float(floor), float(code), optional_rounding_args(fmt), torch.get_num_threads()
    )
    return out, top


def _softmax_shifted(
    x: torch.Tensor, top: torch.Tensor, dim: int, floor: float, code: float
) -> torch.Tensor:
    shifted = (x - top).clamp_min_(-87.0)
    e = torch.exp(shifted)
    if floor > 0:
        coded = x <= -code
        if bool(coded.any()):
            e = torch.where(coded, e.clamp_min(floor), e)
    return e.div_(e.sum(dim, keepdim=True))


def sdpa_softmax(
    x: torch.Tensor,
    dim: int,
    floor: float,
    code: float,
    misread: bool,
    fmt: DL16Format | None = None,
    key_stick: int = 0,
) -> tuple[torch.Tensor, bool]:
    """The softmax inside the card's SDPA: the leak of ``_softmax_floor``, and (``misread``)
    the abs-max that reads a row's -inf code (0xEFFF, ``-code``) as ``+code`` (hf-adapters
    ``hf_common.py``): a row holding nothing but the code has exp(x - code) = 0 everywhere and
    becomes 0/0 = NaN (a padded query row of a left-padded batch), which the next attention's
    P @ V carries into every row. ``key_stick`` (torch-spyre#3113, profile
    ``numerics.sdpa_unaligned_keys``): a key length off a whole number of sticks is padded to
    one with keys of score 0 that stay in the softmax unmasked (inferred). Returns
    (probabilities, rounded to ``fmt`` when given; whether a row was misread)."""
    length = x.shape[dim]
    if key_stick and length % key_stick and dim in (-1, x.dim() - 1):
        padded = torch.nn.functional.pad(x, (0, (-length) % key_stick))
        out, misread_rows = sdpa_softmax(padded, -1, floor, code, misread, fmt)
        return out[..., :length].contiguous(), misread_rows
    fast = _softmax_rows(x, dim, floor, code, fmt)
    if fast is not None:
        out, top = fast
    else:
        top = x.amax(dim, keepdim=True)
        out = _softmax_shifted(x, top, dim, floor, code)
        if fmt is not None:
            round_dl16_(out, fmt)
    if not misread:
        return out, False
    coded = top <= -code
    if not bool(coded.any()):
        return out, False
    return out.masked_fill(coded, math.nan), True


def _dl16_result(dtype: object) -> bool:
    return dtype is None or dtype in (torch.float16, torch.bfloat16)


# Set while the eager device runs an SDPA as the card's one kernel (hfadapt.spyre.eager): the
# softmax inside it misreads a row of -inf codes (``sdpa_softmax``); the callable is told.
_IN_SDPA = threading.local()


@contextlib.contextmanager
def inside_sdpa(on_misread: Callable[[], None] | None) -> Iterator[None]:
    """Softmaxes computed inside this block are SDPA's (``on_misread``: the amax misread is
    modelled and reported there; None: not modelled)."""
    previous = getattr(_IN_SDPA, "hook", None), getattr(_IN_SDPA, "inside", False)
    _IN_SDPA.hook, _IN_SDPA.inside = on_misread, True
    try:
        yield
    finally:
        _IN_SDPA.hook, _IN_SDPA.inside = previous


def _softmax_here(
    x: torch.Tensor, dim: int, floor: float, fmt: DL16Format, rounded: bool, key_stick: int = 0
) -> torch.Tensor:
    """The softmax kernels' softmax, rounded to ``fmt`` when ``rounded`` (a DL16 result);
    ``key_stick`` applies inside an SDPA only."""
    hook = getattr(_IN_SDPA, "hook", None)
    stick = key_stick if getattr(_IN_SDPA, "inside", False) else 0
    out, misread = sdpa_softmax(
        x, dim, floor, fmt.host_inf, hook is not None, fmt if rounded else None, stick
    )
    if misread and hook is not None:
        hook()
    return out


@lru_cache(maxsize=8)
def softmax_kernel(floor: float, key_stick: int = 0) -> tuple[Kernel, Kernel]:
    """Kernels for aten::_softmax(self, dim, half_to_float) and aten::softmax.int(self, dim,
    dtype) with the exp floor (and, inside an SDPA, ``key_stick``'s unmasked padding keys);
    the result is rounded to DL16 unless it is fp32."""

    def _softmax(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
        rounded = not _arg(args, kwargs, 2, "half_to_float", False)
        dim = int(_arg(args, kwargs, 1, "dim", -1))
        return _softmax_here(args[0], dim, floor, fmt, rounded, key_stick)

    def softmax(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
        rounded = _dl16_result(_arg(args, kwargs, 2, "dtype", None))
        dim = int(_arg(args, kwargs, 1, "dim", -1))
        return _softmax_here(args[0], dim, floor, fmt, rounded, key_stick)

    return _softmax, softmax


# -- matmul: chunked accumulation, each chunk's partial product truncated --------------------


def _check_partial_bits(mantissa_bits: int) -> None:
    """A truncation keeps 0 to 22 of float32's 23 mantissa bits (it drops at least one: its
    half-step is 1 << (dropped - 1)); anything else is refused here, as the C kernels would."""
    if isinstance(mantissa_bits, bool) or not isinstance(mantissa_bits, int):
        raise TypeError(f"mantissa_bits must be an integer, got {mantissa_bits!r}")
    if not 0 <= mantissa_bits <= 22:
        raise ValueError(
            f"mantissa_bits = {mantissa_bits}, must be an integer from 0 to 22 (a truncation "
            "drops at least one of float32's 23 mantissa bits)"
        )


def truncate_partial_(p: torch.Tensor, mantissa_bits: int) -> torch.Tensor:
    """Round an fp32 partial product to ``mantissa_bits`` in place, as the hardware-simulating
    Triton matmul does (``round_and_trun``): add half of the dropped field to the bit pattern
    (half-up in magnitude) and clear it."""
    _check_partial_bits(mantissa_bits)
    dropped = 23 - mantissa_bits
    bits = p.view(torch.int32)
    bits.add_(1 << (dropped - 1)).bitwise_and_(-(1 << dropped))
    return p


def _sum_truncated(
    parts: torch.Tensor,
    mantissa_bits: int,
    bias: torch.Tensor | None = None,
    fmt: DL16Format | None = None,
) -> torch.Tensor:
    """parts[0] + parts[1] + ... in that order, each truncated to ``mantissa_bits`` first;
    then ``bias`` (1-D, over the last dimension) added and the sum rounded to ``fmt``, when
    given. One pass with the C kernels (hfadapt.spyre.numerics.dl16_native) when built, else torch ops
    (the same bits)."""
    plain = parts.dtype == torch.float32 and parts.is_contiguous() and type(parts) is torch.Tensor
    if plain and (bias is None or _fusable_bias(bias, parts.shape[-1])):
        native = _native_kernels()
        out = torch.empty(parts.shape[1:], dtype=parts.dtype)
        threads = torch.get_num_threads()
        if fmt is not None and native[1] is not None:
            native[1](parts, mantissa_bits, bias, native_rounding_args(fmt), out, threads)
            return out
        if bias is None and fmt is None and native[0] is not None:
            native[0](parts, mantissa_bits, out, threads)
            return out
    truncate_partial_(parts, mantissa_bits)
    out = parts[0] + parts[1]
    for piece in parts[2:]:
        out.add_(piece)
    if bias is not None:
        out.add_(bias)
    return out if fmt is None else round_dl16_(out, fmt)


def _fusable_bias(bias: torch.Tensor, columns: int) -> bool:
    return (
        type(bias) is torch.Tensor
        and bias.dtype == torch.float32
        and bias.dim() == 1
        and bias.shape[0] == columns
        and bias.is_contiguous()
    )


def _native_kernels() -> tuple[Callable[..., None] | None, Callable[..., None] | None]:
    """(sum of truncated partials, the same with bias and DL16 rounding), None when not built."""
    from hfadapt.spyre.numerics.dl16_native import load_sum_truncated, load_sum_truncated_round

    return load_sum_truncated(), load_sum_truncated_round()


def _native_accumulate() -> Callable[..., None] | None:
    """The piece-by-piece step of the truncated sum (dl16_native.load_accumulate_truncated),
    None when not built."""
    from hfadapt.spyre.numerics.dl16_native import load_accumulate_truncated

    return load_accumulate_truncated()


def chunked_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    chunk: int,
    mantissa_bits: int,
    *,
    bias: torch.Tensor | None = None,
    fmt: DL16Format | None = None,
) -> torch.Tensor:
    """a @ b (2-D or batched) with K accumulated in pieces of ``chunk`` elements (a whole
    number of sticks; the last piece may be shorter): each piece's fp32 product is truncated to
    ``mantissa_bits`` before it joins the fp32 accumulator (``tl_matmul_chunk_truncate``,
    truncate-then-accumulate), so the count of truncated partials grows with K. One piece when
    K is a chunk or less. Then ``bias`` (broadcast over the last dimension) is added and the
    result rounded to ``fmt``, when given (a linear's epilogue).

    With the C kernels built, the pieces' products are made a group at a time into this
    thread's kept buffer (GROUP_BYTES), and each group joins the accumulator in one pass (no
    batched product: with two threads a batched product of 3 pieces ran 1.8x slower than 3
    plain products into one buffer); else side by side, then summed. A large batched product of
    one piece is made a group of batch items at a time (_epilogue_blocked)."""
    _check_partial_bits(mantissa_bits)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk = {chunk!r}, must be a positive number of elements")
    k = a.shape[-1]
    if b.dim() < 2 or b.shape[-2] != k:  # torch.matmul's check, made before the pieces
        raise RuntimeError(
            f"chunked_matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be multiplied"
        )
    per = max(STICK_ELEMENTS, -(-chunk // STICK_ELEMENTS) * STICK_ELEMENTS)  # whole sticks
    step = _native_accumulate()
    native = (
        step is not None
        and a.dtype == b.dtype == torch.float32
        and type(a) is torch.Tensor
        and type(b) is torch.Tensor
        and (bias is None or _fusable_bias(bias, b.shape[-1]))
    )
    if native:
        tiled = amx.product(a, b, per, mantissa_bits, bias, fmt)
        if tiled is not None:
            return tiled
    if k <= per:
        if native and step is not None and _blockable(a, b):
            return _epilogue_blocked(step, a, b, mantissa_bits, bias, fmt)
        product = torch.matmul(a, b)
        if native and step is not None and product.is_contiguous():
            # the truncation, the bias and the rounding in one pass (else three or four)
            return _epilogue(step, product, mantissa_bits, bias, fmt)
        out = truncate_partial_(product, mantissa_bits)
        if bias is not None:
            out.add_(bias)
        return out if fmt is None else round_dl16_(out, fmt)
    starts = range(0, k, per)
    if native and step is not None:
        return _accumulated(step, a, b, starts, per, mantissa_bits, bias, fmt)
    shape = (*_batch_shape(a, b), a.shape[-2], b.shape[-1])
    parts = torch.empty((len(starts), *shape), dtype=torch.result_type(a, b))
    for i, start in enumerate(starts):
        torch.matmul(a[..., start : start + per], b[..., start : start + per, :], out=parts[i])
    return _sum_truncated(parts, mantissa_bits, bias, fmt)


def _batch_shape(a: torch.Tensor, b: torch.Tensor) -> tuple[int, ...]:
    """The batch dimensions of a @ b (the operands' leading dimensions broadcast)."""
    shape = broadcast_shape(a.shape[:-2], b.shape[:-2])
    if shape is None:  # torch's own message
        raise RuntimeError(
            f"the batch dimensions of {tuple(a.shape)} and {tuple(b.shape)} do not broadcast"
        )
    return shape


# Bytes of partial products held at once: a group of pieces this large is summed in one pass.
GROUP_BYTES = 24 << 20


# One buffer of GROUP_BYTES per thread for the pieces, kept between calls: freeing and
# allocating it per linear made glibc return and fault in the same pages again (the eager
# BERT-base forward ran 0.83 s instead of 0.70 s).
_SCRATCH = threading.local()


def _scratch(numel: int) -> torch.Tensor:
    """A float32 buffer of ``numel`` elements for partial products: this thread's kept
    buffer, or a fresh one when a single piece is larger than GROUP_BYTES."""
    if 4 * numel > GROUP_BYTES:
        return torch.empty(numel, dtype=torch.float32)
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None:
        # a normal tensor even when first made in inference mode: written in place under any
        # grad mode (an inference tensor refuses that outside inference mode)
        with torch.inference_mode(False):
            buf = _SCRATCH.buf = torch.empty(GROUP_BYTES // 4, dtype=torch.float32)
    return buf[:numel]


def _accumulated(
    step: Callable[..., None],
    a: torch.Tensor,
    b: torch.Tensor,
    starts: range,
    per: int,
    mantissa_bits: int,
    bias: torch.Tensor | None,
    fmt: DL16Format | None,
) -> torch.Tensor:
    """chunked_matmul's pieces made a group at a time (plain products into one buffer), each
    group's truncated pieces added in order by ``step`` (the C kernel), the last adding the
    bias and rounding: the same bits as the sum of all pieces side by side."""
    shape = (*_batch_shape(a, b), a.shape[-2], b.shape[-1])
    out = torch.empty(shape, dtype=torch.float32)
    size = out.numel()
    group = max(1, min(len(starts), GROUP_BYTES // max(1, 4 * size)))
    parts = _scratch(group * size).view(group, *shape)
    threads = torch.get_num_threads()
    for first in range(0, len(starts), group):
        pieces = starts[first : first + group]
        for i, start in enumerate(pieces):
            torch.matmul(a[..., start : start + per], b[..., start : start + per, :], out=parts[i])
        tail = first + group >= len(starts)
        step(
            out,
            parts,
            len(pieces),
            mantissa_bits,
            first == 0,
            bias if tail else None,
            optional_rounding_args(fmt if tail else None),
            threads,
        )
    return out


def _epilogue(
    step: Callable[..., None],
    product: torch.Tensor,
    mantissa_bits: int,
    bias: torch.Tensor | None,
    fmt: DL16Format | None,
) -> torch.Tensor:
    """A one-piece product's epilogue by ``step`` (the C kernel) in one pass: truncated to
    ``mantissa_bits``, then ``bias`` added and the sum rounded to ``fmt``, when given; the
    bits of truncate_partial_, add_ and round_dl16_ in turn."""
    out = torch.empty_like(product)
    _epilogue_into(step, out, product, mantissa_bits, bias, fmt)
    return out


def _epilogue_into(
    step: Callable[..., None],
    out: torch.Tensor,
    product: torch.Tensor,
    mantissa_bits: int,
    bias: torch.Tensor | None,
    fmt: DL16Format | None,
) -> None:
    """_epilogue written into ``out`` (contiguous, ``product``'s size)."""
    step(
        out,
        product,
        1,
        mantissa_bits,
        True,
        bias,
        optional_rounding_args(fmt),
        torch.get_num_threads(),
    )


# Bytes of one-piece products made at a time by _epilogue_blocked: a group of batch items this
# large stays in the core's cache (2 MiB of L2 on the machines measured) until its epilogue.
BLOCK_BYTES = 1 << 20
# Products smaller than this are made whole: the epilogue pass reads them from the cache anyway.
BLOCKED_FROM = 4 << 20


def _blockable(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a one-piece product is made a group of batch items at a time: a batched
    product (3-D, the same batch on both sides) larger than BLOCKED_FROM."""
    return (
        a.dim() == 3
        and b.dim() == 3
        and a.shape[0] == b.shape[0] > 1
        and 4 * a.shape[0] * a.shape[1] * b.shape[2] > BLOCKED_FROM
    )


def _epilogue_blocked(
    step: Callable[..., None],
    a: torch.Tensor,
    b: torch.Tensor,
    mantissa_bits: int,
    bias: torch.Tensor | None,
    fmt: DL16Format | None,
) -> torch.Tensor:
    """A batched one-piece product made a group of batch items at a time into this thread's
    kept buffer (BLOCK_BYTES, in the cache), each group's epilogue (_epilogue's truncation,
    bias and rounding) written straight into the result: the bits of _epilogue, without the
    product's own trip through memory (an attention's scores: 32 x 12 x 256 x 256 held 100 MB)."""
    batch, rows, cols = a.shape[0], a.shape[1], b.shape[2]
    out = torch.empty((batch, rows, cols), dtype=torch.float32)
    group = max(1, BLOCK_BYTES // (4 * rows * cols))
    scratch = _scratch(group * rows * cols).view(group, rows, cols)
    for first in range(0, batch, group):
        last = min(batch, first + group)
        part = scratch[: last - first]
        torch.matmul(a[first:last], b[first:last], out=part)
        _epilogue_into(step, out[first:last], part, mantissa_bits, bias, fmt)
    return out


# -- binary pointwise ops: what the row programs (hfadapt.spyre.eager.fusion) read ------------

# op name -> the C kernel's op code (dl16_kernels.c: OP_ADD, OP_SUB, OP_MUL, OP_DIV)
BINARY_OPS = {
    "aten::add.Tensor": 0,
    "aten::sub.Tensor": 1,
    "aten::mul.Tensor": 2,
    "aten::div.Tensor": 3,
}
# how an operand broadcasts against a row of the result (dl16_kernels.c: BINARY_FULL,
# BINARY_COLUMN, BINARY_ROW, BINARY_SCALAR); FULL and ROW are also a row program node's kinds
FULL, COLUMN, ROW, SCALAR = 0, 1, 2, 3


def broadcast_shape(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    """The shape ``a`` and ``b`` broadcast to, None when they do not (torch.broadcast_shapes
    takes 23 us a call, longer than the op it would be checking)."""
    if a == b:
        return tuple(a)
    n = max(len(a), len(b))
    out = []
    for p, q in zip((1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b), strict=True):
        if p != q and p != 1 and q != 1:
            return None
        out.append(p if q == 1 else q)
    return tuple(out)


def operand_kind(t: torch.Tensor, shape: Sequence[int]) -> int | None:
    """How a contiguous tensor broadcasts against a contiguous result of ``shape``, as the
    row program's C kernel reads it: the same values, a row vector over the last dimension,
    one value per row (its last dimension 1, the others the result's), or one value; None
    otherwise."""
    if not t.is_contiguous():
        return None
    if t.shape == shape:
        return FULL
    if t.numel() == 1:
        return SCALAR
    cols = shape[-1]
    if t.shape[-1] == cols and t.numel() == cols:
        return COLUMN
    if t.dim() == len(shape) and t.shape[-1] == 1 and t.shape[:-1] == shape[:-1]:
        return ROW
    return None


def matmul_kernels(chunk: int, mantissa_bits: int) -> dict[str, Kernel]:
    """Kernels for aten::mm, bmm, addmm and baddbmm with chunked, truncated accumulation; the
    bias term of addmm/baddbmm joins in fp32 and the result is rounded to DL16."""

    def mm(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> torch.Tensor:
        return chunked_matmul(args[0], args[1], chunk, mantissa_bits, fmt=fmt)

    def addmm(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
        beta = _arg(args, kwargs, 3, "beta", 1)
        alpha = _arg(args, kwargs, 4, "alpha", 1)
        bias = args[0]
        if alpha == 1 and beta == 1 and isinstance(bias, torch.Tensor) and bias.dim() == 1:
            return chunked_matmul(args[1], args[2], chunk, mantissa_bits, bias=bias, fmt=fmt)
        out = chunked_matmul(args[1], args[2], chunk, mantissa_bits)
        if alpha != 1:
            out.mul_(alpha)
        return round_dl16_(out.add_(bias, alpha=beta) if beta != 0 else out, fmt)

    return {"aten::mm": mm, "aten::bmm": mm, "aten::addmm": addmm, "aten::baddbmm": addmm}


# layer-norm ops (their kernels keep the statistics in DL16: NumericParams.layer_norm_stats)
_LAYER_NORM_OPS: dict[str, Kernel] = {
    "aten::native_layer_norm": native_layer_norm,
    "aten::layer_norm": layer_norm,
}
# softmax ops (their kernels take NumericParams.softmax_exp_floor): op -> its place in
# softmax_kernel's pair
_SOFTMAX_OPS = {"aten::_softmax": 0, "aten::softmax.int": 1}
_MATMUL_OPS = frozenset({"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm"})
# ops whose sum the reduced-precision accumulator makes (NumericParams.accumulator)
_ACCUMULATING = {
    "aten::mean": mean_kernel,
    "aten::mean.dim": mean_kernel,
    "aten::rms_norm": rms_norm_kernel,
}


@lru_cache(maxsize=8)
def _matmul_kernels(chunk: int, mantissa_bits: int) -> dict[str, Kernel]:
    return matmul_kernels(chunk, mantissa_bits)


@lru_cache(maxsize=8)
def _accumulating_kernel(name: str, acc: Accumulator) -> Kernel:
    return _ACCUMULATING[name](acc)


def native_kernel(op_name: str, params: NumericParams = NO_PROFILE) -> Kernel | None:
    """The device-numerics kernel for an ATen op ("aten::native_layer_norm", with or without
    ".default"), or None when the device computes it as "fp32, then round the output" or when
    ``params`` (a profile's ``numeric_params``) turn its numerics rule off."""
    name = op_name.removesuffix(".default")
    if name in _MATMUL_OPS:
        if params.matmul_chunks is None:
            return None
        return _matmul_kernels(*params.matmul_chunks)[name]
    if name in _SOFTMAX_OPS:
        if params.softmax_exp_floor is None:
            return None
        pair = softmax_kernel(params.softmax_exp_floor, params.sdpa_unaligned_keys)
        return pair[_SOFTMAX_OPS[name]]
    if name in ("aten::add.Tensor", "aten::add_.Tensor"):
        if params.add_zero_code is None:
            return None
        made = add_zero_code_kernel if name == "aten::add.Tensor" else add_zero_code_inplace
        return made(params.add_zero_code)
    if name in _ACCUMULATING:
        acc = params.accumulator
        return _accumulating_kernel(name, acc) if acc is not None else None
    if name in _LAYER_NORM_OPS and params.layer_norm_stats:
        return _LAYER_NORM_OPS[name]
    return None
