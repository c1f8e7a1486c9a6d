"""Adapters: the API and host helpers, the registry, the bundled adapters proven and run. The
shared fixtures this part's tests use, from tests/support."""

from __future__ import annotations

from support.device import spyre, spyre_backend

__all__ = ["spyre", "spyre_backend"]
