"""Which compiled graphs the latest call compiled or ran, and their merged report: what
``hfadapt.spyre.compile.backend.last_report()`` returns, and the per-thread collectors ``lower()``
audits with. Kept apart from the backend so the bookkeeping stays small and testable."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from hfadapt.spyre.rules.lowering_report import LoweringReport
from hfadapt.spyre.rules.profile import Profile, load_profile


@dataclass(eq=False)
class GraphEntry:
    """One compiled graph: its report and whether it starts a frame (not a resume function
    after a graph break)."""

    report: LoweringReport
    top: bool
    lowered: bool


class _Collector:
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.entries: list[GraphEntry] = []
        self.run_seconds = 0.0

    def add(self, entry: GraphEntry) -> None:
        if not any(e is entry for e in self.entries):
            self.entries.append(entry)

    def report(self) -> LoweringReport:
        if not self.entries:
            return LoweringReport(self.profile.name, self.profile.version, mode="compile")
        return merge_reports(self.entries)


_lock = threading.Lock()
_session: list[GraphEntry] = []
_local = threading.local()


def collectors() -> list[_Collector]:
    if not hasattr(_local, "collectors"):
        _local.collectors = []
    return _local.collectors  # type: ignore[no-any-return]


def note(entry: GraphEntry) -> None:
    """A graph was compiled or runs. A frame's first graph starts the latest call's list (when
    it is compiled, and again each time it runs); resume graphs after a graph break join it."""
    with _lock:
        if entry.top:
            _session[:] = [entry]
        elif not any(e is entry for e in _session):
            _session.append(entry)
    for collector in collectors():
        collector.add(entry)


def merge_reports(entries: Sequence[GraphEntry]) -> LoweringReport:
    """One report for several graphs (violations deduplicated, counts added)."""
    first = entries[0].report
    merged = LoweringReport(first.profile_name, first.profile_version, mode="compile")
    for entry in entries:
        merged.merge(entry.report)
    return merged


def last_report() -> LoweringReport | None:
    """The report of the latest compiled call: every graph it compiled or ran (one per graph
    break), merged. None before anything was compiled."""
    with _lock:
        entries = list(_session)
    return merge_reports(entries) if entries else None


def reset_reports() -> None:
    with _lock:
        _session.clear()


@contextmanager
def collect(profile: Profile | str | None = None) -> Iterator[_Collector]:
    """Collect every graph compiled or run inside the block (this thread)."""
    p = profile if isinstance(profile, Profile) else load_profile(profile)
    collector = _Collector(p)
    collectors().append(collector)
    try:
        yield collector
    finally:
        collectors().remove(collector)
