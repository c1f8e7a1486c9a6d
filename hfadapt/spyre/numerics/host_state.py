"""The torch process state that changes what a float32 computation on the host gives, and so
what the CPU fp32 reference and the simulated device (which computes on the host) give:

- the float32 matmul precision: ``torch.set_float32_matmul_precision("medium")`` makes fp32
  matmuls bf16 on a CPU with AMX (oneDNN, ``torch.backends.mkldnn.matmul.fp32_precision``
  "bf16"), and the real all-MiniLM-L6-v2 failed its verification against that reference;
  convolutions and RNNs have their own oneDNN setting (``torch.backends.mkldnn.conv`` /
  ``.rnn``);
- autocast, per device type (``torch.autocast("cpu", dtype=torch.bfloat16)`` runs the
  reference's linears in bf16, and puts casts into every graph aot_autograd traces);
- the default dtype (factory calls without a dtype: ``torch.tensor(64.0)`` in a forward).

``pinned()`` runs judging with all of them fixed (highest precision, autocast off on every
device type, float32 default dtype) and gives the caller's settings back afterwards, even on
an error; judging calls it (hfadapt.judge.diagnose), loading a model for use never does.
``state()`` reads them, for the keys of the caches whose entries depend on them
(hfadapt.judge.reference_cache, hfadapt.spyre.compile.cache: ``graph_state()``, what a traced
graph depends on); ``exact()`` says whether a state computes float32 exactly. Precision and
the default dtype are process-wide, shared by every thread; autocast is per thread."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from hfadapt import torch_internals as ti

__all__ = ["PINNED_PRECISION", "autocast_state", "exact", "graph_state", "pinned", "state"]

PINNED_PRECISION = "highest"  # torch.set_float32_matmul_precision's name for exact fp32
# (backend, op) pairs of torch's fp32 precision settings that reach CPU arithmetic (mkldnn:
# oneDNN), and CUDA's matmul, which set_float32_matmul_precision moves along with oneDNN's
_PRECISIONS: tuple[tuple[str, str], ...] = (
    ("mkldnn", "matmul"),
    ("mkldnn", "conv"),
    ("mkldnn", "rnn"),
    ("cuda", "matmul"),
)
_IEEE = "ieee"  # torch's fp32 precision meaning plain fp32 arithmetic


def _precision_setting(backend: str, op: str) -> Any:
    """The object whose ``fp32_precision`` is the setting: ``torch.backends.mkldnn.matmul``."""
    return getattr(getattr(torch.backends, backend), op)


def _precisions() -> dict[str, str]:
    return {f"{b}.{o}": str(_precision_setting(b, o).fp32_precision) for b, o in _PRECISIONS}


def _legacy_precision() -> str | None:
    """``torch.get_float32_matmul_precision()``; None where torch refuses to say (the new
    per-backend settings were set so that they contradict it)."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return None


def autocast_state() -> dict[str, str]:
    """Every device type autocast is on for in this thread, with its dtype (torch's own
    AOTAutogradCache keys a graph by the same)."""
    on = {}
    for device_type in ti.autocast_supported_devices():
        if torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type):
            on[device_type] = str(torch.get_autocast_dtype(device_type))
    return on


def graph_state() -> dict[str, object]:
    """What the ATen graph aot_autograd traces depends on besides the code and the inputs:
    autocast (it inserts casts), the default dtype (a factory call without a dtype), and
    deterministic algorithms (decompositions may choose by it). torch's AOTAutogradCache and
    FX graph cache key their entries by the same."""
    return {
        "autocast": autocast_state(),
        "default_dtype": str(torch.get_default_dtype()),
        "deterministic": [
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ],
    }


def state() -> dict[str, Any]:
    """Everything above as plain JSON values: the float32 matmul precision (torch's legacy
    name, "unreadable" where torch refuses to say, and every per-backend setting), autocast,
    the default dtype, deterministic algorithms and whether oneDNN is on."""
    return {
        "matmul_precision": _legacy_precision() or "unreadable",
        "fp32_precision": _precisions(),
        "mkldnn": bool(torch.backends.mkldnn.enabled),
        **graph_state(),
    }


def exact(now: dict[str, Any] | None = None) -> bool:
    """Whether ``now`` (a ``state()``; default: this thread's) computes float32 exactly, as
    ``pinned()`` sets it or as torch starts: the highest matmul precision, no oneDNN fp32
    setting other than "ieee" or unset, autocast off, float32 the default dtype."""
    now = state() if now is None else now
    return (
        now["matmul_precision"] in (PINNED_PRECISION, "unreadable")
        and all(
            now["fp32_precision"][f"{b}.{o}"] in (_IEEE, "none")
            for b, o in _PRECISIONS
            if b == "mkldnn"
        )
        and not now["autocast"]
        and now["default_dtype"] == str(torch.float32)
    )


@contextlib.contextmanager
def pinned() -> Iterator[None]:
    """Run the block with exact float32 arithmetic on the host: highest matmul precision
    (every oneDNN fp32 setting "ieee"), autocast off on every device type, float32 as the
    default dtype; the caller's settings come back afterwards, even when the block raises.
    Nesting is harmless. Also a decorator (``@pinned()``)."""
    default_dtype = torch.get_default_dtype()
    legacy = _legacy_precision()
    saved = {(b, o): _precision_setting(b, o).fp32_precision for b, o in _PRECISIONS}
    with contextlib.ExitStack() as autocast_off:
        try:
            torch.set_default_dtype(torch.float32)
            if legacy is not None:  # unreadable: leave torch's legacy value as it was
                torch.set_float32_matmul_precision(PINNED_PRECISION)
            for backend, op in _PRECISIONS:
                _precision_setting(backend, op).fp32_precision = _IEEE
            for device_type in autocast_state():
                autocast_off.enter_context(torch.autocast(device_type, enabled=False))
            yield
        finally:
            autocast_off.close()
            if legacy is not None:
                torch.set_float32_matmul_precision(legacy)
            for (backend, op), value in saved.items():  # after: the legacy setter moves them
                _precision_setting(backend, op).fp32_precision = value
            torch.set_default_dtype(default_dtype)
