"""DL16 ("dlfloat", IBM's 16-bit format) numerics: round float32 values to the set DL16 can
hold. Parameters come from the device profile; the defaults are the shipped profile's (1 sign,
6 exponent bits with bias 31, 9 mantissa bits, no subnormals, no infinity: past-range values
saturate; docs/device-profile.md, "DL16 numerics")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class DL16Format:
    exponent_bits: int = 6
    mantissa_bits: int = 9
    bias: int = 31
    max_finite_bits: int = 0x6FFF

    def decode(self, bits: int) -> float:
        """The value of a DL16 bit pattern (sign, exponent, mantissa), computed exactly."""
        sign = -1.0 if bits >> (self.exponent_bits + self.mantissa_bits) & 1 else 1.0
        exponent = (bits >> self.mantissa_bits) & ((1 << self.exponent_bits) - 1)
        mantissa = bits & ((1 << self.mantissa_bits) - 1)
        if exponent == 0:
            return (
                sign * 0.0
                if mantissa == 0
                else sign * 2.0 ** (1 - self.bias) * mantissa / 2**self.mantissa_bits
            )
        return sign * 2.0 ** (exponent - self.bias) * (1 + mantissa / 2**self.mantissa_bits)

    @property
    def max_finite(self) -> float:
        return self.decode(self.max_finite_bits)

    @property
    def min_normal(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def dropped_bits(self) -> int:
        """float32 mantissa bits that DL16 does not keep."""
        return 23 - self.mantissa_bits


DEFAULT_FORMAT = DL16Format()


@lru_cache(maxsize=8)
def _constants(fmt: DL16Format) -> tuple[int, float, float]:
    # Adding 2^(e + dropped) to a value of binade e leaves a sum whose ulp is the DL16 ulp of
    # that value; in float32 bits that is the value's sign and exponent plus `shift`.
    shift = fmt.dropped_bits << 23
    return shift, fmt.max_finite, _below_min_normal(fmt)


@lru_cache(maxsize=8)
def _below_min_normal(fmt: DL16Format) -> float:
    return float(torch.nextafter(torch.tensor(fmt.min_normal), torch.tensor(0.0)))


def _round_inplace(y: torch.Tensor, fmt: DL16Format, saturated: bool = False) -> torch.Tensor:
    shift, max_finite, below_min_normal = _constants(fmt)
    if not saturated:
        # Saturate first: it keeps the magic addend finite (x + inf - inf would be NaN).
        y.clamp_(-max_finite, max_finite)
    # A "magic" addend of the same sign whose ulp is the DL16 ulp of y: the FPU's own
    # round-to-nearest-even then drops exactly the bits DL16 does not keep. NaN stays NaN.
    magic = torch.bitwise_and(y.view(torch.int32), -0x800000)  # sign and exponent bits
    magic.add_(shift)
    m = magic.view(torch.float32)
    y.add_(m).sub_(m)
    # No subnormals: a rounded result below the smallest normal flushes to zero
    # (hardshrink zeroes |y| <= lambd). Written into y: no extra allocation.
    torch.ops.aten.hardshrink.out(y, below_min_normal, out=y)
    return y


_native: Callable[..., None] | bool | None = False  # False: not looked up yet


def _native_round(x: torch.Tensor, fmt: DL16Format) -> bool:
    """Round x in place with the C kernel of hfadapt.spyre.dl16_native (bit-identical to
    _round_inplace, one pass instead of six) when it is built and x is a plain contiguous CPU
    float32 tensor; False when the torch path must do it."""
    global _native
    if _native is False:
        try:
            from hfadapt.spyre.dl16_native import load

            _native = load()
        except Exception:  # never let the accelerator break rounding
            _native = None
    if (
        _native is None
        or type(x) is not torch.Tensor  # FakeTensor, wrapper subclasses: no real data pointer
        or x.device.type != "cpu"
        or x.requires_grad
        or not (x.is_contiguous() or _dense(x))
    ):
        return False
    shift, max_finite, below_min_normal = _constants(fmt)
    _native(x.data_ptr(), x.numel(), max_finite, below_min_normal, shift, torch.get_num_threads())  # type: ignore[operator]
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


def round_dl16(x: torch.Tensor, fmt: DL16Format = DEFAULT_FORMAT) -> torch.Tensor:
    """Round a float32 tensor to the nearest DL16 value, ties to even. Past the largest finite
    value it saturates (+-inf become +-max); there are no subnormals: a result below the smallest
    normal is flushed to zero. NaN stays NaN. Returns a new float32 tensor;
    other floating dtypes are rounded through float32, non-floating tensors pass through."""
    if x.dtype != torch.float32:
        if x.is_floating_point():
            return round_dl16(x.float(), fmt).to(x.dtype)
        return x
    _, max_finite, _ = _constants(fmt)
    # clamp allocates the result, so the remaining steps work in place (about 6 passes).
    y = x.clamp(-max_finite, max_finite)
    return y if _native_round(y, fmt) else _round_inplace(y, fmt, saturated=True)


def round_dl16_(x: torch.Tensor, fmt: DL16Format = DEFAULT_FORMAT) -> torch.Tensor:
    """In-place form of round_dl16 for float32 tensors (used on fresh op outputs)."""
    if x.dtype != torch.float32:
        x.copy_(round_dl16(x, fmt))
        return x
    return x if _native_round(x, fmt) else _round_inplace(x, fmt)


def is_dl16_representable(x: torch.Tensor, fmt: DL16Format = DEFAULT_FORMAT) -> torch.Tensor:
    """True where x already holds a DL16 value."""
    xf = x.float()
    return (round_dl16(xf, fmt) == xf) | torch.isnan(xf)
