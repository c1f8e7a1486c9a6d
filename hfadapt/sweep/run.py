"""Batch coverage sweeps: judge every crawled model on the simulated device, cheaply and
safely. Models sharing a structural signature are judged once (structural mode) and every
model still gets its own ``Run`` row pointing at the representative's evidence; prefilter
exclusions are recorded ``skipped`` and custom-code models ``custom_code``, never dropped.
Units run in isolated workers (``hfadapt.sweep.local_pool``); this driver alone writes runs.db, one
transaction per unit, so a sweep killed at any moment resumes where it stopped."""

from __future__ import annotations

import contextlib
import math
import os
import resource
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Engine

from hfadapt import settings
from hfadapt.errors import SweepError, UsageError, option
from hfadapt.options import DType, Execution, Executor, Mode
from hfadapt.sweep.executor import make_executor
from hfadapt.sweep.limits import default_memory_limit_mb, max_local_workers
from hfadapt.sweep.plan import Plan, Unit, plan_sweep
from hfadapt.sweep.rows import member_rows, unit_rows
from hfadapt.sweep.store import FAILED, INTERRUPTED, done_rows, finish_sweep, open_sweep, write_rows
from hfadapt.sweep.worker import DEFAULT_WORKER, Task

DEFAULT_TIMEOUT_S = 600.0  # hf-adapters' weekly scan: ten minutes per model
__all__ = ["SweepError", "SweepProgress", "SweepResult", "run_sweep"]


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

    @property
    def models_per_minute(self) -> float:
        new = self.models - self.already_done
        return 60.0 * new / self.seconds if self.seconds > 0 else 0.0


