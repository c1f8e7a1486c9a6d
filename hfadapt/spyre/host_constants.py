"""Constant tensors the host builds once for device runs (a RoPE rotation matrix, an ALiBi
bias), by key: as the card's runtime keeps such tensors beside a compiled program. Adapters
fill the cache through ``hfadapt.adapters.host.host_constant``; the compile backend reads
``builds()`` to see whether a build happened inside its trace.

Why that matters: a build runs on the host, outside the graph (``torch.compiler.disable``), so
the first trace in a process that meets an unbuilt constant breaks its graph there, where a
later trace finds the constant and does not (a 2-layer ModernBERT with the RoPE adapter: 10
graphs cold, 5 warm). ``hfadapt.spyre.compile.backend.lower`` traces again when ``builds()``
moved during its trace, so a verdict's graphs never depend on what the process built before.

The cache lives in a module imported once, not in the adapter files: a registry executes its
files as new module objects, and a compiled frame guards on the cache it read (a frame compiled
against one file's dict and checked against another's raised KeyError inside Dynamo)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["builds", "cached", "forget", "store"]

_CONSTANTS: dict[tuple[Any, ...], torch.Tensor] = {}
_BUILDS = [0]  # how many constants were stored in this process (a list: no ``global``)


def cached(key: tuple[Any, ...]) -> torch.Tensor | None:
    """The constant built for ``key``, or None."""
    return _CONSTANTS.get(key)


def store(key: tuple[Any, ...], tensor: torch.Tensor) -> None:
    """Keep ``tensor`` for ``key`` and count the build."""
    _CONSTANTS[key] = tensor
    _BUILDS[0] += 1


def builds() -> int:
    """How many constants this process has built so far."""
    return _BUILDS[0]


def forget() -> None:
    """Drop every cached constant (tests: a process as cold as a fresh one)."""
    _CONSTANTS.clear()
