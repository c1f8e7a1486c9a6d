"""``--executor ray``: the sweep's worker function as Ray tasks, on a local Ray instance or a
remote cluster (``--address``). Needs the optional extra ``ray`` (``pip install '.[ray]'`` in a checkout). Each task runs
under a memory limit (RLIMIT_AS, counted on top of the Ray worker's own address space, which
maps the object store); a task past its time limit is force-cancelled (``worker_timeout``),
a Ray worker that dies is ``worker_crashed``. A task's time limit counts from when it starts
running, not from when it was submitted: a task queued behind others on a busy cluster is
not timed out for waiting (each task tells a small Ray actor when it starts). Results come
back to the driver, which alone writes runs.db; each says which host and Ray node judged it
(``evidence.sweep.worker_host`` / ``worker_node``). docs/cluster.md: running on a cluster."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hfadapt import settings, verdicts
from hfadapt.errors import SweepError
from hfadapt.sweep.limits import CRASH_HINT
from hfadapt.sweep.worker import (
    DEFAULT_WORKER,
    Outcome,
    Task,
    crashed,
    is_out_of_memory,
    out_of_memory,
)

__all__ = ["RayExecutor", "StartLog", "ray_task"]

_prepared = False
# While some submitted task has not started, the driver looks for starts this often (seconds).
START_POLL_S = 0.25


class StartLog:
    """A Ray actor's class: tasks ``mark`` their key when they start running; the driver
    ``drain``s the keys marked since it last asked."""

    def __init__(self) -> None:
        self.keys: list[int] = []

    def mark(self, key: int) -> None:
        self.keys.append(key)

    def drain(self) -> list[int]:
        keys, self.keys = self.keys, []
        return keys


def _address_space_mb() -> int:
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[0])
        return int(pages * os.sysconf("SC_PAGE_SIZE") / 2**20)
    except (OSError, ValueError):
        return 0


def ray_task(
    worker: str | Callable[..., Any],
    task: Task,
    limit_mb: int | None,
    threads: int | None,
    env: dict[str, str] | None,
    starts: Any = None,
    key: int = 0,
) -> Outcome:
    """What one Ray task runs: the same ``run_task`` a local worker runs, after telling the
    ``starts`` actor (a StartLog) that task ``key`` has started."""
    from hfadapt.sweep.worker import resolve, run_task, setup_process

    if starts is not None:
        import ray

        ray.get(starts.mark.remote(key))

    global _prepared
    if not _prepared:  # a Ray worker process runs many tasks: threads are set once
        setup_process(threads, None)
        _prepared = True
    if env:
        settings.export(env)
    # the cap counts on top of what the Ray worker maps already (its object store); the limit
    # itself, as configured, sizes the stand-ins and words an out-of-memory, as a local worker
    out = run_task(resolve(worker), task, limit_mb=limit_mb, extra_mb=_address_space_mb())
    out.host = platform.node()
    try:
        import ray

        out.node = ray.get_runtime_context().get_node_id()
    except Exception:  # called outside a Ray worker (tests call it directly)
        out.node = None
    return out


class RayExecutor:
    """Ray tasks, at most ``workers`` at a time (default: the cluster's CPUs, at most
    ``max_workers``)."""

    name = "ray"

    def __init__(
        self,
        workers: int | None = None,
        *,
        timeout: float | None = 600.0,
        memory_limit_mb: int | None = None,
        worker: str | Callable[..., object] = DEFAULT_WORKER,
        address: str | None = None,
        env: dict[str, str] | None = None,
        init_kwargs: dict[str, Any] | None = None,
        max_workers: int | None = None,
    ) -> None:
        try:
            import ray  # noqa: F401
        except ImportError as exc:
            raise SweepError("the ray executor needs Ray: pip install '.[ray]'") from exc
        self.workers = workers
        self.max_workers = max_workers
        self.timeout = timeout
        self.memory_limit_mb = memory_limit_mb
        self.worker = worker
        self.address = address
        self.env = env or {}
        self.init_kwargs = init_kwargs or {}
        self._owns = False
        self.worker_peak_rss_mb = 0.0
        self.restarts = 0

    def _connect(self) -> Any:
        import ray

        if not ray.is_initialized():
            kwargs = {"include_dashboard": False, "log_to_driver": False, **self.init_kwargs}
            if self.address:
                kwargs["address"] = self.address
            try:
                ray.init(**kwargs)
            except Exception as exc:  # ConnectionError, a bad address, a version mismatch
                where = self.address or "a local Ray instance"
                raise SweepError(
                    f"cannot start or reach {where}: {' '.join(str(exc).split())[:300]}"
                ) from exc
            self._owns = True
        return ray

    def start(self) -> None:
        """Connect to (or start) Ray now: a local instance takes seconds to come up. Without
        a number of workers, run as many tasks at a time as the cluster has CPUs."""
        ray = self._connect()
        if self.workers is None:
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
            self.workers = min(cpus, self.max_workers or cpus)

    def run(self, tasks: Iterable[Task]) -> Iterator[Outcome]:
        pending = list(tasks)
        if not pending:
            return
        ray = self._connect()
        cpus = int(ray.cluster_resources().get("CPU", 1))
        slots = max(1, self.workers or cpus)
        threads = max(1, cpus // slots) if not self.address else None
        remote = ray.remote(num_cpus=1, max_retries=0)(ray_task)
        starts = ray.remote(num_cpus=0)(StartLog).remote()
        pending.reverse()
        # ref -> (task, submission key, monotonic time the driver saw it start, or None)
        running: dict[Any, tuple[Task, int, float | None]] = {}
        by_key: dict[int, Any] = {}
        submitted = 0
        while pending or running:
            while pending and len(running) < slots:
                task = pending.pop()
                submitted += 1
                ref = remote.remote(
                    self.worker, task, self.memory_limit_mb, threads, self.env, starts, submitted
                )
                running[ref] = (task, submitted, None)
                by_key[submitted] = ref
            wait_for = self._wait_for(running)
            done, _ = ray.wait(list(running), num_returns=1, timeout=wait_for)
            now = time.monotonic()
            for key in ray.get(starts.drain.remote()):
                ref = by_key.get(key)
                if ref in running and running[ref][2] is None:
                    task, _, _ = running[ref]
                    running[ref] = (task, key, now)
            for ref in done:
                task, key, start = running.pop(ref)
                by_key.pop(key, None)
                yield self._result(ray, ref, task, now - start if start is not None else 0.0)
            if self.timeout:
                for ref, (task, key, start) in list(running.items()):
                    if start is not None and now - start >= self.timeout:
                        ray.cancel(ref, force=True)
                        running.pop(ref)
                        by_key.pop(key, None)
                        self.restarts += 1
                        out = crashed(
                            task,
                            f"no result within {self.timeout:g} s: the Ray task judging {task.model_id} was cancelled",
                            verdict=verdicts.WORKER_TIMEOUT,
                            timeout_s=self.timeout,
                        )
                        out.seconds = round(now - start, 3)
                        yield out

    def _wait_for(self, running: dict[object, tuple[Task, int, float | None]]) -> float | None:
        """How long to wait for a result: until the earliest started task's time is up, and no
        longer than START_POLL_S while a task has not been seen to start."""
        waits: list[float] = []
        if any(start is None for _, _, start in running.values()):
            waits.append(START_POLL_S)
        if self.timeout:
            started = [start for _, _, start in running.values() if start is not None]
            if started:
                waits.append(max(0.05, min(started) + self.timeout - time.monotonic()))
        return min(waits) if waits else None

    def _result(self, ray: Any, ref: Any, task: Task, seconds: float) -> Outcome:
        try:
            out: Outcome = ray.get(ref)
        except Exception as exc:  # WorkerCrashedError, OutOfMemoryError, RayTaskError...
            self.restarts += 1
            text = " ".join(str(exc).split())[:300]
            # Ray's memory monitor (OutOfMemoryError), or an allocation failure
            if type(exc).__name__ == "OutOfMemoryError" or is_out_of_memory(text):
                out = out_of_memory(task, self.memory_limit_mb, f"{type(exc).__name__}: {text}")
            else:
                out = crashed(
                    task,
                    f"the Ray worker judging {task.model_id} failed: {type(exc).__name__}: {text}"
                    f"{CRASH_HINT}",
                )
            out.seconds = round(seconds, 3)
            return out
        self.worker_peak_rss_mb = max(self.worker_peak_rss_mb, out.peak_rss_mb or 0.0)
        return out

    def close(self) -> None:
        if self._owns:
            import ray

            ray.shutdown()
            self._owns = False