def _check(
    mode: str,
    execution: str,
    dtype: str,
    workers: int,
    timeout: float | None,
    executor: str,
    memory_limit: int | None,
) -> None:
    from hfadapt.spyre.profile import AUTO_DTYPE

    Mode.parse(mode, "mode")
    Execution.parse(execution, "execution")
    if dtype != AUTO_DTYPE:  # "auto": the profile's dtype per family, chosen per model
        DType.parse(dtype, "dtype")
    Executor.parse(executor, "executor")
    if workers < 1:
        raise UsageError(f"workers must be at least 1 (got {workers})")
    if executor == Executor.LOCAL:
        cap, why = max_local_workers(memory_limit)
        if workers > cap:
            raise UsageError(
                f"workers={workers} is more than this machine holds: at most {cap} ({why})"
            )
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise UsageError(f"timeout must be a finite number of seconds above 0 (got {timeout})")
    if memory_limit is not None and memory_limit < 0:
        raise UsageError(f"memory_limit must be 0 (none) or a number of MB (got {memory_limit})")


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
    *,
    top: int | None = None,
    model_type: str | None = None,
    mode: str = "structural",
    workers: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
    memory_limit: int | None = None,
    executor: str = "local",
    address: str | None = None,
    execution: str = "compile",
    dtype: str | None = None,
    profile: str | None = None,
    adapters: bool = True,
    dedupe: bool | None = None,
    narrow: bool = True,
    resume: bool | int = True,
    offline: bool | None = None,
    progress: Callable[[SweepProgress], None] | None = None,
    worker: str | Callable[..., Any] = DEFAULT_WORKER,
    runner: str | None = None,
    trust_remote_code: bool = False,
    unsafe_no_isolation: bool = False,
) -> SweepResult:
    """Sweep the crawled models (crawling the bundled snapshot first if the database has no
    crawl) and return what it did. See the module doc.

    ``execution``: "compile" (default: hf-adapters judges through torch.compile) or "eager".
    ``dtype``: fp16, bf16 or fp32 for every model; None ("auto"): the profile's dtype for each
    model's family (bf16 for Gemma and T5), recorded on every run.
    ``workers``: parallel units (default: the CPUs, at most 2 locally). ``timeout``: seconds per
    unit. ``memory_limit``: MB of address space per worker (default: 85% of RAM shared; 0 for
    none). ``dedupe``: one run per structural signature (default: in structural mode only).
    ``narrow``: judge a wide signature on a narrower config with the same signature first
    (hfadapt.sweep.narrow; numerics and load failures are confirmed at full width).
    ``resume``: continue the newest unfinished sweep with the same options (an int: that
    sweep; False: a new one). ``offline``: no Hub requests (default: when the crawl is the
    bundled snapshot). ``worker``/``runner``: the worker function and device runner as
    ``module:function`` (tests inject stand-ins). ``trust_remote_code``: models that need
    their own code (and have no native translation) are judged in the OS sandbox
    (hfadapt.sweep.remote), never in this process or a worker; IsolationUnavailableError
    before any work where bubblewrap cannot isolate them, unless ``unsafe_no_isolation``.
    """
    from hfadapt.spyre.profile import load_profile

    # On Ray the default is the cluster's CPUs, known once connected (RayExecutor.start).
    cluster_workers = workers is None and executor == "ray"
    if workers is None:  # the default never exceeds what this machine holds
        cap = max_local_workers(memory_limit)[0] if executor == "local" else os.cpu_count() or 1
        workers = max(1, min(2, cap))
    dtype = dtype or "auto"  # hfadapt.spyre.profile.AUTO_DTYPE, without importing torch here
    _check(mode, execution, dtype, workers, timeout, executor, memory_limit)
    if unsafe_no_isolation and not trust_remote_code:
        raise UsageError("unsafe_no_isolation applies only with trust_remote_code=True")
    if trust_remote_code:
        from hfadapt.isolation import require_isolation

        require_isolation(
            unsafe=unsafe_no_isolation, what=f"the model's own code ({option('trust_remote_code')})"
        )
    prof = load_profile(profile)
    if memory_limit is None:
        memory_limit = default_memory_limit_mb(workers)
    dedupe = (mode == "structural") if dedupe is None else dedupe
    started = time.perf_counter()

    models, crawl = _models(engine, top, model_type)
    if offline is None:
        offline = crawl is not None and crawl.source == "snapshot"
    env = {"HF_HUB_OFFLINE": "1"} if offline else {}
    with settings.exported(env):
        plan = plan_sweep(models, mode=mode, dedupe=dedupe, narrow=narrow)
    # Workers start only once the plan stands: bad input or a failed plan spawns nothing, and
    # there are never more workers than units of work.
    workers = max(1, min(workers, len(plan.units)))
    pool = make_executor(
        executor, workers=None if cluster_workers else workers, timeout=timeout,
        memory_limit_mb=memory_limit or None, worker=worker, address=address, env=env,
    )  # fmt: skip
    try:
        pool.start()
    except BaseException:
        pool.close()
        raise
    if cluster_workers:
        workers = max(1, min(getattr(pool, "workers", None) or workers, len(plan.units)))
        pool.workers = workers  # type: ignore[attr-defined]
    options = {
        "mode": mode,
        "execution": execution,
        "dtype": dtype,
        "top": top,
        "model_type": model_type,
        "dedupe": dedupe,
        "narrow": narrow and dedupe and mode == "structural",
        "profile": f"{prof.name}@{prof.version}",
        "adapters": adapters,
        "crawl_id": crawl.id if crawl else None,
    }
    if trust_remote_code:  # only then: sweeps started before this option resume as before
        options["trust_remote_code"] = True
    try:
        sweep, resumed = open_sweep(
            engine, options, resume=resume, mode=mode, execution=execution, dtype=dtype,
            top=top, model_type=model_type, dedupe=dedupe, executor=executor, workers=workers,
            timeout_s=timeout, memory_limit_mb=memory_limit or None,
            crawl_id=crawl.id if crawl else None, models=plan.models, units=len(plan.units),
        )  # fmt: skip
    except BaseException:  # refused (another driver runs it), or the database failed
        pool.close()
        raise
    assert sweep.id is not None
    try:
        if trust_remote_code:
            from hfadapt.sweep.remote import judge_custom_code

            plan.direct = judge_custom_code(
                plan.direct, done_rows(engine, sweep.id), mode=mode, execution=execution,
                dtype=dtype, profile=profile, adapters=adapters,
                unsafe_no_isolation=unsafe_no_isolation,
            )  # fmt: skip
        return _drive(
            engine, sweep.id, resumed, plan, started, progress,
            executor=pool,
            task_options={"mode": mode, "execution": execution, "dtype": dtype, "profile": profile, "adapters": adapters, "runner": runner},
        )  # fmt: skip
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


