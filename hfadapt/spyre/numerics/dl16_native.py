"""Optional C kernels of the simulated device (hfadapt/spyre/numerics/dl16_kernels.c): DL16 rounding,
the truncated sums of the chunked product, the softmax, LayerNorm, ATen's sum, the eager
device's row programs, and the products on AMX's tiles. The rounding computes exactly what
``dl16.round_dl16_`` computes (same overflow, host-infinity mapping, rounding to nearest even
and flush to zero, bit for bit, checked on all 2^32 float32 patterns by
benchmarks/check_dl16_exhaustive.py; by integer steps where the torch path uses a magic addend)
in one pass over memory instead of six, which is what keeps the compiled device near CPU speed
on a busy machine. hfadapt.spyre.numerics.native_build builds and binds the library (from the C file's
own declarations); without it (no C compiler, a failed build, HFADAPT_NATIVE_DL16=0) every
loader here gives None and the torch ops compute the same values. ``native_status`` says
which, for ``hfadapt cache info``."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from hfadapt import settings
from hfadapt.spyre.numerics import native_build
from hfadapt.spyre.numerics.native_build import SOURCE_FILE as SOURCE_FILE
from hfadapt.spyre.numerics.native_build import cache_dir as cache_dir
from hfadapt.spyre.numerics.native_build import clear_failure_records as clear_failure_records
from hfadapt.spyre.numerics.native_build import source as source

# -- argument checks ---------------------------------------------------------------------------
# Every kernel is reached through a wrapper below that takes tensors, not addresses: it checks
# what the C code cannot (the dtype, the device, the layout, that the sizes fit one another)
# and the scalars' ranges, and raises NativeArgumentError naming the argument before C sees
# it. The C kernels check their scalars once more and return the position of one they refuse
# (the wrappers raise then too): no argument reaches C that makes it shift by a negative or
# too large amount, divide by zero, loop forever or write past a buffer.

RoundingArgs = tuple[
    float, float, int, float
]  # dl16.native_rounding_args: maxf, lam, dropped, over

# float32's largest finite value: the C kernels take the rounding bounds as float32
FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# A truncation keeps 0 to 22 of float32's 23 mantissa bits: it drops at least one (its half-step
# is 1 << (dropped - 1)) and no more than the mantissa
MANTISSA_BITS = range(0, 23)
# the vector widths of ATen's CPU sum that hfadapt_aten_sum makes
SUM_LANES = (4, 8, 16)
# the tiles' unit: K and both output dimensions are padded to whole 32-element blocks
AMX_BLOCK = 32


# -- the row programs' description: dl16_kernels.c's "row program ABI" block, declared here as
# ctypes structures (tests/spyre/test_native_binding.py compares the two field by field)


class ProgramOperand(ctypes.Structure):
    """row_operand: where an operand of a node comes from (FROM_*), how it broadcasts
    (BINARY_* or PROGRAM_GATHER), its index, and for a gather the input of its row numbers."""

    _fields_ = (
        ("source", ctypes.c_int64),
        ("kind", ctypes.c_int64),
        ("index", ctypes.c_int64),
        ("at", ctypes.c_int64),
    )


class ProgramNode(ctypes.Structure):
    """row_node: a node's op (OP_*), its result's kind (BINARY_FULL or BINARY_ROW), whether
    it is computed, and its operands (one for a sum, two for a binary op)."""

    _fields_ = (
        ("op", ctypes.c_int64),
        ("kind", ctypes.c_int64),
        ("computed", ctypes.c_int64),
        ("operand", ProgramOperand * 2),
    )


# the C file's enums of the row program ABI, by name
PROGRAM_CODES: dict[str, int] = {
    # how an operand broadcasts against a row of the result (or a gather of rows)
    "BINARY_FULL": 0,
    "BINARY_COLUMN": 1,
    "BINARY_ROW": 2,
    "BINARY_SCALAR": 3,
    "PROGRAM_GATHER": 4,
    # a node's op
    "OP_ADD": 0,
    "OP_SUB": 1,
    "OP_MUL": 2,
    "OP_DIV": 3,
    "OP_SUM": 4,
    # where an operand comes from
    "FROM_INPUT": 0,
    "FROM_NODE": 1,
    "FROM_NUMBER": 2,
}
FROM_INPUT = PROGRAM_CODES["FROM_INPUT"]
FROM_NODE = PROGRAM_CODES["FROM_NODE"]
FROM_NUMBER = PROGRAM_CODES["FROM_NUMBER"]
PROGRAM_GATHER = PROGRAM_CODES["PROGRAM_GATHER"]
OP_SUM = PROGRAM_CODES["OP_SUM"]
# int64 fields per node: a flat int64 array of nodes * PROGRAM_FIELDS is a ProgramNode array
PROGRAM_FIELDS = ctypes.sizeof(ProgramNode) // ctypes.sizeof(ctypes.c_int64)
PROGRAM_FIELDS_PER_OPERAND = ctypes.sizeof(ProgramOperand) // ctypes.sizeof(ctypes.c_int64)

_PLAIN = (torch.Tensor, torch.nn.Parameter)


class NativeArgumentError(ValueError):
    """An argument a C kernel would misread (a dtype, layout, size or range it does not take):
    raised before the call, instead of undefined behaviour in C. A bug in the caller (or a
    device profile that escaped validation), never the user's input."""


