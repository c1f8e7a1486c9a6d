"""End-to-end measures of an adapted model against the stock one: the minimum per-token cosine
over real (non-pad) tokens, and the relative error of the token vectors' values (so that a
result off by a scale, which a cosine cannot see, fails). On the device a draft is judged
against the same model without it (:func:`judge_device`): a model another defect already
corrupts must not refuse a right draft, and a draft must make nothing worse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# End-to-end thresholds (docs/design.md, "Validating an adapter").
CPU_COSINE_MIN = 0.999
DEVICE_COSINE_MIN = 0.99
# Relative error of the device's token vectors against the CPU reference: fp16/DL16 rounding
# through a whole model stays near 1e-2; a result scaled by 2 % or more does not pass.
DEVICE_REL_ERR_MAX = 0.05
# When the model without the draft already misses those on the device (another defect corrupts
# it), the draft is judged against that run instead: it may add no more error than a clean
# model may have in all (1 - DEVICE_COSINE_MIN of cosine, DEVICE_REL_ERR_MAX of relative error
# in quadrature): the same budget it would have on a model with nothing else wrong.
# A draft for a silent device defect must make the model better: when another failure keeps the
# model outside the thresholds, closer to the reference by this much on both measures.
GAIN_MIN = 1e-3


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
    ref: object, cand: object, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor] | None:
    a, b = main_tensor(ref).detach().cpu().double(), main_tensor(cand).detach().cpu().double()
    if a.shape != b.shape:
        return None
    if mask is not None and a.dim() == 3 and tuple(mask.shape) == tuple(a.shape[:2]):
        a, b = a[mask.bool()], b[mask.bool()]
    return a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])


def token_cosine(ref: object, cand: object, mask: torch.Tensor | None) -> float:
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


def relative_error(ref: object, cand: object, mask: torch.Tensor | None) -> float:
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


@dataclass(frozen=True)
class DeviceVerdict:
    """The model on the device with the draft and without it (the same run), each against the
    CPU reference: min per-token cosine and relative error."""

    cosine: float
    rel_err: float
    baseline_cosine: float
    baseline_rel_err: float

    @property
    def baseline_ok(self) -> bool:
        return (
            self.baseline_cosine >= DEVICE_COSINE_MIN
            and self.baseline_rel_err <= DEVICE_REL_ERR_MAX
        )

    @property
    def meets_thresholds(self) -> bool:
        return self.cosine >= DEVICE_COSINE_MIN and self.rel_err <= DEVICE_REL_ERR_MAX

    @property
    def no_worse(self) -> bool:
        """The draft adds no more error than a clean model may have in all: errors from
        different causes add in quadrature (relative error) and 1 - cosine adds."""
        return (
            1.0 - self.cosine <= (1.0 - self.baseline_cosine) + (1.0 - DEVICE_COSINE_MIN) + 1e-9
            and self.rel_err**2 <= self.baseline_rel_err**2 + DEVICE_REL_ERR_MAX**2
        )

    @property
    def ok(self) -> bool:
        """Within the thresholds; or, when the model without the draft already misses them,
        no worse than it."""
        return self.meets_thresholds or (not self.baseline_ok and self.no_worse)

    @property
    def better(self) -> bool:
        """For a device defect's draft: the model got better. Within the thresholds (and no
        worse than without the draft when that run met them too), or, when another failure
        keeps it outside them, closer to the CPU reference on both measures by ``GAIN_MIN``."""
        if self.meets_thresholds:
            return not self.baseline_ok or self.no_worse
        return (
            self.cosine >= self.baseline_cosine + GAIN_MIN
            and self.rel_err <= self.baseline_rel_err - GAIN_MIN
        )

    def better_text(self) -> str:
        numbers = self.numbers()
        if self.better:
            if self.meets_thresholds:
                return f"{numbers}: the model got better, within >= {DEVICE_COSINE_MIN}, <= {DEVICE_REL_ERR_MAX}"
            return (
                f"{numbers}: the model got better (another failure keeps it outside >= "
                f"{DEVICE_COSINE_MIN}, <= {DEVICE_REL_ERR_MAX})"
            )
        if self.meets_thresholds:
            return f"{numbers}: within the thresholds, but worse than without the draft"
        return (
            f"{numbers}: the model did not get better (it must reach >= {DEVICE_COSINE_MIN} and "
            f"<= {DEVICE_REL_ERR_MAX}, or gain {GAIN_MIN:g} on both measures)"
        )

    def numbers(self) -> str:
        return (
            f"device vs CPU reference with the draft: min per-token cosine {self.cosine:.6f}, "
            f"relative error {self.rel_err:.4f}; without it (the same model on the device): "
            f"{self.baseline_cosine:.6f}, {self.baseline_rel_err:.4f}"
        )

    def text(self) -> str:
        numbers = (
            f"device vs CPU reference with the draft: min per-token cosine {self.cosine:.6f}, "
            f"relative error {self.rel_err:.4f}; without it (the same model on the device): "
            f"{self.baseline_cosine:.6f}, {self.baseline_rel_err:.4f}"
        )
        if self.meets_thresholds:
            return f"{numbers}; within >= {DEVICE_COSINE_MIN}, <= {DEVICE_REL_ERR_MAX}"
        if self.baseline_ok:
            return (
                f"{numbers}: the model passes (>= {DEVICE_COSINE_MIN}, <= {DEVICE_REL_ERR_MAX}) "
                "without the draft and fails with it"
            )
        if self.no_worse:
            return (
                f"{numbers}: the model already fails end to end without the draft (another "
                f"defect); the draft adds no more error than a clean model may have "
                f"({1.0 - DEVICE_COSINE_MIN:.2g} of cosine, {DEVICE_REL_ERR_MAX} of relative error)"
            )
        return (
            f"{numbers}: the model already fails end to end without the draft (another defect, "
            "not the draft's to fix), and the draft makes it worse: it adds more error than a clean "
            f"model may have in all ({1.0 - DEVICE_COSINE_MIN:.2g} of cosine, "
            f"{DEVICE_REL_ERR_MAX} of relative error in quadrature)"
        )

    def output(self) -> dict[str, Any]:
        return {
            "device_vs_cpu_min_token_cosine": self.cosine,
            "device_relative_error": self.rel_err,
            "baseline_device_vs_cpu_min_token_cosine": self.baseline_cosine,
            "baseline_device_relative_error": self.baseline_rel_err,
            "device_threshold": DEVICE_COSINE_MIN,
            "device_relative_error_max": DEVICE_REL_ERR_MAX,
            "baseline_ok": self.baseline_ok,
        }


def judge_device(
    stock: object, with_draft: object, without_draft: object, mask: torch.Tensor | None
) -> DeviceVerdict:
    """The device outputs with and without the draft, each against the stock CPU outputs."""
    return DeviceVerdict(
        cosine=token_cosine(stock, with_draft, mask),
        rel_err=relative_error(stock, with_draft, mask),
        baseline_cosine=token_cosine(stock, without_draft, mask),
        baseline_rel_err=relative_error(stock, without_draft, mask),
    )


__all__ = [
    "CPU_COSINE_MIN",
    "DEVICE_COSINE_MIN",
    "DEVICE_REL_ERR_MAX",
    "GAIN_MIN",
    "DeviceVerdict",
    "judge_device",
    "main_tensor",
    "relative_error",
    "run_forward",
    "token_cosine",
]
