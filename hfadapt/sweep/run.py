"""Batch coverage sweeps: judge every crawled model on the simulated device, cheaply and
safely. Models sharing a structural signature are judged once (structural mode) and every
model still gets its own ``Run`` row pointing at the representative's evidence; prefilter
exclusions are recorded ``skipped`` and custom-code models ``custom_code``, never dropped.
Units run in isolated workers (``hfadapt.sweep.local_pool``); this driver alone writes runs.db, one
transaction per unit, so a sweep killed at any moment resumes where it stopped."""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from hfadapt import settings
from hfadapt.db.tables import Sweep
from hfadapt.errors import EnvironmentChangedError, SweepError, UsageError, option
from hfadapt.judge.environment import (
    NUMERIC_KEYS,
    EnvChange,
    changes,
    describe_changes,
    environment,
)
from hfadapt.judge.evidence_types import SweepEvidence, read_evidence
from hfadapt.judge.options import JudgeOptions
from hfadapt.options import Executor as ExecutorName
from hfadapt.sweep.executor import Executor, make_executor
from hfadapt.sweep.limits import default_memory_limit_mb, max_local_workers
from hfadapt.sweep.options import DEFAULT_TIMEOUT_S, SweepOptions
from hfadapt.sweep.plan import Plan, Unit, plan_sweep
from hfadapt.sweep.rows import member_rows, unit_rows
from hfadapt.sweep.store import (
    FAILED,
    INTERRUPTED,
    done_rows,
    finish_sweep,
    open_sweep,
    resumable_sweep,
    sweep_environments,
    write_rows,
)
from hfadapt.sweep.worker import DEFAULT_WORKER, Task

if TYPE_CHECKING:
    from hfadapt.spyre.rules.profile import Profile

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "SweepError",
    "SweepOptions",
    "SweepProgress",
    "SweepResult",
    "run_sweep",
]


