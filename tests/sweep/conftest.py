"""Sweeps: planning, dedupe, narrowing, workers, resume, the Ray executor. The shared fixtures this
part's tests use, from tests/support."""

from __future__ import annotations

from support.device import cpu_runner
from support.sweeps import fake_worker, sweep_engine
from support.timing import sleeps

__all__ = ["cpu_runner", "fake_worker", "sleeps", "sweep_engine"]
