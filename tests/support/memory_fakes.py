"""Sweep workers that run out of memory on chosen models (named in $HFADAPT_FAKE_OOM,
comma-separated), importable by name in spawned worker processes and Ray tasks: the way torch
does (a RuntimeError carrying the allocator's text), and the way Python does (a MemoryError
from an allocation past the worker's address-space limit). Every other model gets the
deterministic verdict of support.sweep_fakes."""

from __future__ import annotations

import os

from hfadapt.sweep.worker import Outcome, Task
from support.sweep_fakes import fake_judge

# What torch 2.x raises when malloc fails under RLIMIT_AS (seen in a top-300 sweep).
ALLOCATOR_TEXT = (
    "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 360710144 bytes. Error code 12 (Cannot allocate memory)"
)


def _listed(model_id: str) -> bool:
    return model_id in [m for m in os.environ.get("HFADAPT_FAKE_OOM", "").split(",") if m]


def allocator_oom_judge(task: Task) -> Outcome:
    """torch's allocator failing for the listed models."""
    if _listed(task.model_id):
        raise RuntimeError(ALLOCATOR_TEXT)
    return fake_judge(task)


def hog_oom_judge(task: Task) -> Outcome:
    """A real allocation of 64 GB for the listed models: past any test's limit (MemoryError)."""
    if _listed(task.model_id):
        block = bytearray(64 * 2**30)
        block[-1] = 1
    return fake_judge(task)


def oom_runner(model: object, inputs: object, **kwargs: object) -> object:
    """A device runner whose allocation fails: the real judge_unit meets torch's error."""
    raise RuntimeError(ALLOCATOR_TEXT)
