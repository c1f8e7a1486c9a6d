"""Graphs of ATen ops as data (hfadapt.graphs). The shared fixtures this part's tests use, from
tests/support."""

from __future__ import annotations

from support.device import spyre

__all__ = ["spyre"]