def dense_span(x: torch.Tensor) -> bool:
    """Elements fill one gap-free span from data_ptr (a permuted layout, e.g. an elementwise
    result of a transposed input): an elementwise kernel over the span reaches every element."""
    expected = 1
    for stride, size in sorted(
        (st, sz) for st, sz in zip(x.stride(), x.shape, strict=True) if sz != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def _tensor(
    kernel: str,
    name: str,
    t: Any,
    *,
    dtype: torch.dtype = torch.float32,
    numel: int | None = None,
    at_least: int | None = None,
    span: bool = False,
    strided: bool = False,
) -> None:
    """Refuses ``t`` unless it is a plain CPU tensor of ``dtype`` whose memory the kernel may
    walk: contiguous (``span``: or one dense span; ``strided``: any strides, the kernel takes
    them), with ``numel`` (or at least ``at_least``) values. The common case is one expression
    of cheap attributes (a device op makes several such calls: ``t.device.type`` alone costs
    about 1 us); the message is made only for a refusal."""
    if (
        type(t) in _PLAIN
        and t.dtype is dtype
        and t.is_cpu
        and t.layout is torch.strided
        and (strided or t.is_contiguous() or (span and dense_span(t)))
        and (numel is None or t.numel() == numel)
        and (at_least is None or t.numel() >= at_least)
    ):
        return
    if type(t) not in _PLAIN:
        raise NativeArgumentError(
            f"{kernel}: {name} must be a CPU torch.Tensor, got {type(t).__name__}"
        )
    if t.layout != torch.strided or t.device.type != "cpu" or t.dtype != dtype:
        raise NativeArgumentError(
            f"{kernel}: {name} must be a strided {str(dtype).removeprefix('torch.')} CPU "
            f"tensor, got {str(t.layout).removeprefix('torch.')} "
            f"{str(t.dtype).removeprefix('torch.')} on {t.device}"
        )
    if not (strided or t.is_contiguous() or (span and dense_span(t))):
        raise NativeArgumentError(
            f"{kernel}: {name} must be contiguous, got shape {tuple(t.shape)} with strides "
            f"{t.stride()}"
        )
    if numel is not None and t.numel() != numel:
        raise NativeArgumentError(
            f"{kernel}: {name} must hold {numel} values, holds {t.numel()} (shape {tuple(t.shape)})"
        )
    if at_least is not None and t.numel() < at_least:
        raise NativeArgumentError(
            f"{kernel}: {name} must hold at least {at_least} values, holds {t.numel()}"
        )


def _optional(kernel: str, name: str, t: object, numel: int) -> int | None:
    """The address of an optional contiguous float32 operand of ``numel`` values (a bias, a
    weight), None when absent."""
    if t is None:
        return None
    _tensor(kernel, name, t, numel=numel)
    return int(t.data_ptr())  # type: ignore[attr-defined]


def _epilogue(kernel: str, bias: object, columns: int, rounding: object) -> tuple[object, ...]:
    """The kernel arguments ``bias, cols, maxf, lam, rdrop, over`` of a product's epilogue: an
    optional bias over the last dimension's ``columns``, then an optional DL16 rounding
    (dl16.optional_rounding_args), each checked."""
    bias_ptr = _optional(kernel, "bias", bias, columns)
    return (bias_ptr, columns, *_rounding(kernel, rounding, required=False))


def _integer(kernel: str, name: str, value: object, low: int, high: int | None = None) -> int:
    if type(value) is int and value >= low and (high is None or value <= high):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise NativeArgumentError(
            f"{kernel}: {name} must be an integer, got {type(value).__name__} {value!r}"
        )
    if value < low or (high is not None and value > high):
        allowed = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise NativeArgumentError(f"{kernel}: {name} = {value}, must be an integer {allowed}")
    return value


def _number(kernel: str, name: str, value: object, low: float, high: float) -> float:
    if type(value) is float and low <= value <= high:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NativeArgumentError(
            f"{kernel}: {name} must be a number, got {type(value).__name__} {value!r}"
        )
    if not low <= value <= high:  # NaN is refused too
        raise NativeArgumentError(f"{kernel}: {name} = {value!r}, must be in [{low}, {high}]")
    return float(value)


def _dropped(kernel: str, mantissa_bits: object) -> int:
    """The float32 mantissa bits a truncation to ``mantissa_bits`` drops (1 to 23)."""
    if type(mantissa_bits) is int and 0 <= mantissa_bits <= 22:
        return 23 - mantissa_bits
    if isinstance(mantissa_bits, bool) or not isinstance(mantissa_bits, int):
        raise NativeArgumentError(
            f"{kernel}: mantissa_bits must be an integer, got {mantissa_bits!r}"
        )
    if mantissa_bits not in MANTISSA_BITS:
        raise NativeArgumentError(
            f"{kernel}: mantissa_bits = {mantissa_bits}, must be an integer from "
            f"{MANTISSA_BITS.start} to {MANTISSA_BITS.stop - 1} (a truncation drops at least "
            "one of float32's 23 mantissa bits)"
        )
    return 23 - mantissa_bits


# rounding arguments already checked, by id (each held here, so that its id is not reused):
# dl16.native_rounding_args hands out one tuple per format
_CHECKED_ROUNDINGS: dict[int, tuple[Any, ...]] = {}


def _rounding(kernel: str, args: object, *, required: bool) -> RoundingArgs:
    """The DL16 rounding arguments (dl16.native_rounding_args), checked (once for each
    tuple); (0, 0, 1, 0) means no rounding where ``required`` is False
    (dl16.optional_rounding_args(None))."""
    if _CHECKED_ROUNDINGS.get(id(args)) is args and (not required or args[0] > 0):  # type: ignore[index]
        return args  # type: ignore[return-value]
    checked = _check_rounding(kernel, args, required=required)
    if checked is args and len(_CHECKED_ROUNDINGS) < 64:
        _CHECKED_ROUNDINGS[id(args)] = args
    return checked


def _check_rounding(kernel: str, args: object, *, required: bool) -> RoundingArgs:
    if not (isinstance(args, tuple) and len(args) == 4):
        raise NativeArgumentError(
            f"{kernel}: rounding must be (max_finite, below_min_normal, dropped, overflow), "
            f"got {args!r}"
        )
    maxf, lam, dropped, over = args
    if maxf == 0 and not required:
        return args if args == (0.0, 0.0, 1, 0.0) else (0.0, 0.0, 1, 0.0)
    maxf = _number(kernel, "rounding max_finite", maxf, 0.0, FLOAT32_MAX)
    if maxf == 0:
        raise NativeArgumentError(f"{kernel}: rounding max_finite = 0, this kernel always rounds")
    lam = _number(kernel, "rounding below_min_normal", lam, 0.0, maxf)
    if lam == maxf:
        raise NativeArgumentError(
            f"{kernel}: rounding below_min_normal = {lam!r} is not below max_finite"
        )
    dropped = _integer(kernel, "rounding dropped bits", dropped, 1, 23)
    if not (isinstance(over, float) and (math.isnan(over) or math.isinf(over))):
        raise NativeArgumentError(
            f"{kernel}: rounding overflow = {over!r}, must be NaN or +-inf (the card's codes)"
        )
    return args


def _threads(kernel: str, threads: object) -> int:
    return _integer(kernel, "threads", threads, 1)


# -- the C functions: bound from the C file's declarations (native_build.declared) ------------

ROUND = "hfadapt_round_dl16"
SUM_TRUNCATED = "hfadapt_sum_truncated"
SUM_TRUNCATED_ROUND = "hfadapt_sum_truncated_round"
ACCUMULATE_TRUNCATED = "hfadapt_accumulate_truncated"
SOFTMAX_FLOOR = "hfadapt_softmax_floor"
LAYER_NORM = "hfadapt_layer_norm_dl16"
ATEN_SUM = "hfadapt_aten_sum"
ROW_PROGRAM = "hfadapt_row_program"
AMX_READY = "hfadapt_amx_ready"
AMX_PACK = "hfadapt_amx_pack"
AMX_MATMUL = "hfadapt_amx_matmul"
# every kernel this module calls (each must be declared in the C file's exports block)
KERNELS = (
    ROUND,
    SUM_TRUNCATED,
    SUM_TRUNCATED_ROUND,
    ACCUMULATE_TRUNCATED,
    SOFTMAX_FLOOR,
    LAYER_NORM,
    ATEN_SUM,
    ROW_PROGRAM,
    AMX_READY,
    AMX_PACK,
    AMX_MATMUL,
)


def refused(name: str, status: int) -> NativeArgumentError:
    """The error for kernel ``name``'s refusal ``status`` (the 1-based position of the
    argument it refused, or its negative), naming the parameter as the C file declares it."""
    params = native_build.declared()[name].params
    position = abs(status)
    param = params[position - 1][0] if 0 < position <= len(params) else "?"
    return NativeArgumentError(
        f"{name} refused its argument {param} (position {position}); the checks in "
        "hfadapt.spyre.numerics.dl16_native should have caught it first"
    )


def _kernel(name: str) -> Callable[..., int] | None:
    """The library's function ``name`` with its declared C signature, None when the library is
    not built (or lacks it)."""
    lib = native_build.library()
    fn = getattr(lib, name, None) if lib is not None else None
    if fn is None:
        return None
    sig = native_build.declared()[name]
    fn.argtypes = sig.argtypes
    fn.restype = sig.restype
    return fn  # type: ignore[no-any-return]


def _checked(name: str, fn: Callable[..., int], *args: object) -> None:
    status = fn(*args)
    if status:
        raise refused(name, status)


# -- the kernels -------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def load() -> Callable[[torch.Tensor, RoundingArgs, float, int], None] | None:
    """``round_(x, rounding, host_inf, threads)``: x (float32, contiguous or one dense span)
    rounded to DL16 in place (``rounding``: dl16.native_rounding_args; ``host_inf`` 0: device
    arithmetic, else where a host +-inf lands), built on first use; None without a C compiler
    or with HFADAPT_NATIVE_DL16=0."""
    fn = _kernel(ROUND)
    if fn is None:
        return None

    def round_(x: torch.Tensor, rounding: RoundingArgs, host_inf: float, threads: int) -> None:
        name = ROUND
        _tensor(name, "x", x, span=True)
        args = _rounding(name, rounding, required=True)
        inf = _number(name, "host_inf", host_inf, 0.0, FLOAT32_MAX)
        _checked(ROUND, fn, x.data_ptr(), x.numel(), *args, inf, _threads(name, threads))

    return round_


def _parts(kernel: str, parts: torch.Tensor) -> tuple[int, int]:
    """(pieces, values a piece) of partial products stacked on dimension 0."""
    _tensor(kernel, "parts", parts)
    if parts.dim() < 1 or parts.shape[0] < 1:
        raise NativeArgumentError(
            f"{kernel}: parts must stack at least one piece on dimension 0, got shape "
            f"{tuple(parts.shape)}"
        )
    return parts.shape[0], parts.numel() // parts.shape[0]


@lru_cache(maxsize=1)
def load_sum_truncated() -> Callable[[torch.Tensor, int, torch.Tensor, int], None] | None:
    """``sum_truncated(parts, mantissa_bits, out, threads)``: ``out`` (parts[0]'s size)
    becomes the in-order fp32 sum of the pieces ``parts[p]``, each rounded half-up to
    ``mantissa_bits`` first; None when not built."""
    fn = _kernel(SUM_TRUNCATED)
    if fn is None:
        return None

    def sum_truncated(
        parts: torch.Tensor, mantissa_bits: int, out: torch.Tensor, threads: int
    ) -> None:
        name = SUM_TRUNCATED
        pieces, n = _parts(name, parts)
        dropped = _dropped(name, mantissa_bits)
        _tensor(name, "out", out, numel=n)
        _checked(
            SUM_TRUNCATED,
            fn,
            parts.data_ptr(),
            pieces,
            n,
            dropped,
            out.data_ptr(),
            _threads(name, threads),
        )

    return sum_truncated


@lru_cache(maxsize=1)
def load_sum_truncated_round() -> (
    Callable[[torch.Tensor, int, torch.Tensor | None, RoundingArgs, torch.Tensor, int], None] | None
):
    """``sum_truncated_round(parts, mantissa_bits, bias or None, rounding, out, threads)``:
    load_sum_truncated's sum, plus ``bias`` over the last dimension when given, rounded to DL16
    (``rounding``: dl16.optional_rounding_args); None when not built."""
    fn = _kernel(SUM_TRUNCATED_ROUND)
    if fn is None:
        return None

    def sum_truncated_round(
        parts: torch.Tensor,
        mantissa_bits: int,
        bias: torch.Tensor | None,
        rounding: RoundingArgs,
        out: torch.Tensor,
        threads: int,
    ) -> None:
        name = SUM_TRUNCATED_ROUND
        pieces, n = _parts(name, parts)
        dropped = _dropped(name, mantissa_bits)
        columns = parts.shape[-1] if parts.dim() > 1 else 1
        _tensor(name, "out", out, numel=n)
        epilogue = _epilogue(name, bias, columns, rounding)
        if n == 0:
            return
        _checked(
            SUM_TRUNCATED_ROUND,
            fn,
            parts.data_ptr(),
            pieces,
            n,
            dropped,
            *epilogue,
            out.data_ptr(),
            _threads(name, threads),
        )

    return sum_truncated_round


@lru_cache(maxsize=1)
def load_accumulate_truncated() -> (
    Callable[
        [torch.Tensor, torch.Tensor, int, int, bool, torch.Tensor | None, RoundingArgs, int],
        None,
    ]
    | None
):
    """``accumulate(acc, parts, pieces, mantissa_bits, first, bias or None, rounding,
    threads)``: one step of load_sum_truncated_round's sum made a group of ``pieces`` partials
    (each of ``acc``'s size, contiguous from the start of ``parts``) at a time: ``acc``
    becomes their sum when ``first``, else ``acc`` plus each in order; then the bias over the
    last dimension and the rounding when given (``rounding``: dl16.optional_rounding_args);
    None when not built."""
    fn = _kernel(ACCUMULATE_TRUNCATED)
    if fn is None:
        return None

    def accumulate(
        acc: torch.Tensor,
        parts: torch.Tensor,
        pieces: int,
        mantissa_bits: int,
        first: bool,
        bias: torch.Tensor | None,
        rounding: RoundingArgs,
        threads: int,
    ) -> None:
        name = ACCUMULATE_TRUNCATED
        _tensor(name, "acc", acc)
        n = acc.numel()
        pieces = _integer(name, "pieces", pieces, 1)
        _tensor(name, "parts", parts, at_least=pieces * n)
        dropped = _dropped(name, mantissa_bits)
        if not isinstance(first, bool):
            raise NativeArgumentError(f"{name}: first must be a bool, got {first!r}")
        columns = acc.shape[-1] if acc.dim() > 0 else 1
        epilogue = _epilogue(name, bias, columns, rounding)
        if n == 0:
            return
        _checked(
            ACCUMULATE_TRUNCATED,
            fn,
            acc.data_ptr(),
            parts.data_ptr(),
            pieces,
            n,
            dropped,
            int(first),
            *epilogue,
            _threads(name, threads),
        )

    return accumulate


@lru_cache(maxsize=1)
def load_softmax_floor() -> (
    Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, float, RoundingArgs, int], None]
    | None
):
    """``softmax(x, out, top, floor, code, rounding, threads)``: the softmax with the exp floor
    (kernels._softmax_floor) over the last dimension of contiguous float32 ``x`` into ``out``
    (its shape), each row's max written to ``top`` (one value a row), the probabilities
    rounded to DL16 when ``rounding`` says so (dl16.optional_rounding_args); None when not
    built."""
    fn = _kernel(SOFTMAX_FLOOR)
    if fn is None:
        return None

    def softmax(
        x: torch.Tensor,
        out: torch.Tensor,
        top: torch.Tensor,
        floor: float,
        code: float,
        rounding: RoundingArgs,
        threads: int,
    ) -> None:
        name = SOFTMAX_FLOOR
        _tensor(name, "x", x)
        if x.dim() < 1:
            raise NativeArgumentError(f"{name}: x must have a last dimension, got a 0-dim tensor")
        columns = x.shape[-1]
        rows = x.numel() // columns if columns else 0
        _tensor(name, "out", out)
        if out.shape != x.shape:
            raise NativeArgumentError(
                f"{name}: out must have x's shape {tuple(x.shape)}, got {tuple(out.shape)}"
            )
        _tensor(name, "top", top, numel=rows)
        floor = _number(name, "floor", floor, 0.0, 1.0)
        code = _number(name, "code", code, 0.0, FLOAT32_MAX)
        args = _rounding(name, rounding, required=False)
        if rows == 0:
            return
        _checked(
            SOFTMAX_FLOOR,
            fn,
            x.data_ptr(),
            out.data_ptr(),
            top.data_ptr(),
            rows,
            columns,
            floor,
            code,
            *args,
            _threads(name, threads),
        )

    return softmax


