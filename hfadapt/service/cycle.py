"""``hfadapt cycle``: one pass of the whole job, for a scheduler to run. It claims the cycle
lock (hfadapt.service.store), crawls (the Hub, or the bundled snapshot offline), sweeps the
ranking (hfadapt.sweep.run: local workers or Ray, resumable), compares that sweep with the
last completed cycle's (hfadapt.service.compare) and records the cycle. An interrupted or
failed cycle started again with the same options resumes: its crawl is kept (while no later
crawl replaced it) and its sweep resumes where it stopped. With ``CycleOptions.drafting``, the
failure fingerprints new since the last completed cycle are then drafted for, within a budget
(hfadapt.service.drafting), before the cycle is recorded done."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from hfadapt.db.tables import FAILED, INTERRUPTED
from hfadapt.service.compare import CycleComparison, compare_sweeps
from hfadapt.service.drafting import CycleDrafting, DraftingResult, draft_new_fingerprints
from hfadapt.service.store import claim_cycle, finish_cycle, heartbeat, last_done_cycle
from hfadapt.sweep.options import SweepOptions
from hfadapt.sweep.run import SweepProgress, SweepResult, run_sweep

if TYPE_CHECKING:
    from hfadapt.db.tables import Cycle

__all__ = ["CycleOptions", "CycleResult", "run_cycle"]

HEARTBEAT_S = 60.0  # the lease is renewed at most this often, from the sweep's progress


@dataclass(frozen=True)
class CycleOptions:
    """A cycle: the crawl (``offline``: the bundled snapshot; else the Hub at ``endpoint``
    or the default, failing when unreachable; ``limit`` models ranked) and the sweep over
    it (``sweep``; its ``resume`` is the cycle's: False starts a new cycle and a new sweep);
    ``drafting``: draft for new failure fingerprints (None: no drafting). Drafting is not
    part of the cycle's identity: a cycle resumed with it drafts what is left."""

    sweep: SweepOptions = field(default_factory=SweepOptions)
    offline: bool = False
    endpoint: str | None = None
    limit: int = 10_000
    drafting: CycleDrafting | None = None

    def identity(self) -> dict[str, object]:
        """What a cycle is, as stored: an unfinished cycle with the same identity resumes."""
        s, judge = self.sweep, self.sweep.judge
        return {
            "source": "snapshot" if self.offline else (self.endpoint or "hub"),
            "limit": self.limit,
            "top": s.top,
            "model_type": s.model_type,
            "mode": judge.mode.value,
            "execution": judge.execution.value,
            "dtype": judge.dtype_name,
            "profile": judge.profile,
            "adapters": judge.adapters,
            "without_adapters": list(judge.without_adapters),
            "trust_remote_code": judge.trust_remote_code,
            "narrow": s.narrow,
        }


@dataclass
class CycleResult:
    cycle_id: int
    resumed: bool
    crawl_id: int | None
    crawled: bool  # False: a resumed cycle kept its crawl
    sweep: SweepResult
    baseline_cycle: int | None
    comparison: CycleComparison | None  # None: the first cycle on this database
    seconds: float
    crawl_seconds: float
    sweep_seconds: float
    compare_seconds: float
    drafting: DraftingResult | None = None  # None: not asked to draft
    draft_seconds: float = 0.0

    @property
    def regressions(self) -> int:
        return len(self.comparison.regressions) if self.comparison else 0


def _crawl(engine: Engine, cycle: Cycle, options: CycleOptions, resumed: bool) -> tuple[int, bool]:
    """(the cycle's crawl id, whether it crawled now)."""
    from hfadapt.hub.catalog import latest_crawl
    from hfadapt.hub.crawl import crawl

    latest = latest_crawl(engine)
    kept = latest is not None and latest.id == cycle.crawl_id and latest.status == "done"
    if resumed and cycle.crawl_id is not None and kept:
        return cycle.crawl_id, False
    crawl(engine, limit=options.limit, offline=options.offline, endpoint=options.endpoint)
    latest = latest_crawl(engine)
    assert latest is not None and latest.id is not None
    return latest.id, True


def _beating(
    engine: Engine, cycle_id: int, progress: Callable[[SweepProgress], None] | None
) -> Callable[[SweepProgress], None]:
    """The sweep's progress callback: renews the cycle's lease and records its sweep."""
    last = [0.0]

    def update(p: SweepProgress) -> None:
        now = time.monotonic()
        if now - last[0] >= HEARTBEAT_S:
            heartbeat(engine, cycle_id, sweep_id=p.sweep_id)
            last[0] = now
        if progress is not None:
            progress(p)

    return update


def run_cycle(
    engine: Engine,
    options: CycleOptions,
    *,
    progress: Callable[[SweepProgress], None] | None = None,
    started_cycle: Callable[[int, bool], None] | None = None,
    note: Callable[[str], None] = lambda _: None,
    **sweep_kwargs: object,
) -> CycleResult:
    """Run (or resume) one cycle as ``options`` say and return what it found (module doc).
    UsageError when another cycle runs on this database. ``started_cycle(id, resumed)`` is
    called once the cycle is claimed; ``note`` hears what drafting does; ``sweep_kwargs`` go
    to ``run_sweep`` (tests' workers)."""
    started = time.perf_counter()
    if options.sweep.judge.without_adapters:  # refused before the lock, the crawl, any write
        from hfadapt.judge.diagnose import check_adapter_names

        check_adapter_names(options.sweep.judge.without_adapters)
    resume = options.sweep.resume is not False
    cycle, resumed = claim_cycle(engine, options.identity(), resume=resume)
    assert cycle.id is not None
    try:
        if started_cycle is not None:
            started_cycle(cycle.id, resumed)
        result = _run_stages(
            engine,
            cycle,
            options,
            started,
            resume=resume,
            resumed=resumed,
            progress=progress,
            note=note,
            **sweep_kwargs,
        )
    except BaseException as exc:
        _record_stopped(engine, cycle.id, exc, seconds=time.perf_counter() - started)
        raise
    comparison = result.comparison
    finish_cycle(
        engine,
        cycle.id,
        seconds=result.seconds,
        sweep_id=result.sweep.sweep_id,
        regressions=result.regressions,
        summary=comparison.to_dict() if comparison else None,
    )
    return result


def _run_stages(
    engine: Engine,
    cycle: Any,
    options: CycleOptions,
    started: float,
    *,
    resume: bool,
    resumed: bool,
    progress: Callable[[SweepProgress], None] | None,
    note: Callable[[str], None],
    **sweep_kwargs: Any,
) -> CycleResult:
    """The claimed cycle's stages in order, each timed from ``started``: the crawl (or the
    resumed cycle's), the sweep (``resume``: the cycle's), the comparison with the last
    completed cycle, the drafting."""
    crawl_id, crawled = _crawl(engine, cycle, options, resumed)
    baseline = last_done_cycle(engine, before=cycle.id)
    heartbeat(
        engine,
        cycle.id,
        crawl_id=crawl_id,
        baseline_cycle_id=baseline.id if baseline else None,
        baseline_sweep_id=baseline.sweep_id if baseline else None,
    )
    crawl_seconds = time.perf_counter() - started
    sweep_opts = replace(options.sweep, resume=resume, offline=None)
    swept = run_sweep(
        engine, sweep_opts, progress=_beating(engine, cycle.id, progress), **sweep_kwargs
    )
    sweep_done = time.perf_counter()
    comparison = None
    if baseline is not None and baseline.sweep_id is not None:
        comparison = compare_sweeps(engine, swept.sweep_id, baseline.sweep_id)
    compare_seconds = time.perf_counter() - sweep_done
    drafted = None
    if options.drafting is not None:
        cycle_id = cycle.id
        drafted = draft_new_fingerprints(
            engine,
            cycle_id,
            comparison,
            options.drafting,
            options.sweep.judge,
            note=note,
            beat=lambda: heartbeat(engine, cycle_id),
        )
    draft_seconds = time.perf_counter() - sweep_done - compare_seconds
    return CycleResult(
        cycle_id=cycle.id,
        resumed=resumed,
        crawl_id=crawl_id,
        crawled=crawled,
        sweep=swept,
        baseline_cycle=baseline.id if baseline else None,
        comparison=comparison,
        seconds=time.perf_counter() - started,
        crawl_seconds=crawl_seconds,
        sweep_seconds=sweep_done - started - crawl_seconds,
        compare_seconds=compare_seconds,
        drafting=drafted,
        draft_seconds=draft_seconds,
    )


def _record_stopped(engine: Engine, cycle_id: int, exc: BaseException, *, seconds: float) -> None:
    """The cycle recorded interrupted (Ctrl-C: no error) or failed (with the error)."""
    stopped = isinstance(exc, KeyboardInterrupt)
    finish_cycle(
        engine,
        cycle_id,
        seconds=seconds,
        status=INTERRUPTED if stopped else FAILED,
        error=None if stopped else f"{type(exc).__name__}: {exc}",
    )
