"""Ops that make no new value: their DL16 output holds only values their inputs (or their
DL16-rounded scalar arguments) already hold, so the device's rounding after them changes
nothing and is skipped. One list for the eager device and the compiled program, and one
guard: every floating-point input already has the output's dtype. A wider input's value (an
fp32 0-dim tensor promoted into an fp16 ``where``) is not on the DL16 grid, and a real cast to
the output's dtype rounds it, so then the output is rounded like any other."""

from __future__ import annotations

from collections.abc import Iterable

import torch

VALUE_PRESERVING = frozenset(
    {
        # copies and arrangements
        "aten::_unsafe_view",  # aliases its input, but its schema does not say so
        "aten::clone",
        "aten::cat",
        "aten::stack",
        "aten::repeat",
        "aten::constant_pad_nd",  # its fill value is a device number (DL16) like any other
        "aten::lift_fresh_copy",
        # selections
        "aten::index_select",
        "aten::gather",
        "aten::embedding",
        "aten::where",
        "aten::topk",
        "aten::maximum",
        "aten::minimum",
        "aten::amax",
        "aten::amin",
        "aten::max",
        "aten::min",
        "aten::relu",
        "aten::clamp",
        "aten::clamp_min",
        "aten::clamp_max",
        "aten::hardtanh",
        # exact on every DL16 value
        "aten::neg",
        "aten::abs",
        "aten::sign",
        "aten::floor",
        "aten::ceil",
        # factories: their fill is a device number
        "aten::full",
        "aten::full_like",
        "aten::new_full",
        "aten::scalar_tensor",
        "aten::zeros",
        "aten::zeros_like",
        "aten::new_zeros",
        "aten::ones",
        "aten::ones_like",
        "aten::new_ones",
        "aten::fill",
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
    }
)


def preserves_values(op: str, input_dtypes: Iterable[torch.dtype], dtype: torch.dtype) -> bool:
    """Whether the op ``op`` ("aten::where", an overload name or its packet) leaves a result
    of ``dtype`` on the DL16 grid when its tensor inputs have ``input_dtypes``."""
    return op.split(".", 1)[0] in VALUE_PRESERVING and all(
        d == dtype for d in input_dtypes if d.is_floating_point
    )
