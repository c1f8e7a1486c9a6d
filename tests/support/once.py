"""A session fixture's work done once per test run, under pytest-xdist too: each xdist worker
has its own session, so the first worker to need the work does it in the workers' common temp
folder under a file lock and records the result there; a worker that needs it later waits for
the lock and reads the record (pytest-xdist's recipe for a session fixture run once)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
from filelock import FileLock

T = TypeVar("T")

__all__ = ["once_per_run"]

RECORDED = ".recorded"  # written last: a folder without it holds no finished record


def once_per_run(
    factory: pytest.TempPathFactory,
    name: str,
    run: Callable[[Path], T],
    record: Callable[[Path, T], None],
    read: Callable[[Path], T],
) -> T:
    """``run(folder)`` once in this test run, in a folder named ``name``: without xdist in a
    fresh temp folder; under xdist in the workers' common one, where ``record(folder, result)``
    keeps what it returned for ``read(folder)`` in the workers that need it later."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return run(factory.mktemp(name))
    shared = factory.getbasetemp().parent / name
    with FileLock(f"{shared}.lock"):
        if (shared / RECORDED).exists():
            return read(shared)
        shared.mkdir(exist_ok=True)
        result = run(shared)
        record(shared, result)
        (shared / RECORDED).touch()
        return result
