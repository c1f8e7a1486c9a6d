"""How close a run came to its bounds (docs/design.md, "Verdicts"): each bounded metric's worst
measured value against its bound, the share of the bound it used, and the run's margin, the
largest share over them: 0 a perfect match, 1 exactly at a bound, above 1 past it (failed).
A bound on a value that must stay high and is perfect at 1 (a cosine, a top-k overlap) is used
by the value's distance from 1, ``(1 - value) / (1 - bound)``; a bound on an error by
``value / bound``. Recorded as ``evidence["margin"]``; ``read_margin`` reads it back without
torch."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hfadapt.judge.evidence_types import BoundUseEvidence, MarginEvidence

if TYPE_CHECKING:  # reading a stored margin (hfadapt show, the report) imports no torch
    from hfadapt.judge.metrics import Metrics

__all__ = ["BoundUse", "Margin", "margin_of", "read_margin", "widest"]


@dataclass(frozen=True)
class BoundUse:
    """One bounded metric's worst measured value and its bound."""

    metric: str  # "min token cosine", "sentence_embedding: max sentence norm error"
    value: float
    bound: float
    at_least: bool  # True: value >= bound passes (perfect at 1); False: value <= bound

    def __post_init__(self) -> None:
        room = 1.0 - self.bound if self.at_least else self.bound
        if not room > 0:
            raise ValueError(f"{self.metric}: bound {self.bound} leaves no room to use")

    @property
    def share(self) -> float:
        """The share of the bound used: 0 perfect, 1 at the bound, above 1 past it."""
        used = (1.0 - self.value) / (1.0 - self.bound) if self.at_least else self.value / self.bound
        return max(0.0, used)  # a cosine rounded to 1 + 1e-16 uses nothing, not less

    @property
    def headroom(self) -> float:
        """How far the value sits inside its bound, in the metric's units (negative: past it)."""
        return self.value - self.bound if self.at_least else self.bound - self.value

    def text(self) -> str:
        used = f"{_percent(self.share)} of the bound used"
        if self.at_least:
            side = "above" if self.headroom >= 0 else "below"
            return (
                f"{self.metric} {self.value:.6f}, {abs(self.headroom):.2g} {side} its bound "
                f"{self.bound:g} ({used})"
            )
        return f"{self.metric} {self.value:.2%} of {self.bound:.2%} ({used})"

    def to_dict(self) -> BoundUseEvidence:
        return {
            "metric": self.metric,
            "value": self.value,
            "bound": self.bound,
            "at_least": self.at_least,
            "share": self.share,
            "headroom": self.headroom,
        }


def _percent(share: float) -> str:
    return f"{share:.0%}" if share >= 0.1 else f"{share:.1%}"


@dataclass(frozen=True)
class Margin:
    """A run's bounded metrics and the largest share of a bound it used (module doc)."""

    uses: tuple[BoundUse, ...]
    nonfinite: bool = False  # NaN or inf in a device output: no bound applies, the run fails
    unmeasured: tuple[str, ...] = ()  # bounded metrics the run has no value for
    task: str | None = None  # a model with task adapters: the task this margin is of

    @property
    def worst(self) -> BoundUse | None:
        return max(self.uses, key=lambda u: u.share, default=None)

    @property
    def share(self) -> float | None:
        """The largest share of a bound used; None when NaN/inf came out or nothing was measured."""
        worst = self.worst
        return None if self.nonfinite or worst is None else worst.share

    def text(self) -> str:
        """One line: the share at worst, then each metric (``hfadapt show`` and ``diagnose``)."""
        of_task = f" (task {self.task!r})" if self.task else ""
        if self.nonfinite:
            return f"no margin{of_task}: the device output holds NaN or inf"
        share, worst = self.share, self.worst
        if share is None or worst is None:
            return f"no bounded metric was measured{of_task}"
        head = f"{_percent(share)} of the bound used at worst{of_task} ({worst.metric})"
        ordered = sorted(self.uses, key=lambda u: -u.share)
        missing = f"; not measured: {', '.join(self.unmeasured)}" if self.unmeasured else ""
        return head + "; " + "; ".join(u.text() for u in ordered) + missing

    def to_dict(self) -> MarginEvidence:
        worst = self.worst
        data: MarginEvidence = {
            "share": self.share,
            "worst": worst.metric if worst is not None else None,
            "nonfinite": self.nonfinite,
            "metrics": [u.to_dict() for u in self.uses],
            "unmeasured": list(self.unmeasured),
        }
        if self.task is not None:
            data["task"] = self.task
        return data


def margin_of(metrics: Metrics, task: str | None = None) -> Margin:
    """The margin of a judged run: the token states' bounds (min cosine, max norm error, and
    the zero reference rows' error when there are any) and every check of each pipeline output
    (hfadapt.judge.output_metrics), named ``output: check``."""
    # (name, value, bound, at_least), as output_metrics.Check holds them
    checks: list[tuple[str, float | None, float, bool]] = [
        ("min token cosine", metrics.min_token_cosine, metrics.threshold, True),
        ("max token norm error", metrics.max_norm_error, metrics.norm_threshold, False),
    ]
    if metrics.zero_rows:
        checks.append(("zero-row error", metrics.zero_row_error, metrics.zero_row_threshold, False))
    nonfinite = metrics.has_nan or metrics.has_inf
    for output in metrics.outputs:
        data = output.to_dict()  # any OutputJudgement: its checks as OutputMetrics writes them
        nonfinite = nonfinite or bool(data.get("nonfinite"))
        for c in data.get("checks", []):
            value = c.get("value")
            checks.append(
                (
                    f"{output.output}: {c['name']}",
                    None if value is None else float(value),
                    float(c["bound"]),
                    bool(c["at_least"]),
                )
            )
    uses, unmeasured = [], []
    for name, value, bound, at_least in checks:
        if value is None:
            unmeasured.append(name)
        elif not math.isfinite(value):
            nonfinite = True
        else:
            uses.append(BoundUse(name, value, bound, at_least))
    return Margin(tuple(uses), nonfinite, tuple(unmeasured), task)


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def read_margin(value: object) -> Margin | None:
    """A stored ``evidence["margin"]`` as a Margin, its shares recomputed from the values and
    bounds; None for a row without one (recorded before margins, or no numbers judged) or one
    out of shape (an old, hand-edited or hostile row is shown as absent, never raised on)."""
    if not isinstance(value, dict) or not isinstance(value.get("metrics"), list):
        return None
    uses = []
    for item in value["metrics"]:
        if not isinstance(item, dict) or not isinstance(item.get("metric"), str):
            return None
        number, bound = _number(item.get("value")), _number(item.get("bound"))
        at_least = item.get("at_least")
        if number is None or bound is None or not isinstance(at_least, bool):
            return None
        try:
            uses.append(BoundUse(item["metric"], number, bound, at_least))
        except ValueError:
            return None
    unmeasured = value.get("unmeasured")
    names = [n for n in unmeasured if isinstance(n, str)] if isinstance(unmeasured, list) else []
    task = value.get("task")
    return Margin(
        tuple(uses),
        value.get("nonfinite") is True,
        tuple(names),
        task if isinstance(task, str) else None,
    )


def widest(margins: Iterable[Margin | None]) -> Margin | None:
    """The margin that came closest to (or furthest past) its bounds: NaN/inf first, then the
    largest share; None when there is none."""
    found = [m for m in margins if m is not None]
    if not found:
        return None
    return max(found, key=lambda m: (m.nonfinite, -1.0 if m.share is None else m.share))
