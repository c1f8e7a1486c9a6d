"""DL16 ("dlfloat", IBM's 16-bit format) numerics: round float32 values to the set DL16 can
hold. Parameters come from the device profile; the defaults are SPYRE.md's (1 sign, 6 exponent
bits with bias 31, 9 mantissa bits, no subnormals, no infinity: past-range values saturate)."""

from __future__ import annotations

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
def _constants(fmt: DL16Format) -> tuple[int, int, int, float]:
    # float32 exponent fields: the smallest normal DL16 binade, and a cap that keeps the
    # magic number finite (anything that large saturates anyway).
    min_exp_field = (127 + 1 - fmt.bias) << 23
    max_exp_field = (127 + 100) << 23
    shift = fmt.dropped_bits << 23
    return min_exp_field, max_exp_field, shift, fmt.max_finite


@lru_cache(maxsize=8)
def _below_min_normal(fmt: DL16Format) -> float:
    return float(torch.nextafter(torch.tensor(fmt.min_normal), torch.tensor(0.0)))


def round_dl16(x: torch.Tensor, fmt: DL16Format = DEFAULT_FORMAT) -> torch.Tensor:
    """Round a float32 tensor to the nearest DL16 value, ties to even. Past the largest finite
    value it saturates (+-inf become +-max); there are no subnormals: a result below the smallest
    normal is flushed to zero. NaN stays NaN. Returns a new float32 tensor;
    other floating dtypes are rounded through float32, non-floating tensors pass through."""
    if x.dtype != torch.float32:
        if x.is_floating_point():
            return round_dl16(x.float(), fmt).to(x.dtype)
        return x
    min_exp_field, max_exp_field, shift, max_finite = _constants(fmt)
    x = x.contiguous()
    bits = x.view(torch.int32)
    # A "magic" addend of the same sign whose ulp is the DL16 ulp of x: the FPU's own
    # round-to-nearest-even then drops exactly the bits DL16 does not keep. Clamping its
    # exponent from below rounds tiny values onto the normal grid (no subnormals).
    magic = torch.bitwise_and(bits, 0x7F800000)
    magic.clamp_(min_exp_field, max_exp_field)
    magic.add_(shift)
    magic.add_(torch.bitwise_and(bits, -0x80000000))
    m = magic.view(torch.float32)
    y = x + m
    y.sub_(m)
    y.clamp_(-max_finite, max_finite)
    # No subnormals: flush to zero below the smallest normal (hardshrink zeroes |y| <= lambd).
    return torch.nn.functional.hardshrink(y, _below_min_normal(fmt))


def round_dl16_(x: torch.Tensor, fmt: DL16Format = DEFAULT_FORMAT) -> torch.Tensor:
    """In-place form of round_dl16 for float32 tensors (used on fresh op outputs)."""
    x.copy_(round_dl16(x, fmt))
    return x


def is_dl16_representable(x: torch.Tensor, fmt: DL16Format = DEFAULT_FORMAT) -> torch.Tensor:
    """True where x already holds a DL16 value."""
    xf = x.float()
    return (round_dl16(xf, fmt) == xf) | torch.isnan(xf)
