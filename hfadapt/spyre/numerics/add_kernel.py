"""The card's DL16 add, which returns fp16's smallest normal for 0 + 0 (torch-spyre#1972;
profile ``numerics.add_zero_code``): every other sum is the ordinary fp32 add rounded to DL16.
A kernel in the form hfadapt.spyre.numerics.kernels takes (held float32 DL16 values, the format)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hfadapt.spyre.numerics.dl16 import DL16Format, round_dl16_

AddKernel = Callable[[Sequence[Any], dict[str, Any], DL16Format], Any]


def _operand(value: Any, like: torch.Tensor) -> torch.Tensor:
    return (
        value if isinstance(value, torch.Tensor) else torch.tensor(float(value), dtype=like.dtype)
    )


def add_zero_code_kernel(code: float) -> AddKernel:
    """aten::add.Tensor(self, other, alpha=1) whose result is ``code`` wherever both operands
    are zero (after broadcasting), rounded to DL16."""

    def add(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
        a = args[0]
        b = _operand(kwargs.get("other", args[1] if len(args) > 1 else 0.0), a)
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        out = round_dl16_(torch.add(a, b, alpha=alpha).float(), fmt)
        both = (a == 0) & (b == 0)
        if bool(both.any()):
            out = torch.where(both, torch.tensor(code, dtype=out.dtype), out)
        return out

    return add


def add_zero_code_inplace(code: float) -> AddKernel:
    """aten::add_.Tensor: ``add_zero_code_kernel`` written back into ``self``."""
    add = add_zero_code_kernel(code)

    def add_(args: Sequence[Any], kwargs: dict[str, Any], fmt: DL16Format) -> Any:
        return args[0].copy_(add(args, kwargs, fmt))

    return add_