@lru_cache(maxsize=1)
def load_layer_norm() -> (
    Callable[
        [
            torch.Tensor,
            int,
            torch.Tensor | None,
            torch.Tensor | None,
            float,
            RoundingArgs,
            torch.Tensor,
            torch.Tensor,
            torch.Tensor,
            int,
        ],
        None,
    ]
    | None
):
    """``layer_norm(x, columns, weight or None, bias or None, eps, rounding, out, mean, rstd,
    threads)``: LayerNorm with DL16 statistics (kernels._layer_norm_dl16) over each row of
    ``columns`` contiguous float32 values of ``x`` into ``out`` (x's size), each row's mean and
    rstd written to ``mean`` and ``rstd`` (one value a row); None when not built."""
    fn = _kernel(LAYER_NORM)
    if fn is None:
        return None

    def layer_norm(
        x: torch.Tensor,
        columns: int,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
        rounding: RoundingArgs,
        out: torch.Tensor,
        mean: torch.Tensor,
        rstd: torch.Tensor,
        threads: int,
    ) -> None:
        name = LAYER_NORM
        _tensor(name, "x", x)
        columns = _integer(name, "columns", columns, 1)
        if x.numel() % columns:
            raise NativeArgumentError(
                f"{name}: x holds {x.numel()} values, not whole rows of {columns}"
            )
        rows = x.numel() // columns
        weight_ptr = _optional(name, "weight", weight, columns)
        bias_ptr = _optional(name, "bias", bias, columns)
        eps = _number(name, "eps", eps, -FLOAT32_MAX, FLOAT32_MAX)
        args = _rounding(name, rounding, required=True)
        for what, t, numel in (("out", out, x.numel()), ("mean", mean, rows), ("rstd", rstd, rows)):
            _tensor(name, what, t, numel=numel)
        if rows == 0:
            return
        _checked(
            LAYER_NORM,
            fn,
            x.data_ptr(),
            rows,
            columns,
            weight_ptr,
            bias_ptr,
            eps,
            *args,
            out.data_ptr(),
            mean.data_ptr(),
            rstd.data_ptr(),
            _threads(name, threads),
        )

    return layer_norm