@dataclass
class SweepProgress:
    """Where a running sweep is: handed to the ``progress`` callback after every unit."""

    sweep_id: int
    total: int  # models in the sweep
    done: int  # models with a row
    units_total: int
    units_done: int
    counts: Counter[str]  # verdict -> models
    elapsed: float  # seconds since this session started
    already_done: int = 0  # models a previous session had recorded
    cost_total: float = 0.0
    cost_done: float = 0.0
    last: str | None = None  # the representative just recorded

    @property
    def models_per_minute(self) -> float:
        new = self.done - self.already_done
        return 60.0 * new / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left, from the estimated work done so far (units differ a lot in cost)."""
        if self.done >= self.total:
            return 0.0
        if self.cost_done <= 0 or self.elapsed <= 0:
            return None
        return self.elapsed * max(0.0, self.cost_total - self.cost_done) / self.cost_done


@dataclass
class SweepResult:
    """What a sweep did, with the numbers the benchmark reports."""

    sweep_id: int
    resumed: bool
    models: int  # rows the sweep holds now
    units: int  # units of work planned
    judged: int  # units a worker ran in this session
    reused: int  # units recorded from rows of an earlier session (resume)
    already_done: int  # models recorded before this session
    counts: dict[str, int]
    seconds: float
    planning_seconds: float
    workers: int
    executor: str
    dedupe_factor: float  # judged models per unit
    translated: int = 0  # remote-code models judged as their native translation
    worker_restarts: int = 0
    driver_peak_rss_mb: float = 0.0
    worker_peak_rss_mb: float = 0.0
    unit_seconds: dict[str, float] = field(default_factory=dict)  # representative -> seconds
    # a resumed sweep's environment changes let through (allow_env_change), as
    # "transformers 5.24.0 -> 5.25.0"; its new runs record the new environment
    environment_changes: list[str] = field(default_factory=list)

    @property
    def models_per_minute(self) -> float:
        new = self.models - self.already_done
        return 60.0 * new / self.seconds if self.seconds > 0 else 0.0


def _workers(options: SweepOptions, memory_limit: int | None) -> int:
    """How many units run at once, before the plan is known (the default never exceeds what
    this machine holds; on Ray the cluster's CPUs decide once connected)."""
    if options.workers is not None:
        workers = options.workers
    elif options.executor == ExecutorName.LOCAL:
        workers = max(1, min(2, max_local_workers(memory_limit)[0]))
    else:
        workers = max(1, min(2, os.cpu_count() or 1))
    if options.executor == ExecutorName.LOCAL:
        cap, why = max_local_workers(memory_limit)
        if workers > cap:
            raise UsageError(
                f"workers={workers} is more than this machine holds: at most {cap} ({why})"
            )
    return workers


def _models(engine: Engine, top: int | None, model_type: str | None) -> tuple[list[Any], Any]:
    from hfadapt.hub import crawl as hub
    from hfadapt.hub.catalog import current_models, latest_crawl

    crawl = latest_crawl(engine)
    if crawl is None:
        hub.crawl(engine, offline=True)
        crawl = latest_crawl(engine)
    models = current_models(engine, top=top, model_type=model_type, include_excluded=True)
    if not models:
        what = f" of model_type {model_type!r}" if model_type else ""
        raise UsageError(f"no crawled models{what} to sweep (see `hfadapt models --all`)")
    return models, crawl


def run_sweep(
    engine: Engine,
    options: SweepOptions | None = None,
    *,
    progress: Callable[[SweepProgress], None] | None = None,
    worker: str | Callable[..., Any] = DEFAULT_WORKER,
    runner: str | None = None,
) -> SweepResult:
    """Sweep the crawled models (crawling the bundled snapshot first if the database has no
    crawl) as ``options`` say, and return what it did. See the module doc.

    ``progress`` is called after every unit. ``worker``/``runner``: the worker function and
    device runner as ``module:function`` (tests inject stand-ins). With
    ``options.judge.trust_remote_code``, models that need their own code (and have no native
    translation) are judged in the OS sandbox (hfadapt.sweep.custom_code), never in this
    process or a worker; IsolationUnavailableError before any work where bubblewrap cannot
    isolate them, unless ``unsafe_no_isolation``. ``options.judge.without_adapters``: registry
    adapters left out of every unit (the rest apply), checked against the registry first.
    """
    from hfadapt.spyre.rules.profile import load_profile

    options = options or SweepOptions()
    judge = options.judge
    _refuse_early(judge)
    workers = _workers(options, options.memory_limit)
    prof = load_profile(judge.profile)
    memory_limit = options.memory_limit
    if memory_limit is None:
        memory_limit = default_memory_limit_mb(workers)
    started = time.perf_counter()
    models, crawl = _models(engine, options.top, options.model_type)
    offline = options.offline
    if offline is None:
        offline = crawl is not None and crawl.source == "snapshot"
    env = {settings.HF_HUB_OFFLINE.name: "1"} if offline else {}
    crawl_id = crawl.id if crawl else None
    identity, changed = _environment_checked(engine, options, prof, crawl_id)
    with settings.exported(env):
        plan = plan_sweep(models, mode=judge.mode, dedupe=options.deduped, narrow=options.narrow)
    # Workers start only once the plan stands: bad input or a failed plan spawns nothing, and
    # there are never more workers than units of work.
    pool = _start_pool(options, workers, len(plan.units), memory_limit, worker, env)
    sweep, resumed = _opened(engine, identity, options, plan, pool, memory_limit, crawl_id)
    assert sweep.id is not None
    try:
        if judge.trust_remote_code:
            from hfadapt.sweep.custom_code import judge_custom_code

            plan.direct = judge_custom_code(plan.direct, done_rows(engine, sweep.id), judge)
        template = Task("", "", judge=judge, runner=runner)
        return _drive(engine, sweep.id, resumed, plan, started, progress, pool, template, changed)
    except BaseException as exc:
        pool.close()
        stopped = isinstance(exc, KeyboardInterrupt)
        finish_sweep(
            engine,
            sweep.id,
            seconds=time.perf_counter() - started,
            status=INTERRUPTED if stopped else FAILED,
            error=None if stopped else f"{type(exc).__name__}: {exc}"[:500],
        )
        raise


def _refuse_early(judge: JudgeOptions) -> None:
    """Options refused before any work: a misspelt adapter name to leave out (it would leave
    every adapter applied), remote code where nothing can isolate it."""
    if judge.without_adapters:
        from hfadapt.judge.diagnose import check_adapter_names

        check_adapter_names(judge.without_adapters)
    if judge.trust_remote_code:
        from hfadapt.isolation import require_isolation

        what = f"the model's own code ({option('trust_remote_code')})"
        require_isolation(unsafe=judge.unsafe_no_isolation, what=what)


def _opened(
    engine: Engine,
    identity: dict[str, object],
    options: SweepOptions,
    plan: Plan,
    pool: Executor,
    memory_limit: int | None,
    crawl_id: int | None,
) -> tuple[Sweep, bool]:
    """(the sweep's row, opened or resumed; whether it was resumed). The started pool is closed
    when the sweep is refused (another driver runs it) or the database fails."""
    judge = options.judge
    try:
        return open_sweep(
            engine,
            identity,
            resume=options.resume,
            mode=judge.mode,
            execution=judge.execution,
            dtype=judge.dtype_name,
            top=options.top,
            model_type=options.model_type,
            dedupe=options.deduped,
            executor=options.executor,
            workers=pool.workers,
            timeout_s=options.timeout,
            memory_limit_mb=memory_limit or None,
            crawl_id=crawl_id,
            models=plan.models,
            units=len(plan.units),
        )
    except BaseException:
        pool.close()
        raise


def _environment_checked(
    engine: Engine, options: SweepOptions, prof: Profile, crawl_id: int | None
) -> tuple[dict[str, Any], list[EnvChange]]:
    """(the sweep's identity, how this process's environment differs from the one the latest
    run of the sweep to resume recorded): nothing for a new sweep, or one whose runs recorded
    none. A change is refused with EnvironmentChangedError naming each key unless
    ``options.allow_env_change``. Read before any worker starts or any row is written. On Ray
    the nodes' numeric path is theirs, not this driver's: only the packages are compared."""
    identity = options.identity(f"{prof.name}@{prof.version}", crawl_id)
    if options.resume is False:
        return identity, []
    found = resumable_sweep(engine, identity, resume=options.resume)
    recorded = sweep_environments(engine, found.id) if found and found.id is not None else []
    if found is None or not recorded:
        return identity, []
    changed = changes(recorded[-1:], [environment(prof)])
    if options.executor == ExecutorName.RAY:
        changed = [c for c in changed if c.key not in NUMERIC_KEYS]
    if changed and not options.allow_env_change:
        raise EnvironmentChangedError(
            f"sweep {found.id} was run in another environment than this one: "
            f"{describe_changes(changed)}; pass {option('allow_env_change')} to resume it "
            "anyway (its new runs record this environment), or start a new sweep (resume=False)",
            changed,
        )
    return identity, changed


def _start_pool(
    options: SweepOptions,
    workers: int,
    units: int,
    memory_limit: int,
    worker: str | Callable[..., object],
    env: dict[str, str],
) -> Executor:
    """The started executor, never with more workers than units of work. On Ray without a
    worker count, the cluster's CPUs decide (known once connected)."""
    cluster = options.workers is None and options.executor == ExecutorName.RAY
    workers = max(1, min(workers, units))
    pool = make_executor(
        options.executor,
        workers=None if cluster else workers,
        timeout=options.timeout,
        memory_limit_mb=memory_limit or None,
        worker=worker,
        address=options.address,
        env=env,
        max_workers=units,
    )
    try:
        pool.start()
    except BaseException:
        pool.close()
        raise
    return pool


class _Driver:
    """One session of a sweep: records the rows the plan already decided, reuses units an
    earlier session half wrote, hands the rest to the executor and records each outcome as it
    arrives, one transaction per unit, reporting progress after each."""

    def __init__(
        self,
        engine: Engine,
        sweep_id: int,
        plan: Plan,
        started: float,
        progress: Callable[[SweepProgress], None] | None,
    ) -> None:
        self.engine, self.sweep_id, self.plan = engine, sweep_id, plan
        self.started, self.progress = started, progress
        self.done = done_rows(engine, sweep_id)
        self.already = len(self.done)
        counts: Counter[str] = Counter(row["verdict"] for row in self.done.values())
        self.state = SweepProgress(
            sweep_id,
            plan.models,
            self.already,
            len(plan.units),
            0,
            counts,
            0.0,
            self.already,
            cost_total=sum(u.cost for u in plan.units) or 1.0,
        )
        self.reused = 0
        self.unit_seconds: dict[str, float] = {}

    def tag(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Remote-code models judged as their native translation say so, members included."""
        for row in rows:
            translated = self.plan.translated.get(row["model_id"])
            if translated is not None:
                evidence = read_evidence(row.get("evidence"))
                evidence["translated_from"] = translated
                row["evidence"] = evidence
        return rows

    def report(self, last: str | None, added: list[dict[str, Any]], unit: Unit | None) -> None:
        state = self.state
        state.counts.update(r["verdict"] for r in added)
        state.done += len(added)
        if unit is not None:
            state.units_done += 1
            state.cost_done += unit.cost
        state.elapsed = time.perf_counter() - self.started
        state.last = last
        if self.progress is not None:
            self.progress(state)

    def record_direct(self) -> None:
        """The rows no worker needs (skipped, custom code, ...)."""
        direct = [r for r in self.plan.direct if r["model_id"] not in self.done]
        if direct:
            write_rows(self.engine, self.sweep_id, direct)
        self.report(None, direct, None)

    def tasks(self, template: Task) -> tuple[list[Task], dict[str, Unit]]:
        """The units left to judge, as tasks like ``template``; units done or half written by
        an earlier session are recorded here instead."""
        plan, done = self.plan, self.done
        tasks: list[Task] = []
        units: dict[str, Unit] = {}
        for unit in plan.units:
            todo = [m for m in unit.members if m not in done]
            if not todo:
                self.state.units_done += 1
                self.state.cost_done += unit.cost
                continue
            earlier = next((done[m] for m in unit.members if m in done), None)
            if earlier is not None:  # a unit half-written by an older plan: copy its verdict
                sweep = read_evidence(earlier.get("evidence")).get("sweep") or SweepEvidence()
                rep = sweep.get("representative") or earlier["model_id"]
                rows = member_rows(unit, todo, earlier, rep, plan.model_types, plan.sources)
                write_rows(self.engine, self.sweep_id, self.tag(rows))
                self.reused += 1
                self.report(rep, rows, unit)
                continue
            units[unit.key] = unit
            small = unit.narrow
            tasks.append(
                replace(
                    template,
                    key=unit.key,
                    model_id=unit.representative,
                    config=unit.config,
                    models=len(unit.members),
                    narrow=small.config if small else None,
                    narrow_changes=small.changes if small else None,
                    config_source=plan.sources.get(unit.representative),
                )
            )
        return tasks, units

    def run(self, executor: Executor, tasks: list[Task], units: dict[str, Unit]) -> None:
        plan = self.plan
        with contextlib.closing(executor):
            for out in executor.run(tasks):
                unit = units[out.key]
                todo = [m for m in unit.members if m not in self.done]
                rows = unit_rows(unit, todo, out, plan.model_types, plan.sources)
                write_rows(self.engine, self.sweep_id, self.tag(rows), judged=1)
                self.unit_seconds[unit.representative] = out.seconds
                self.report(unit.representative, rows, unit)

    def result(self, resumed: bool, judged: int, executor: Executor) -> SweepResult:
        plan = self.plan
        seconds = time.perf_counter() - self.started
        sweep = finish_sweep(self.engine, self.sweep_id, seconds=seconds)
        units = len(plan.units)
        return SweepResult(
            sweep_id=self.sweep_id,
            resumed=resumed,
            models=self.state.done,
            units=units,
            judged=judged,
            reused=self.reused,
            already_done=self.already,
            counts=dict(sweep.counts or {}),
            seconds=round(seconds, 3),
            planning_seconds=plan.signing_seconds,
            workers=getattr(executor, "workers", None) or 0,
            executor=executor.name,
            dedupe_factor=round(plan.judged_models / units, 2) if units else 0.0,
            translated=len(plan.translated),
            worker_restarts=getattr(executor, "restarts", 0),
            driver_peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            worker_peak_rss_mb=getattr(executor, "worker_peak_rss_mb", 0.0),
            unit_seconds=self.unit_seconds,
        )


def _drive(
    engine: Engine,
    sweep_id: int,
    resumed: bool,
    plan: Plan,
    started: float,
    progress: Callable[[SweepProgress], None] | None,
    executor: Executor,
    template: Task,
    changed: list[EnvChange],
) -> SweepResult:
    driver = _Driver(engine, sweep_id, plan, started, progress)
    driver.record_direct()
    tasks, units = driver.tasks(template)
    driver.run(executor, tasks, units)
    result = driver.result(resumed, len(tasks), executor)
    # changes are found only for a sweep to resume: the one resumed here
    result.environment_changes = [str(c) for c in changed] if resumed else []
    return result
