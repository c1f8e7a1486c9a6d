"""What a sweep does, as one frozen value: which crawled models, how each unit is judged (a
``JudgeOptions``), and how the units run (workers, limits, executor, dedupe, resume). The CLI
builds one from its flags; ``run_sweep`` takes it whole."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hfadapt.errors import UsageError, option
from hfadapt.judge.options import JudgeOptions
from hfadapt.options import Executor, Mode

__all__ = ["DEFAULT_TIMEOUT_S", "SweepOptions"]

DEFAULT_TIMEOUT_S = 600.0  # hf-adapters' weekly scan: ten minutes per model


def _sweep_judging() -> JudgeOptions:
    # structural by default, and no localization: sweeps keep the cost per unit down
    return JudgeOptions(mode=Mode.STRUCTURAL, localize=False)


@dataclass(frozen=True)
class SweepOptions:
    """A sweep (see module doc).

    ``workers``: parallel units (None: the CPUs, at most 2 locally; on Ray, the cluster's).
    ``timeout``: seconds per unit (None: no limit). ``memory_limit``: MB of address space per
    worker (None: 85% of RAM shared; 0: none). ``dedupe``: one run per structural signature
    (None: in structural mode only). ``narrow``: judge a wide signature on a narrower config
    with the same signature first (numerics and load failures are confirmed at full width).
    ``resume``: continue the newest unfinished sweep with the same options (an int: that sweep;
    False: a new one). ``offline``: no Hub requests (None: when the crawl is the bundled
    snapshot). ``address``: the Ray cluster (only with the Ray executor).
    ``allow_env_change``: resume a sweep whose runs recorded another environment (packages,
    numeric path: hfadapt.judge.environment) than this one; without it, EnvironmentChangedError."""

    judge: JudgeOptions = field(default_factory=_sweep_judging)
    top: int | None = None
    model_type: str | None = None
    workers: int | None = None
    timeout: float | None = DEFAULT_TIMEOUT_S
    memory_limit: int | None = None
    executor: Executor = Executor.LOCAL
    address: str | None = None
    dedupe: bool | None = None
    narrow: bool = True
    resume: bool | int = True
    offline: bool | None = None
    allow_env_change: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "executor", Executor.parse(self.executor, "executor"))
        if self.workers is not None and self.workers < 1:
            raise UsageError(f"workers must be at least 1 (got {self.workers})")
        timeout = self.timeout
        if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
            raise UsageError(f"timeout must be a finite number of seconds above 0 (got {timeout})")
        if self.memory_limit is not None and self.memory_limit < 0:
            raise UsageError(
                f"memory_limit must be 0 (none) or a number of MB (got {self.memory_limit})"
            )
        if self.top is not None and self.top < 1:
            raise UsageError(f"top must be at least 1 (got {self.top})")
        if self.address is not None and self.executor != Executor.RAY:
            raise UsageError(
                f"{option('address')} names a Ray cluster: it needs {option('executor')} ray"
            )

    @property
    def deduped(self) -> bool:
        """Whether models share one run per structural signature."""
        return self.judge.structural if self.dedupe is None else self.dedupe

    def identity(self, profile: str, crawl_id: int | None) -> dict[str, object]:
        """What a sweep is, as stored: an unfinished sweep with the same identity resumes."""
        judge = self.judge
        out: dict[str, Any] = {
            "mode": judge.mode.value,
            "execution": judge.execution.value,
            "dtype": judge.dtype_name,
            "top": self.top,
            "model_type": self.model_type,
            "dedupe": self.deduped,
            "narrow": self.narrow and self.deduped and judge.structural,
            "profile": profile,
            "adapters": judge.adapters,
            "crawl_id": crawl_id,
        }
        if judge.trust_remote_code:  # only then: sweeps started before this option resume
            out["trust_remote_code"] = True
        if judge.without_adapters:  # likewise
            out["without_adapters"] = list(judge.without_adapters)
        return out