@lru_cache(maxsize=1)
def load_aten_sum() -> Callable[[int, int, int, int, int], None] | None:
    """The kernel ``f(x_ptr, rows, columns, lanes, out_ptr)``: each row's sum of contiguous
    float32 values in the order of ATen's CPU sum with vectors of ``lanes`` lanes (the sum
    the row programs make, on its own: their probe compares it with torch's); None when not
    built. It takes addresses (hfadapt.spyre.eager.fusion's probe calls it so): the sizes
    and ``lanes`` are checked, the memory behind the addresses is the caller's to get right."""
    fn = _kernel(ATEN_SUM)
    if fn is None:
        return None

    def aten_sum(x_ptr: int, rows: int, columns: int, lanes: int, out_ptr: int) -> None:
        name = ATEN_SUM
        rows = _integer(name, "rows", rows, 0)
        columns = _integer(name, "columns", columns, 0)
        if lanes not in SUM_LANES:
            raise NativeArgumentError(f"{name}: lanes = {lanes!r}, must be one of {SUM_LANES}")
        if rows and not (x_ptr and out_ptr):
            raise NativeArgumentError(f"{name}: a null address for {rows} rows")
        _checked(ATEN_SUM, fn, x_ptr, rows, columns, lanes, out_ptr)

    return aten_sum


