"""What sweeps found: coverage and the HTML report. The shared fixtures this part's tests use, from
tests/support."""

from __future__ import annotations

from support.reports import report_engine

__all__ = ["report_engine"]
