"""End-to-end measures of an adapted model against the stock one: the minimum per-token cosine
over real (non-pad) tokens, and the relative error of the token vectors' values (so that a
result off by a scale, which a cosine cannot see, fails)."""

from __future__ import annotations

from typing import Any

import torch

# End-to-end thresholds (docs/design.md, "Validating an adapter").
CPU_COSINE_MIN = 0.999
DEVICE_COSINE_MIN = 0.99
# Relative error of the device's token vectors against the CPU reference: fp16/DL16 rounding
# through a whole model stays near 1e-2; a result scaled by 2 % or more does not pass.
DEVICE_REL_ERR_MAX = 0.05


def run_forward(model: Any, inputs: Any) -> Any:
    with torch.no_grad():
        return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


def main_tensor(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state") and out.last_hidden_state is not None:
        return out.last_hidden_state  # type: ignore[no-any-return]
    values = out.values() if isinstance(out, dict) else out
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    raise TypeError(f"no tensor in the model output ({type(out).__name__})")


def _rows(
    ref: Any, cand: Any, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    a, b = main_tensor(ref).detach().cpu().double(), main_tensor(cand).detach().cpu().double()
    if a.shape != b.shape:
        return None
    if mask is not None and a.dim() == 3 and tuple(mask.shape) == tuple(a.shape[:2]):
        a, b = a[mask.bool()], b[mask.bool()]
    return a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])


def token_cosine(ref: Any, cand: Any, mask: torch.Tensor | None) -> float:
    """Minimum cosine over tokens (rows of the last dimension), pads excluded; two all-zero
    rows count as identical; NaN when the shapes differ."""
    rows = _rows(ref, cand, mask)
    if rows is None:
        return float("nan")
    a, b = rows
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    cos = (a * b).sum(-1) / (na * nb).clamp(min=1e-300)
    cos = torch.where((na == 0) & (nb == 0), torch.ones_like(cos), cos)
    return float(cos.min()) if cos.numel() else float("nan")


def relative_error(ref: Any, cand: Any, mask: torch.Tensor | None) -> float:
    """||cand - ref|| / ||ref|| over the real tokens (inf for a shape mismatch or a non-finite
    candidate where the reference is finite)."""
    rows = _rows(ref, cand, mask)
    if rows is None:
        return float("inf")
    a, b = rows
    if not bool(torch.isfinite(b[torch.isfinite(a)]).all()):
        return float("inf")
    denom = float(a.norm())
    return float((b - a).norm()) / denom if denom > 0 else float((b - a).norm())


__all__ = [
    "CPU_COSINE_MIN",
    "DEVICE_COSINE_MIN",
    "DEVICE_REL_ERR_MAX",
    "main_tensor",
    "relative_error",
    "run_forward",
    "token_cosine",
]