def _flat(structure: object, field: str) -> int:
    """The int64 position of ``field`` in ``structure`` (a ProgramNode/ProgramOperand)."""
    return int(getattr(structure, field).offset) // ctypes.sizeof(ctypes.c_int64)


# where each operand's fields sit in a node's int64s (read by position: this check runs on
# every program, and a list slice costs a fraction of a ctypes field access)
_OPERAND_FIELDS = [
    [
        _flat(ProgramNode, "operand") + k * PROGRAM_FIELDS_PER_OPERAND + _flat(ProgramOperand, f)
        for f in ("source", "kind", "index", "at")
    ]
    for k in range(2)
]


def _program_refs(name: str, desc: Any, inputs: Any, numbers: Any, nodes: int) -> None:
    """A row program's description (``nodes`` ProgramNodes, as a ctypes array of them or of
    their int64s) reads no input, number or node it was not given."""
    fields = list(
        (ctypes.c_int64 * (len(desc) * PROGRAM_FIELDS)).from_buffer(desc)
        if isinstance(desc, ctypes.Array) and desc._type_ is ProgramNode
        else desc
    )
    if len(fields) != nodes * PROGRAM_FIELDS:
        raise NativeArgumentError(
            f"{name}: desc holds {len(fields)} fields, {nodes} nodes need {nodes * PROGRAM_FIELDS}"
        )
    addresses = list(inputs)
    n_inputs, n_numbers = len(addresses), len(numbers)

    def present(j: int) -> bool:
        return 0 <= j < n_inputs and addresses[j] != 0

    for i in range(nodes):
        d = fields[i * PROGRAM_FIELDS : (i + 1) * PROGRAM_FIELDS]
        for where in _OPERAND_FIELDS:
            source, kind, index, at = (d[j] for j in where)
            if source == FROM_INPUT and not (
                present(index) and (kind != PROGRAM_GATHER or present(at))
            ):
                raise NativeArgumentError(
                    f"{name}: node {i} reads input {index} (at {at}); {n_inputs} given, "
                    f"at addresses {addresses}"
                )
            if source == FROM_NUMBER and not 0 <= index < n_numbers:
                raise NativeArgumentError(
                    f"{name}: node {i} reads number {index}; {n_numbers} given"
                )


