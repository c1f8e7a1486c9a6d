"""The simulated device for tests: the eager device and the compile backend registered and
reset, stand-in device runners (CPU fp16, with a fault injected in one module), one torch
thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def spyre() -> Iterator[object]:
    """The simulated ``spyre`` device module, registered (once per process). Restores the
    current device and the default profile afterwards."""
    from hfadapt.spyre.eager import device

    device.register()
    yield device
    device.set_device(0)
    device.set_profile(None)


@pytest.fixture
def spyre_backend():  # type: ignore[no-untyped-def]
    """``torch.compile(..., backend="spyre")`` registered; Dynamo's caches and the backend's
    last report cleared before and after, so no compiled graph leaks between tests (and Dynamo
    never hits its recompile limit and silently falls back to eager)."""
    import torch

    from hfadapt.spyre.compile import backend

    backend.register()
    torch._dynamo.reset()
    backend.reset_reports()
    yield backend
    torch._dynamo.reset()
    backend.reset_reports()


class FakeDeviceRun:
    """What hfadapt.spyre.runner.run_on_device returns: outputs on CPU in fp32, report, seconds."""

    def __init__(self, outputs: object, report: object, seconds: float) -> None:
        self.outputs, self.report, self.seconds = outputs, report, seconds


def _to_fp32(outputs: object) -> object:
    outputs.last_hidden_state = outputs.last_hidden_state.float()
    return outputs


def cpu_fp16_runner(
    model: object,
    inputs: dict[str, object],
    *,
    execution: str = "eager",
    dtype: object = None,
    profile: str | None = None,
    collect: bool = True,
) -> FakeDeviceRun:
    """A stand-in device: the model in fp16 (or bf16) on the CPU, with an empty lowering report."""
    import time

    import torch

    from hfadapt.spyre.rules.lowering_report import LoweringReport

    start = time.perf_counter()
    model = model.to(dtype or torch.float16)
    with torch.inference_mode():
        outputs = _to_fp32(model(**inputs))
    return FakeDeviceRun(
        outputs, LoweringReport("cpu-stand-in", "0", execution), time.perf_counter() - start
    )


def faulty_runner(module_name: str, kind: str = "zero_half") -> object:
    """A CPU fp16 stand-in whose ``module_name`` computes wrongly *inside* its forward (so every
    hook sees the faulty output, as with a real device bug): ``zero_half`` zeroes every other
    channel, ``nan`` puts NaN in channel 0, ``overflow`` scales past fp16's range."""
    import torch

    def corrupt(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        if kind == "zero_half":
            t[..., ::2] = 0
        elif kind == "nan":
            t[..., 0] = float("nan")
        elif kind == "overflow":
            t = t * 1e6
        return t

    def run(model: object, inputs: dict[str, object], **kwargs: object) -> FakeDeviceRun:
        target = model.get_submodule(module_name)
        stock = target.forward

        def forward(*args: object, **kw: object) -> object:
            out = stock(*args, **kw)
            if isinstance(out, tuple):
                return (corrupt(out[0]), *out[1:])
            return corrupt(out)

        target.forward = forward
        return cpu_fp16_runner(model, inputs, **kwargs)

    return run


@pytest.fixture
def cpu_runner() -> object:
    """The CPU fp16 stand-in for the device runner (see cpu_fp16_runner)."""
    return cpu_fp16_runner


@pytest.fixture
def fault_runner() -> object:
    """Factory of stand-in runners with a numeric fault in one module (see faulty_runner)."""
    return faulty_runner


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one thread for the test. On a loaded 2-core machine, OpenMP threads waiting for
    each other make a tiny model's matmuls ~50x slower than one thread does; restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
