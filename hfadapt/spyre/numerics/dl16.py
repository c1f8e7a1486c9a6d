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

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TypeGuard

import torch

from hfadapt.spyre.numerics.dl16_native import dense_span


def _decode(bits: int, exponent_bits: int, mantissa_bits: int, bias: int) -> float:
    sign = -1.0 if bits >> (exponent_bits + mantissa_bits) & 1 else 1.0
    exponent = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1)
    mantissa = bits & ((1 << mantissa_bits) - 1)
    if exponent == 0 and mantissa == 0:
        return sign * 0.0
    return sign * math.ldexp(1 + mantissa / 2**mantissa_bits, exponent - bias)


@dataclass(frozen=True)
class DL16Format:
    exponent_bits: int = 6
    mantissa_bits: int = 9
    bias: int = 31
    max_finite_value: float = 2.0**32 * (1 + 510 / 512)  # 0x7FFE; 0x7FFF is NaN/infinity
    min_normal_value: float = 2.0**-31 * (1 + 2.0**-9)
    host_inf_bits: int = 0x6FFF  # the magnitude where a host +-inf lands (0x6FFF / 0xEFFF)
    overflow_nan: bool = True  # device overflow reads back as NaN (False: +-inf)

    def __post_init__(self) -> None:
        refused = format_problem(**dataclasses.asdict(self))
        if refused is not None:
            field, value, allowed = refused
            raise ValueError(f"DL16 format: {field} = {value!r}; allowed: {allowed}")

    def decode(self, bits: int) -> float:
        """The value of a DL16 bit pattern (sign, exponent, mantissa), computed exactly. There
        are no subnormals: exponent field 0 is a normal binade (only all-zero bits are zero)."""
        return _decode(bits, self.exponent_bits, self.mantissa_bits, self.bias)

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


# float32's smallest normal: below it float32 has no exponent for the rounding to follow
FLOAT32_MIN_NORMAL = 2.0**-126


def _integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _real(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def format_problem(
    *,
    exponent_bits: object,
    mantissa_bits: object,
    bias: object,
    max_finite_value: object,
    min_normal_value: object,
    host_inf_bits: object,
    overflow_nan: object,
) -> tuple[str, object, str] | None:
    """The first DL16Format field the rounding cannot be computed with, as (field, value,
    what is allowed), or None. The C kernels and the torch path compute with float32: a
    rounding drops 1 to 23 of its mantissa bits (a shift by -1 is undefined in C and refused by
    torch), the range lies within float32's normal numbers, and the torch path's magic addend
    for the overflow clamp (``overflow_clamp`` times 2^dropped bits) is a finite float32."""
    e, m = exponent_bits, mantissa_bits
    if not (_integer(e) and 1 <= e <= 8):
        return "exponent_bits", e, "an integer from 1 to 8 (DL16 values are held as float32)"
    if not (_integer(m) and 0 <= m <= 22):
        return (
            "mantissa_bits",
            m,
            "an integer from 0 to 22 (the rounding drops at least one of float32's 23 mantissa "
            "bits)",
        )
    if not (_integer(bias) and 0 <= bias < 2**e):
        return "bias", bias, f"an integer from 0 to {2**e - 1} (an exponent field of {e} bits)"
    top, low, dropped = max_finite_value, min_normal_value, 23 - m
    if not (_real(top) and top < 2.0 ** (127 - dropped)):
        return (
            "max_finite_value",
            top,
            f"a finite number below 2^{127 - dropped} (the torch path's magic addend for the "
            f"overflow clamp, the next power of two times 2^{dropped} dropped bits, must be a "
            "finite float32)",
        )
    if not (_real(low) and FLOAT32_MIN_NORMAL <= low < top):
        return (
            "min_normal_value",
            low,
            "a number from 2^-126 (float32's smallest normal) up to below the largest finite value",
        )
    code = host_inf_bits
    if not (_integer(code) and 0 < code < 2 ** (e + m) and _decode(code, e, m, bias) <= top):
        return (
            "host_inf_bits",
            hex(code) if _integer(code) else code,
            f"a positive code (below 0x{2 ** (e + m):X}, the sign bit clear) whose value is at "
            "most the largest finite value (a host infinity lands on a finite value)",
        )
    if not isinstance(overflow_nan, bool):
        return "overflow_nan", overflow_nan, "True (NaN) or False (+-inf)"
    return None


DEFAULT_FORMAT = DL16Format()
# fp16 (and DL16) elements in one 128-byte stick, the card's unit of layout: what the
# simulator's kernels assume (a profile's ``layout.stick_elements_fp16`` is checked against it)
STICK_ELEMENTS = 64


@dataclass(frozen=True)
class _Constants:
    shift: int
    max_finite: float
    below_min_normal: float
    clamp: float
    host_inf: float
    over: float
    native: tuple[float, float, int, float]  # native_rounding_args: one tuple per format


@lru_cache(maxsize=8)
def _constants(fmt: DL16Format) -> _Constants:
    # Adding 2^(e + dropped) to a value of binade e leaves a sum whose ulp is the DL16 ulp of
    # that value; in float32 bits that is the value's sign and exponent plus `shift`.
    below = float(torch.nextafter(torch.tensor(fmt.min_normal), torch.tensor(0.0)))
    return _Constants(
        shift=fmt.dropped_bits << 23,
        max_finite=fmt.max_finite,
        below_min_normal=below,
        clamp=fmt.overflow_clamp,
        host_inf=fmt.host_inf,
        over=fmt.overflow_value,
        native=(fmt.max_finite, below, fmt.dropped_bits, fmt.overflow_value),
    )


def native_rounding_args(
    fmt: DL16Format = DEFAULT_FORMAT,
) -> tuple[float, float, int, float]:
    """(max_finite, below_min_normal, dropped bits, overflow): the rounding arguments the C
    kernels of hfadapt.spyre.numerics.dl16_native take for ``fmt`` (the same tuple every call: the
    kernels' wrappers check it once)."""
    return _constants(fmt).native


def optional_rounding_args(fmt: DL16Format | None) -> tuple[float, float, int, float]:
    """native_rounding_args(fmt), or for None the arguments that tell the C kernels not to
    round (max_finite 0)."""
    return native_rounding_args(fmt) if fmt is not None else NO_ROUNDING


NO_ROUNDING = (0.0, 0.0, 1, 0.0)  # optional_rounding_args(None): the C kernels do not round


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
    """Round x in place with the C kernel of hfadapt.spyre.numerics.dl16_native (bit-identical to
    _round_inplace, one pass instead of six) when it is built and x is a plain contiguous CPU
    float32 tensor; False when the torch path must do it."""
    global _native
    if _native is False:
        from hfadapt.spyre.numerics.dl16_native import load

        _native = load()  # None when not built (dl16_native never raises for its build)
    if (
        _native is None
        or type(x) is not torch.Tensor  # FakeTensor, wrapper subclasses: no real data pointer
        or not x.is_cpu
        or x.requires_grad
        or not (x.is_contiguous() or dense_span(x))
    ):
        return False
    _native(  # type: ignore[operator]
        x,
        native_rounding_args(fmt),
        _constants(fmt).host_inf if transfer else 0.0,
        torch.get_num_threads(),
    )
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
