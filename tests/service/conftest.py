"""hfadapt as a service: ``hfadapt cycle`` (crawl, sweep, compare, report; its lock and resume)
and ``hfadapt serve`` (the read-only API and dashboard). The shared fixtures this part's tests
use: the stand-in sweep worker, and ``history_db``, three completed cycles (tests/support)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.cycle_history import write_history
from support.sweeps import fake_worker

__all__ = ["fake_worker", "history_db"]


@pytest.fixture
def history_db(tmp_path: Path) -> Path:
    """runs.db with three completed cycles (support.cycle_history.HISTORY says what they hold)."""
    return write_history(tmp_path / "history.db")
