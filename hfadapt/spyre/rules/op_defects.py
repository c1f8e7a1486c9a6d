"""The card's silent failures that live in one op (profile ``defects`` whose trigger is named
here): the op lowers and computes the wrong numbers whether it runs in a compiled graph or as
an eager op (the card's eager kernels are per-op compiles: torch-spyre ``ops/eager.py``), so the
eager device and the compile backend share these. A trigger decides from the op's name and its
arguments' shapes and dtypes (FakeTensors in a graph, the logical tensors in eager), and its
``compute`` takes the op's arguments as the device holds them (float32 DL16 values) and returns
what the card returns.

- ``fp32_row_reduction_past_cores`` (torch-spyre#3804, #3087): an fp32 ``sum``/``mean`` over the
  last dimension with more than 32 (SENCORES) rows. Rows are dealt to the 32 cores in blocks of
  ceil(rows / 32); in each block only the first row is right, the others come back holding the
  reduction of the second half of their row only (inferred: it gives the source's reproducer
  exactly, 32 of 64 rows 0.0 where the first half holds the data, and #3087's rows at half
  their mean; #3804's 22 of 33 wrong rows is not reproduced, 16 are).
- ``rank5_full_reduction`` (torch-spyre#1707): fp16/bf16 ``sum``/``mean`` over all five dims
  of a rank-5 tensor. The source gives no wrong value; modelled as the reduction of the first
  slice of dimension 0 only (inferred).
- ``exp_unaligned_stick`` (torch-spyre#3799; #3339's mechanism): fp16 ``exp`` whose last dim
  spans more than one stick and is not a whole number of sticks: element j reads element
  j mod 64 (inferred mapping).
- ``rms_norm_noncontiguous_view`` (torch-spyre#1781): the native rms_norm on a permuted,
  non-contiguous 4-D view normalizes the data in memory order, read as if contiguous.
- ``eager_fp32_cast_staggered`` (torch-spyre#2314): an eager fp32 -> fp16/bf16 cast on the
  device returns the elements in the conversion's staggered arrangement (two 32-element fp32
  sticks interleaved into one 64-element DL16 stick; torch-spyre ``_inductor/constants.py``
  ``STAGGERED_EAS``: the compiler restores the order, a standalone eager cast does not). The
  arrangement is inferred; it gives the source's statistics (random data: about 90% of
  elements off by more than atol = rtol = 0.1, max difference about 5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hfadapt.spyre.numerics.dl16 import STICK_ELEMENTS

SENCORES = 32  # cores a reduction's rows are dealt to (#3804: wrong past exactly 32 rows)
FP32_STICK = STICK_ELEMENTS // 2  # fp32 elements in one 128-byte stick

Values = Sequence[Any]


def _packet(op: str) -> str:
    return op.split(".", 1)[0]


def _arg(args: Values, kwargs: dict[str, object], i: int, name: str, default: object = None) -> Any:
    if name in kwargs:
        return kwargs[name]
    return args[i] if len(args) > i else default


def _shape(t: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(s) for s in t.shape)
    except (TypeError, ValueError, AttributeError):
        return None


def reduced_dims(args: Values, kwargs: dict[str, object], ndim: int) -> tuple[int, ...]:
    """The dims a sum/mean reduces (all of them when no dim is given)."""
    dim = _arg(args, kwargs, 1, "dim", None)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    dims = dim if isinstance(dim, (list, tuple)) else [dim]
    return tuple(sorted({int(d) % ndim for d in dims})) if ndim else ()


def _reduction_dtype(args: Values, kwargs: dict[str, object]) -> torch.dtype | None:
    dtype = _arg(args, kwargs, 3, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else None


def _is_mean(op: str) -> bool:
    return _packet(op) == "aten::mean"


def _keepdim(args: Values, kwargs: dict[str, object]) -> bool:
    return bool(_arg(args, kwargs, 2, "keepdim", False))


# -- fp32 last-dim reductions past 32 rows (#3804) ---------------------------------------------


def _fp32_rows_matches(op: str, args: Values, kwargs: dict[str, object]) -> bool:
    if _packet(op) not in ("aten::sum", "aten::mean") or not args:
        return False
    x, shape = args[0], _shape(args[0])
    if shape is None or len(shape) < 2 or getattr(x, "dtype", None) != torch.float32:
        return False
    if reduced_dims(args, kwargs, len(shape)) != (len(shape) - 1,):
        return False
    rows = math.prod(shape[:-1])
    return rows > SENCORES and shape[-1] >= 2


def fp32_rows_compute(op: str, args: Values, kwargs: dict[str, object]) -> torch.Tensor:
    x = args[0]
    n = x.shape[-1]
    flat = x.reshape(-1, n)
    full = flat.sum(-1)
    part = flat[:, n // 2 :].sum(-1)  # a wrong row: its second half's partial only
    rows = flat.shape[0]
    block = -(-rows // SENCORES)
    wrong = (torch.arange(rows) % block) != 0
    out = torch.where(wrong, part, full)
    if _is_mean(op):
        out = out / n
    out = out.reshape(x.shape[:-1])
    return out.unsqueeze(-1) if _keepdim(args, kwargs) else out


# -- rank-5 all-dims sum/mean (#1707) ----------------------------------------------------------


def _rank5_matches(op: str, args: Values, kwargs: dict[str, object]) -> bool:
    if _packet(op) not in ("aten::sum", "aten::mean") or not args:
        return False
    x, shape = args[0], _shape(args[0])
    if shape is None or len(shape) != 5:
        return False
    if getattr(x, "dtype", None) not in (torch.float16, torch.bfloat16):
        return False
    return reduced_dims(args, kwargs, 5) == (0, 1, 2, 3, 4) and shape[0] > 1


def rank5_compute(op: str, args: Values, kwargs: dict[str, object]) -> torch.Tensor:
    x = args[0]
    out: torch.Tensor = x[0].sum()
    if _is_mean(op):
        out = out / x.numel()
    return out.reshape((1,) * 5) if _keepdim(args, kwargs) else out


# -- exp past the first stick (#3799) ----------------------------------------------------------


def _exp_matches(op: str, args: Values, kwargs: dict[str, object]) -> bool:
    if _packet(op) != "aten::exp" or not args:
        return False
    shape = _shape(args[0])
    if not shape or getattr(args[0], "dtype", None) != torch.float16:
        return False
    return shape[-1] > STICK_ELEMENTS and shape[-1] % STICK_ELEMENTS != 0


def exp_first_stick_reread(x: torch.Tensor) -> torch.Tensor:
    """exp as the card computes it on a row wider than a stick and not a whole number of
    sticks: element j is exp(x[j mod 64])."""
    index = torch.arange(x.shape[-1], device=x.device) % STICK_ELEMENTS
    return torch.exp(x.index_select(-1, index))


def _exp_compute(op: str, args: Values, kwargs: dict[str, object]) -> torch.Tensor:
    return exp_first_stick_reread(args[0])


# -- the native rms_norm on a non-contiguous view (#1781) --------------------------------------


def memory_order(t: Any) -> tuple[int, ...] | None:
    """The dimension order of ``t``'s storage when ``t`` is a permutation of a dense tensor that
    is not contiguous; None when it is contiguous, broadcast (zero strides) or has gaps."""
    if t.is_contiguous() or t.numel() == 0:
        return None
    sizes, strides = list(t.shape), list(t.stride())
    if any(s == 0 for s, n in zip(strides, sizes, strict=True) if n > 1):
        return None
    order = tuple(sorted(range(t.dim()), key=lambda d: (-strides[d], -sizes[d])))
    expected = 1
    for d in reversed(order):
        if sizes[d] > 1 and strides[d] != expected:
            return None
        expected *= sizes[d]
    return order if order != tuple(range(t.dim())) else None


def misread_layout(x: torch.Tensor, order: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor:
    """``x`` as a kernel that ignores its strides sees it: its data in memory order, read as a
    contiguous tensor of its own logical shape."""
    # .contiguous(): when the permuted shape equals the logical one (e.g. S == H), reshape is a
    # no-op view and the value would stay a strided view that later views cannot take
    return x.permute(order).reshape(shape).contiguous()


def _rms_noncontiguous_matches(op: str, args: Values, kwargs: dict[str, object]) -> bool:
    if _packet(op) not in ("aten::rms_norm", "aten::_fused_rms_norm") or not args:
        return False
    x = args[0]
    if _shape(x) is None or x.dim() != 4 or not x.is_floating_point():
        return False
    try:
        return memory_order(x) is not None
    except (TypeError, RuntimeError):  # symbolic strides
        return False


# -- eager fp32 -> fp16/bf16 casts (#2314) -----------------------------------------------------


def _cast_matches(op: str, args: Values, kwargs: dict[str, Any]) -> bool:
    if _packet(op) != "aten::_to_copy" or not args:
        return False
    src = args[0]
    dst = kwargs.get("dtype")
    device = kwargs.get("device")
    if device is not None and torch.device(device).type not in ("spyre", "privateuseone"):
        return False  # a transfer to the host converts there
    shape = _shape(src)
    return (
        getattr(src, "dtype", None) == torch.float32
        and dst in (torch.float16, torch.bfloat16)
        and shape is not None
        and len(shape) > 0
        and shape[-1] >= STICK_ELEMENTS
    )


def staggered(x: torch.Tensor) -> torch.Tensor:
    """The conversion's staggered arrangement read as if standard: in each whole 64-element
    stick of the last dim, element j holds the source's (j % 2) * 32 + j // 2; a partial last
    stick keeps its order."""
    n = x.shape[-1]
    whole = n // STICK_ELEMENTS * STICK_ELEMENTS
    j = torch.arange(STICK_ELEMENTS)
    within = (j % 2) * FP32_STICK + j // 2
    index = (torch.arange(0, whole, STICK_ELEMENTS).unsqueeze(1) + within).reshape(-1)
    index = torch.cat([index, torch.arange(whole, n)])
    return x.index_select(-1, index)


def _cast_compute(op: str, args: Values, kwargs: dict[str, object]) -> torch.Tensor:
    return staggered(args[0])


@dataclass(frozen=True)
class OpDefect:
    """A per-op trigger: ``matches(op, args, kwargs)`` on shapes and dtypes; ``compute(op,
    args, kwargs)`` on the held data (None: the op misreads its first input, see
    ``misread_input``)."""

    ops: frozenset[str]
    matches: Callable[[str, Values, dict[str, Any]], bool]
    compute: Callable[[str, Values, dict[str, Any]], torch.Tensor] | None = None
    misread_input: bool = False


TRIGGERS: dict[str, OpDefect] = {
    "fp32_row_reduction_past_cores": OpDefect(
        frozenset({"aten::sum", "aten::mean"}), _fp32_rows_matches, fp32_rows_compute
    ),
    "rank5_full_reduction": OpDefect(
        frozenset({"aten::sum", "aten::mean"}), _rank5_matches, rank5_compute
    ),
    "exp_unaligned_stick": OpDefect(frozenset({"aten::exp"}), _exp_matches, _exp_compute),
    "rms_norm_noncontiguous_view": OpDefect(
        frozenset({"aten::rms_norm", "aten::_fused_rms_norm"}),
        _rms_noncontiguous_matches,
        misread_input=True,
    ),
    "eager_fp32_cast_staggered": OpDefect(
        frozenset({"aten::_to_copy"}), _cast_matches, _cast_compute
    ),
}


def candidates(op: str, triggers: Sequence[str]) -> list[str]:
    """The per-op triggers (of ``triggers``) that can fire for ``op`` at all."""
    packet = _packet(op)
    return [t for t in triggers if t in TRIGGERS and packet in TRIGGERS[t].ops]
