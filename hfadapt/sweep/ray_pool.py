"""``--executor ray``: the sweep's worker function as Ray tasks, on a local Ray instance or a
remote cluster (``--address``). Needs the optional extra ``hfadapt[ray]``. Each task runs
under a memory limit (RLIMIT_AS, counted on top of the Ray worker's own address space, which
maps the object store); a task past its time limit is force-cancelled (``worker_timeout``),
a Ray worker that dies is ``worker_crashed``. Results come back to the driver, which alone
writes runs.db."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from hfadapt import verdicts
from hfadapt.errors import SweepError
from hfadapt.sweep.worker import DEFAULT_WORKER, Outcome, Task, crashed

__all__ = ["RayExecutor", "ray_task"]

_prepared = False


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
) -> Outcome:
    """What one Ray task runs: the same ``run_task`` a local worker runs."""
    from hfadapt.sweep.worker import resolve, run_task, setup_process

    global _prepared
    if not _prepared:  # a Ray worker process runs many tasks: threads are set once
        setup_process(threads, None)
        _prepared = True
    if env:
        os.environ.update(env)
    limit = _address_space_mb() + limit_mb if limit_mb else None
    return run_task(resolve(worker), task, limit_mb=limit)


class RayExecutor:
    """Ray tasks, at most ``workers`` at a time (default: the cluster's CPUs)."""

    name = "ray"

    def __init__(
        self,
        workers: int | None = None,
        *,
        timeout: float | None = 600.0,
        memory_limit_mb: int | None = None,
        worker: str | Callable[..., Any] = DEFAULT_WORKER,
        address: str | None = None,
        env: dict[str, str] | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        try:
            import ray  # noqa: F401
        except ImportError as exc:
            raise SweepError("--executor ray needs Ray: pip install 'hfadapt[ray]'") from exc
        self.workers = workers
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
        """Connect to (or start) Ray now: a local instance takes seconds to come up."""
        self._connect()

    def run(self, tasks: Iterable[Task]) -> Iterator[Outcome]:
        pending = list(tasks)
        if not pending:
            return
        ray = self._connect()
        cpus = int(ray.cluster_resources().get("CPU", 1))
        slots = max(1, self.workers or cpus)
        threads = max(1, cpus // slots) if not self.address else None
        remote = ray.remote(num_cpus=1, max_retries=0)(ray_task)
        pending.reverse()
        running: dict[Any, tuple[Task, float]] = {}
        while pending or running:
            while pending and len(running) < slots:
                task = pending.pop()
                ref = remote.remote(self.worker, task, self.memory_limit_mb, threads, self.env)
                running[ref] = (task, time.monotonic())
            wait_for = None
            if self.timeout:
                first = min(start for _, start in running.values())
                wait_for = max(0.05, first + self.timeout - time.monotonic())
            done, _ = ray.wait(list(running), num_returns=1, timeout=wait_for)
            for ref in done:
                task, start = running.pop(ref)
                yield self._result(ray, ref, task, time.monotonic() - start)
            if self.timeout:
                now = time.monotonic()
                for ref, (task, start) in list(running.items()):
                    if now - start >= self.timeout:
                        ray.cancel(ref, force=True)
                        running.pop(ref)
                        self.restarts += 1
                        out = crashed(
                            task,
                            f"no result within {self.timeout:g} s: the Ray task judging {task.model_id} was cancelled",
                            verdict=verdicts.WORKER_TIMEOUT,
                            timeout_s=self.timeout,
                        )
                        out.seconds = round(now - start, 3)
                        yield out

    def _result(self, ray: Any, ref: Any, task: Task, seconds: float) -> Outcome:
        try:
            out: Outcome = ray.get(ref)
        except Exception as exc:  # WorkerCrashedError, OutOfMemoryError, RayTaskError...
            self.restarts += 1
            text = " ".join(str(exc).split())[:300]
            out = crashed(
                task, f"the Ray worker judging {task.model_id} failed: {type(exc).__name__}: {text}"
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
