"""hfadapt as a service: ``hfadapt cycle`` (crawl, sweep, compare, report; its lock and resume).
The shared fixtures this part's tests use, from tests/support."""

from __future__ import annotations

from support.sweeps import fake_worker

__all__ = ["fake_worker"]
