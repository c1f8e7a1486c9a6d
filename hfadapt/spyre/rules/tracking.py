"""Who is watching the eager device: the active device profile, the thread's report collectors
(``tracking``), the warnings the device emits, where in model code an op came from, and what a
violation does (recorded, and raised unless auditing).

State is per thread (a stack of collectors in a ``threading.local``), so two threads running two
models never write into each other's report; the default profile is process-wide."""

from __future__ import annotations

import contextlib
import dataclasses
import linecache
import os
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from hfadapt.errors import SpyreOpError, SpyreOpNotImplementedError
from hfadapt.options import Execution
from hfadapt.spyre.rules.lowering_report import LoweringReport, SourceLocation, Violation
from hfadapt.spyre.rules.profile import Profile, load_profile


class SpyreFallbackWarning(UserWarning):
    """An op ran on the host instead of the device ("aten::tril is falling back to cpu")."""


class SpyreDowncastWarning(UserWarning):
    """int64 data was stored as int32 on the device (torch-spyre's downcast warning)."""


@dataclass
class Collector:
    """One ``tracking`` block: the profile ops are judged by, its report, and whether a
    violation raises (the card's behaviour) or is recorded so the run continues (audit)."""

    profile: Profile
    report: LoweringReport | None
    collect: bool
    mode: str


_lock = threading.Lock()
_default_profile: Profile | None = None
_local = threading.local()


def set_profile(profile: str | Profile | None) -> Profile:
    """Pick the device profile ops are judged by outside ``tracking`` blocks (process-wide);
    ``None`` restores the bundled default. Returns the profile now active."""
    global _default_profile
    resolved = profile if isinstance(profile, Profile) else load_profile(profile)
    with _lock:
        _default_profile = resolved
    return resolved


def default_profile() -> Profile:
    global _default_profile
    if _default_profile is None:
        with _lock:
            if _default_profile is None:
                _default_profile = load_profile()
    return _default_profile


def current() -> Collector:
    """The innermost collector of this thread, or the default one (no report, raise)."""
    stack: list[Collector] | None = getattr(_local, "stack", None)
    if stack:
        return stack[-1]
    default: Collector | None = getattr(_local, "default", None)
    profile = default_profile()
    if default is None or default.profile is not profile:
        default = Collector(profile=profile, report=None, collect=False, mode="eager")
        _local.default = default
    return default


def active_profile() -> Profile:
    """The profile ops are judged by right now in this thread."""
    return current().profile


@contextlib.contextmanager
def tracking(
    profile: str | Profile | None = None, mode: str = "eager", collect: bool = False
) -> Iterator[LoweringReport]:
    """Collect every op run on the device in this thread into a LoweringReport (fallbacks per
    op, int64 downcasts, ops seen, violations with their model source location).

    ``collect=False`` behaves like the card: the first violation raises. ``collect=True`` is the
    audit mode: a violation is recorded and the op still runs (on the host CPU, computed in
    fp32 and rounded like a native op), so the report lists every violation of the run. A
    nested block's report is merged into the enclosing one on exit."""
    Execution.parse(mode, "mode")
    resolved = (
        profile
        if isinstance(profile, Profile)
        else (load_profile(profile) if profile else default_profile())
    )
    report = LoweringReport(profile_name=resolved.name, profile_version=resolved.version, mode=mode)
    stack: list[Collector] = getattr(_local, "stack", None) or []
    _local.stack = stack
    stack.append(Collector(profile=resolved, report=report, collect=collect, mode=mode))
    try:
        yield report
    finally:
        stack.pop()
        if stack and stack[-1].report is not None:
            stack[-1].report.merge(report)


# -- where an op came from ----------------------------------------------------------------

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# this file is hfadapt/spyre/rules/tracking.py
_HFADAPT_DIR = (
    os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)) + os.sep
)
# Adapters bundled in the wheel live under hfadapt/ but are model code (rewritten): a violation
# inside one is located there.
_BUNDLED_DIR = _HFADAPT_DIR + "_bundled" + os.sep
_SKIP_FILES = frozenset({contextlib.__file__})


def _skipped(filename: str) -> bool:
    if filename.startswith(_HFADAPT_DIR):
        return not filename.startswith(_BUNDLED_DIR)
    return filename.startswith(_TORCH_DIR) or filename in _SKIP_FILES


def model_location(depth: int = 1) -> SourceLocation | None:
    """The first Python frame outside torch, hfadapt and contextlib: the model code that issued
    the op. Walks the stack, so it is computed only when a violation needs it."""
    frame = sys._getframe(depth)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _skipped(filename):
            code = linecache.getline(filename, frame.f_lineno).strip()
            return SourceLocation(
                file=filename,
                line=frame.f_lineno,
                function=frame.f_code.co_name,
                code=code,
                qualname=frame.f_code.co_qualname,
            )
        frame = frame.f_back  # type: ignore[assignment]
    return None


# (category, message, file, line) -> how often the device raised it in this process
_warned: dict[tuple[type[Warning], str, str, int], int] = {}
_warned_lock = threading.Lock()


def warn_from_model(message: str, category: type[Warning]) -> None:
    """warnings.warn attributed to the model line that issued the op, once per (message, call
    site) per process: Python's own once-per-location registry is reset whenever anything
    changes the warning filters (transformers and sentence-transformers do, on every call), so
    every ``encode`` would print the same lines again. Every occurrence is counted
    (``warning_counts``); the reports of ``tracking`` blocks count them per run."""
    frame = sys._getframe(1)
    level = 2
    while frame is not None and _skipped(frame.f_code.co_filename):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    site = (frame.f_code.co_filename, frame.f_lineno) if frame is not None else ("", 0)
    key = (category, message, *site)
    with _warned_lock:
        seen = _warned.get(key, 0)
        _warned[key] = seen + 1
    if not seen:
        warnings.warn(message, category, stacklevel=level if frame is not None else 2)


@dataclass(frozen=True)
class WarningCount:
    """One device warning of this process: where the model issued it and how often."""

    category: str
    message: str
    file: str
    line: int
    count: int


def warning_counts() -> list[WarningCount]:
    """Every device warning raised in this process, shown or not, with its count."""
    with _warned_lock:
        items = list(_warned.items())
    return [
        WarningCount(cat.__name__, message, file, line, count)
        for (cat, message, file, line), count in items
    ]


def reset_warnings() -> None:
    """Forget which device warnings were shown (the next occurrence of each warns again)."""
    with _warned_lock:
        _warned.clear()


def refuse(collector: Collector, found: Sequence[Violation]) -> None:
    """Record violations with their model source location; raise the first unless the
    collector audits (collect=True): a missing kernel as NotImplementedError, anything else
    (layout, dtype) as RuntimeError, both carrying the violations."""
    if not found:
        return
    location = model_location(2)
    found = [dataclasses.replace(v, location=location) for v in found]
    if collector.report is not None:
        for v in found:
            collector.report.add(v)
    if collector.collect:
        return
    first = found[0]
    if first.kind == "op":
        raise SpyreOpNotImplementedError(first.message, violations=found)
    raise SpyreOpError(first.message, violations=found)
