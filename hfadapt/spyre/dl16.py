"""DL16 ("dlfloat", IBM's 16-bit format) numerics: round float32 values to the set DL16 can
hold. Parameters come from the device profile; the defaults are the card's (1 sign, 6 exponent
bits with bias 31, 9 mantissa bits; the top code 0x7FFF is the NaN/infinity symbol, so the
largest finite magnitude is 0x7FFE's, (1 + 510/512) * 2^32 = 8573157376, torch-spyre's
``_inductor/constants.py`` ``DLFLOAT16_MAX``; the smallest is 2^-31 * (1 + 2^-9) = 4.6657e-10,
as the hardware-simulating Triton matmul's ``clamp_acc_to_dl16`` has it; no subnormals: smaller
results flush to zero).

Two roundings, because the card has two behaviours past the range:
- device arithmetic (``round_dl16``, ``round_dl16_``): a result past the largest finite value
  lands on the 0x7FFF symbol and reads back as NaN (``overflow="nan"``, torch-spyre's tests;
  a profile can say +-inf instead), never a saturated number;
- a host value moved onto the device (``transfer=True``): fp16 +-inf lands on 0xEFFF's
  magnitude, +-33521664 (hf-adapters ``hf_common.py``); finite values round as above."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class DL16Format:
    exponent_bits: int = 6
    mantissa_bits: int = 9
    bias: int = 31
    max_finite_value: float = 2.0**32 * (1 + 510 / 512)  # 0x7FFE; 0x7FFF is NaN/infinity
    min_normal_value: float = 2.0**-31 * (1 + 2.0**-9)
    host_inf_bits: int = 0x6FFF  # the magnitude where a host +-inf lands (0x6FFF / 0xEFFF)
    overflow_nan: bool = True  # device overflow reads back as NaN (False: +-inf)

    def decode(self, bits: int) -> float:
        """The value of a DL16 bit pattern (sign, exponent, mantissa), computed exactly. There
        are no subnormals: exponent field 0 is a normal binade (only all-zero bits are zero)."""
        sign = -1.0 if bits >> (self.exponent_bits + self.mantissa_bits) & 1 else 1.0
        exponent = (bits >> self.mantissa_bits) & ((1 << self.exponent_bits) - 1)
        mantissa = bits & ((1 << self.mantissa_bits) - 1)
        if exponent == 0 and mantissa == 0:
            return sign * 0.0
        return sign * math.ldexp(1 + mantissa / 2**self.mantissa_bits, exponent - self.bias)

    @property
    def max_finite(self) -> float:
        return self.max_finite_value

    @property
    def min_normal(self) -> float:
        return self.min_normal_value

    @property
    def host_inf(self) -> float:
        """Where a host +inf lands on the device (-inf lands on its negative)."""
        return self.decode(self.host_inf_bits)

    @property
    def overflow_clamp(self) -> float:
        """A float32 past every finite DL16 value that rounds to itself: results are clamped
        to it before rounding (keeps the magic addend finite) and become +-inf after."""
        return 2.0 ** (math.floor(math.log2(self.max_finite_value)) + 1)

    @property
    def overflow_value(self) -> float:
        """What a result past the largest finite value becomes (with its sign, for inf)."""
        return math.nan if self.overflow_nan else math.inf

    @property
    def dropped_bits(self) -> int:
        """float32 mantissa bits that DL16 does not keep."""
        return 23 - self.mantissa_bits


DEFAULT_FORMAT = DL16Format()


@dataclass(frozen=True)
class _Constants:
    shift: int
    max_finite: float
    below_min_normal: float
    clamp: float
    host_inf: float
    over: float


@lru_cache(maxsize=8)
def _constants(fmt: DL16Format) -> _Constants:
    # Adding 2^(e + dropped) to a value of binade e leaves a sum whose ulp is the DL16 ulp of
    # that value; in float32 bits that is the value's sign and exponent plus `shift`.
    return _Constants(
        shift=fmt.dropped_bits << 23,
        max_finite=fmt.max_finite,
        below_min_normal=float(torch.nextafter(torch.tensor(fmt.min_normal), torch.tensor(0.0))),
        clamp=fmt.overflow_clamp,
        host_inf=fmt.host_inf,
        over=fmt.overflow_value,
    )


def native_rounding_args(
    fmt: DL16Format = DEFAULT_FORMAT,
) -> tuple[float, float, int, float]:
    """(max_finite, below_min_normal, dropped bits, overflow): the rounding arguments the C
    kernels of hfadapt.spyre.dl16_native take for ``fmt``."""
    c = _constants(fmt)
    return c.max_finite, c.below_min_normal, fmt.dropped_bits, c.over


def optional_rounding_args(fmt: DL16Format | None) -> tuple[float, float, int, float]:
    """native_rounding_args(fmt), or for None the arguments that tell the C kernels not to
    round (max_finite 0)."""
    return native_rounding_args(fmt) if fmt is not None else (0.0, 0.0, 1, 0.0)


def _round_inplace(y: torch.Tensor, fmt: DL16Format, transfer: bool = False) -> torch.Tensor:
    c = _constants(fmt)
    if transfer:  # host +-inf lands on 0xEFFF's magnitude; NaN stays NaN
        y.nan_to_num_(nan=math.nan, posinf=c.host_inf, neginf=-c.host_inf)
    # Clamp first: it keeps the magic addend finite (x + inf - inf would be NaN); the clamp
    # value rounds to itself and is past the range, so it becomes +-inf below.
    y.clamp_(-c.clamp, c.clamp)
    # A "magic" addend of the same sign whose ulp is the DL16 ulp of y: the FPU's own
    # round-to-nearest-even then drops exactly the bits DL16 does not keep. NaN stays NaN.
    magic = torch.bitwise_and(y.view(torch.int32), -0x800000)  # sign and exponent bits
    magic.add_(c.shift)
    m = magic.view(torch.float32)
    y.add_(m).sub_(m)
    # No subnormals: a rounded result below the smallest normal flushes to zero
    # (hardshrink zeroes |y| <= lambd). Written into y: no extra allocation.
    torch.ops.aten.hardshrink.out(y, c.below_min_normal, out=y)
    # Overflow in device arithmetic is the 0x7FFF symbol (NaN), or +-inf; never saturated.
    over = y.abs() > c.max_finite
    if bool(over.any()):
        if math.isnan(c.over):
            y.masked_fill_(over, math.nan)
        else:
            y.masked_fill_(over & (y > 0), c.over).masked_fill_(over & (y < 0), -c.over)
    return y


_native: Callable[..., None] | bool | None = False  # False: not looked up yet


def _native_round(x: torch.Tensor, fmt: DL16Format, transfer: bool = False) -> bool:
    """Round x in place with the C kernel of hfadapt.spyre.dl16_native (bit-identical to
    _round_inplace, one pass instead of six) when it is built and x is a plain contiguous CPU
    float32 tensor; False when the torch path must do it."""
    global _native
    if _native is False:
        from hfadapt.spyre.dl16_native import load

        _native = load()  # None when not built (dl16_native never raises for its build)
    if (
        _native is None
        or type(x) is not torch.Tensor  # FakeTensor, wrapper subclasses: no real data pointer
        or x.device.type != "cpu"
        or x.requires_grad
        or not (x.is_contiguous() or _dense(x))
    ):
        return False
    _native(  # type: ignore[operator]
        x.data_ptr(),
        x.numel(),
        *native_rounding_args(fmt),
        _constants(fmt).host_inf if transfer else 0.0,
        torch.get_num_threads(),
    )
    return True


def _dense(x: torch.Tensor) -> bool:
    """Elements fill one gap-free span from data_ptr (a permuted layout, e.g. an elementwise
    result of a transposed input): rounding the span in memory order rounds every element."""
    expected = 1
    for stride, size in sorted(
        (st, sz) for st, sz in zip(x.stride(), x.shape, strict=True) if sz != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def round_dl16(
    x: torch.Tensor, fmt: DL16Format = DEFAULT_FORMAT, *, transfer: bool = False
) -> torch.Tensor:
    """Round a float32 tensor to the nearest DL16 value, ties to even. A result past the
    largest finite value becomes NaN (the 0x7FFF symbol; +-inf where the format says so); with
    ``transfer`` (a host value moved onto the device) +-inf lands on +-33521664 (0xEFFF) instead. There are no
    subnormals: a result below the smallest normal is flushed to zero. NaN stays NaN. Returns a
    new float32 tensor; other floating dtypes are rounded through float32, non-floating
    tensors pass through."""
    if x.dtype != torch.float32:
        if x.is_floating_point():
            return round_dl16(x.float(), fmt, transfer=transfer).to(x.dtype)
        return x
    y = x.clone()  # dense like x, so the in-place steps below (and the C kernel) apply
    return y if _native_round(y, fmt, transfer) else _round_inplace(y, fmt, transfer)


def round_dl16_(
    x: torch.Tensor, fmt: DL16Format = DEFAULT_FORMAT, *, transfer: bool = False
) -> torch.Tensor:
    """In-place form of round_dl16 for float32 tensors (used on fresh op outputs)."""
    if x.dtype != torch.float32:
        x.copy_(round_dl16(x, fmt, transfer=transfer))
        return x
    return x if _native_round(x, fmt, transfer) else _round_inplace(x, fmt, transfer)


def is_dl16_representable(x: torch.Tensor, fmt: DL16Format = DEFAULT_FORMAT) -> torch.Tensor:
    """True where x already holds a DL16 value (+-inf and NaN included: the card's codes)."""
    xf = x.float()
    return (round_dl16(xf, fmt) == xf) | torch.isnan(xf)