def _drive(
    engine: Engine,
    sweep_id: int,
    resumed: bool,
    plan: Plan,
    started: float,
    progress: Callable[[SweepProgress], None] | None,
    *,
    executor: Any,
    task_options: dict[str, Any],
) -> SweepResult:
    done = done_rows(engine, sweep_id)
    already = len(done)
    counts: Counter[str] = Counter(row["verdict"] for row in done.values())
    types = plan.model_types
    state = SweepProgress(
        sweep_id, plan.models, already, len(plan.units), 0, counts, 0.0, already,
        cost_total=sum(u.cost for u in plan.units) or 1.0,
    )  # fmt: skip

    def tag(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Remote-code models judged as their native translation say so, members included."""
        for row in rows:
            if row["model_id"] in plan.translated:
                row["evidence"] = {
                    **(row.get("evidence") or {}),
                    "translated_from": plan.translated[row["model_id"]],
                }
        return rows

    def report(last: str | None, added: list[dict[str, Any]], unit: Unit | None = None) -> None:
        counts.update(r["verdict"] for r in added)
        state.done += len(added)
        if unit is not None:
            state.units_done += 1
            state.cost_done += unit.cost
        state.elapsed = time.perf_counter() - started
        state.last = last
        if progress is not None:
            progress(state)

    direct = [r for r in plan.direct if r["model_id"] not in done]
    if direct:
        write_rows(engine, sweep_id, direct)
    report(None, direct)

    tasks: list[Task] = []
    units: dict[str, Unit] = {}
    reused = 0
    for unit in plan.units:
        todo = [m for m in unit.members if m not in done]
        if not todo:
            state.units_done += 1
            state.cost_done += unit.cost
            continue
        earlier = next((done[m] for m in unit.members if m in done), None)
        if earlier is not None:  # a unit half-written by an older plan: copy its verdict
            rep = (earlier.get("evidence") or {}).get("sweep", {}).get("representative") or earlier[
                "model_id"
            ]
            rows = member_rows(unit, todo, earlier, rep, types, plan.sources)
            write_rows(engine, sweep_id, tag(rows))
            reused += 1
            report(rep, rows, unit)
            continue
        units[unit.key] = unit
        small = unit.narrow
        tasks.append(
            Task(
                unit.key, unit.representative, config=unit.config, models=len(unit.members),
                narrow=small.config if small else None, narrow_changes=small.changes if small else None,
                config_source=plan.sources.get(unit.representative),
                **task_options,
            )
        )  # fmt: skip

    unit_seconds: dict[str, float] = {}
    with contextlib.closing(executor):
        for out in executor.run(tasks):
            unit = units[out.key]
            rows = unit_rows(
                unit, [m for m in unit.members if m not in done], out, types, plan.sources
            )
            write_rows(engine, sweep_id, tag(rows), judged=1)
            unit_seconds[unit.representative] = out.seconds
            report(unit.representative, rows, unit)

    seconds = time.perf_counter() - started
    sweep = finish_sweep(engine, sweep_id, seconds=seconds)
    judged_models = plan.judged_models
    return SweepResult(
        sweep_id=sweep_id,
        resumed=resumed,
        models=state.done,
        units=len(plan.units),
        judged=len(tasks),
        reused=reused,
        already_done=already,
        counts=dict(sweep.counts or {}),
        seconds=round(seconds, 3),
        planning_seconds=plan.signing_seconds,
        workers=getattr(executor, "workers", None) or 0,
        executor=executor.name,
        dedupe_factor=round(judged_models / len(plan.units), 2) if plan.units else 0.0,
        translated=len(plan.translated),
        worker_restarts=getattr(executor, "restarts", 0),
        driver_peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        worker_peak_rss_mb=getattr(executor, "worker_peak_rss_mb", 0.0),
        unit_seconds=unit_seconds,
    )