@lru_cache(maxsize=1)
def load_row_program() -> Callable[..., None] | None:
    """The kernel ``f(rows, columns, nodes, desc, inputs, numbers, outs, lanes, max_finite,
    below_min_normal, dropped, overflow, threads)``: a row program of the eager device
    (hfadapt.spyre.eager.fusion, which writes ``desc``: a ctypes array of ProgramNode, or of
    their int64s; ctypes arrays of int64 for ``inputs`` (addresses) and ``outs``, of float for
    ``numbers``); None when not built. The
    sizes, ``lanes``, the rounding and every reference the description makes (an input, a
    number, an earlier node) are checked; the memory behind the addresses is the caller's."""
    fn = _kernel(ROW_PROGRAM)
    if fn is None:
        return None

    def row_program(
        rows: int,
        columns: int,
        nodes: int,
        desc: Any,
        inputs: Any,
        numbers: Any,
        outs: Any,
        lanes: int,
        *rest: Any,
    ) -> None:
        name = ROW_PROGRAM
        rows = _integer(name, "rows", rows, 0)
        columns = _integer(name, "columns", columns, 1)
        nodes = _integer(name, "nodes", nodes, 0)
        if lanes not in SUM_LANES:
            raise NativeArgumentError(f"{name}: lanes = {lanes!r}, must be one of {SUM_LANES}")
        if len(rest) != 5:
            raise NativeArgumentError(
                f"{name}: takes the four rounding arguments and threads after lanes, got "
                f"{len(rest)} values"
            )
        args = _rounding(name, tuple(rest[:4]), required=True)
        threads = _threads(name, rest[4])
        _program_refs(name, desc, inputs, numbers, nodes)
        if len(outs) != nodes:
            raise NativeArgumentError(f"{name}: outs holds {len(outs)} entries for {nodes} nodes")
        _checked(
            ROW_PROGRAM,
            fn,
            rows,
            columns,
            nodes,
            desc,
            inputs,
            numbers,
            outs,
            lanes,
            *args,
            threads,
        )

    return row_program


