"""What the judge runs a model on the device through: the ``Runner`` protocol (the signature
of ``hfadapt.spyre.runner.run_on_device``, which tests replace with CPU stand-ins) and the
``DeviceResult`` a runner returns. The judge imports the real runner only on first use
(``default_runner``): it pulls in the simulated device."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from hfadapt.spyre.rules.lowering_report import LoweringReport
    from hfadapt.spyre.rules.profile import Profile

__all__ = ["DeviceResult", "Runner", "default_runner"]


class DeviceResult(Protocol):
    """One run on the device (``hfadapt.spyre.runner.DeviceRun``)."""

    @property
    def outputs(self) -> Any:  # the model's own output type, every tensor on the host in fp32
        ...

    @property
    def report(self) -> LoweringReport | None: ...

    @property
    def seconds(self) -> float:  # the device forward's wall time
        ...


class Runner(Protocol):
    """Runs ``model(**inputs)`` on the device in ``dtype`` (see ``run_on_device``)."""

    def __call__(
        self,
        model: torch.nn.Module,
        inputs: Mapping[str, object],
        /,
        *,
        execution: str = ...,
        dtype: torch.dtype = ...,
        profile: Profile | str | None = ...,
        collect: bool = ...,
    ) -> DeviceResult: ...


def default_runner() -> Runner:
    """The real device runner, imported on first use (it pulls in the simulated device)."""
    from hfadapt.spyre.runner import run_on_device

    return run_on_device
