"""Judging one model: diagnose end to end, metrics, localization, evidence, the sandboxed judge.
The shared fixtures this part's tests use, from tests/support."""

from __future__ import annotations

from support.device import cpu_runner, fault_runner, one_thread
from support.models import minilm_path, tiny_bert, tiny_model_dirs
from support.sweeps import fake_worker, sweep_engine

__all__ = [
    "cpu_runner",
    "fake_worker",
    "fault_runner",
    "minilm_path",
    "one_thread",
    "sweep_engine",
    "tiny_bert",
    "tiny_model_dirs",
]