def amx_padded(n: int) -> int:
    """``n`` padded to whole AMX_BLOCK blocks."""
    return -(-n // AMX_BLOCK) * AMX_BLOCK


AmxPack = Callable[[torch.Tensor, int, torch.Tensor, int], int]
AmxMatmul = Callable[
    [
        torch.Tensor,
        torch.Tensor,
        int,
        int,
        int,
        int,
        int,
        torch.Tensor | None,
        RoundingArgs,
        torch.Tensor,
        int,
    ],
    None,
]


@lru_cache(maxsize=1)
def load_amx() -> tuple[AmxPack, AmxMatmul] | None:
    """The AMX product kernels ``(pack, matmul)`` when this machine and process can run them
    (the CPU has AMX's bf16 tiles and the kernel grants their state), else None:
    ``pack(lines, role, out, threads)`` splits a 2-D float32 operand, one line a row of the
    left operand (role 0) or a column of the right one (role 1: pass the right operand
    transposed), any strides, into ``out``'s tiles (int16, 2 * amx_padded(lines) *
    amx_padded(depth) values) and returns how many values do not split exactly;
    ``matmul(a_tiles, b_tiles, m, n, k, piece, mantissa_bits, bias or None, rounding, out,
    threads)`` makes the chunked product of packed operands into ``out`` (m * n contiguous
    float32 values; the layouts and the steps are written in dl16_kernels.c)."""
    if not settings.native_amx():
        return None
    ready, pack_fn, matmul_fn = _kernel(AMX_READY), _kernel(AMX_PACK), _kernel(AMX_MATMUL)
    if ready is None or pack_fn is None or matmul_fn is None or not ready():
        return None
    return _amx_pack(pack_fn), _amx_matmul(matmul_fn)


def _amx_pack(pack_fn: Any) -> AmxPack:
    """load_amx's ``pack``: its arguments checked, then the kernel ``pack_fn`` called."""

    def pack(lines: torch.Tensor, role: int, out: torch.Tensor, threads: int) -> int:
        name = AMX_PACK
        _tensor(name, "lines", lines, strided=True)
        if lines.dim() != 2:
            raise NativeArgumentError(
                f"{name}: lines must be 2-D (lines, depth), got shape {tuple(lines.shape)}"
            )
        if role not in (0, 1):
            raise NativeArgumentError(f"{name}: role = {role!r}, must be 0 (left) or 1 (right)")
        rows, depth = lines.shape
        rows_p, depth_p = amx_padded(rows), amx_padded(depth)
        _tensor(name, "out", out, dtype=torch.int16, at_least=2 * rows_p * depth_p)
        bad = int(
            pack_fn(
                lines.data_ptr(),
                rows,
                depth,
                *lines.stride(),
                role,
                rows_p,
                depth_p,
                out.data_ptr(),
                _threads(name, threads),
            )
        )
        if bad < 0:
            raise refused(AMX_PACK, bad)
        return bad

    return pack


def _amx_matmul(matmul_fn: Any) -> AmxMatmul:
    """load_amx's ``matmul``: its arguments checked, then the kernel ``matmul_fn`` called."""

    def matmul(
        a_tiles: torch.Tensor,
        b_tiles: torch.Tensor,
        m: int,
        n: int,
        k: int,
        piece: int,
        mantissa_bits: int,
        bias: torch.Tensor | None,
        rounding: RoundingArgs,
        out: torch.Tensor,
        threads: int,
    ) -> None:
        name = AMX_MATMUL
        m, n = _integer(name, "m", m, 1), _integer(name, "n", n, 1)
        depth_p = amx_padded(_integer(name, "k", k, 1))
        _tensor(name, "a_tiles", a_tiles, dtype=torch.int16, at_least=2 * amx_padded(m) * depth_p)
        _tensor(name, "b_tiles", b_tiles, dtype=torch.int16, at_least=2 * amx_padded(n) * depth_p)
        piece = _integer(name, "piece", piece, AMX_BLOCK)
        if piece % AMX_BLOCK:
            raise NativeArgumentError(
                f"{name}: piece = {piece}, must be a whole number of {AMX_BLOCK}-element blocks"
            )
        dropped = _dropped(name, mantissa_bits)
        bias_ptr = _optional(name, "bias", bias, n)
        args = _rounding(name, rounding, required=False)
        _tensor(name, "out", out, numel=m * n)
        _checked(
            AMX_MATMUL,
            matmul_fn,
            a_tiles.data_ptr(),
            b_tiles.data_ptr(),
            m,
            n,
            depth_p,
            piece,
            dropped,
            bias_ptr,
            *args,
            out.data_ptr(),
            _threads(name, threads),
        )

    return matmul


def available() -> bool:
    return load() is not None


# -- what this process uses ----------------------------------------------------------------


@dataclass(frozen=True)
class NativeStatus:
    """Whether this process uses the C kernels and AMX's tiles, and why not (``hfadapt cache
    info``): ``kernels`` is built, failed (``record`` holds the compiler's message), no
    compiler, load failed or disabled (HFADAPT_NATIVE_DL16=0); ``amx`` is available,
    unavailable (this CPU lacks the tiles or the kernel does not grant them), no kernels, or
    disabled (HFADAPT_NATIVE_AMX=0)."""

    kernels: str
    library: Path | None
    record: Path | None
    compiler: str | None
    message: str
    amx: str
    folder: Path
    failure_records: int

    def as_dict(self) -> dict[str, object]:
        return {
            "kernels": self.kernels,
            "library": str(self.library) if self.library else None,
            "record": str(self.record) if self.record else None,
            "compiler": self.compiler,
            "message": self.message,
            "amx": self.amx,
            "path": str(self.folder),
            "failure_records": self.failure_records,
        }


def native_status() -> NativeStatus:
    """What this process has (builds the library when it is not built yet, as a first use
    would)."""
    state = native_build.state()
    if not settings.native_amx():
        amx = "disabled"
    elif state.state != "built":
        amx = "no kernels"
    else:
        ready = _kernel(AMX_READY)
        amx = "available" if ready is not None and ready() else "unavailable"
    return NativeStatus(
        state.state,
        state.library,
        state.record,
        state.compiler,
        state.message,
        amx,
        cache_dir(),
        len(native_build.failure_records()),
    )
