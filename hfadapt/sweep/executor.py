"""Where sweep units run: the ``Executor`` protocol and the executor a name picks
(``LocalExecutor``, a pool of spawned worker processes; ``RayExecutor``, Ray tasks). Executors
only compute: the driver alone writes runs.db."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from hfadapt.errors import UsageError
from hfadapt.options import Executor as ExecutorName
from hfadapt.sweep.worker import DEFAULT_WORKER, Outcome, Task

__all__ = ["Executor", "make_executor"]


class Executor(Protocol):
    """Runs Tasks and yields one Outcome per Task, in completion order."""

    name: str

    @property
    def workers(self) -> int | None:
        """Units at a time (Ray without a count: the cluster's CPUs, known once started)."""
        ...

    def start(self) -> None: ...

    def run(self, tasks: Iterable[Task]) -> Iterator[Outcome]: ...

    def close(self) -> None: ...


def make_executor(
    name: str,
    *,
    workers: int | None,
    timeout: float | None,
    memory_limit_mb: int | None,
    worker: str | Callable[..., object] = DEFAULT_WORKER,
    address: str | None = None,
    env: dict[str, str] | None = None,
    max_workers: int | None = None,
) -> Executor:
    """The executor called ``name`` ("local" or "ray"). ``workers`` None: Ray's default, the
    cluster's CPUs, at most ``max_workers`` (a local pool always gets a number)."""
    kind = ExecutorName.parse(name, "executor")
    if kind is ExecutorName.LOCAL:
        if not isinstance(worker, str):
            raise UsageError("the local executor takes the worker function as 'module:function'")
        from hfadapt.sweep.local_pool import LocalExecutor

        return LocalExecutor(
            workers or 1, timeout=timeout, memory_limit_mb=memory_limit_mb, worker=worker, env=env
        )
    from hfadapt.sweep.ray_pool import RayExecutor

    return RayExecutor(
        workers,
        timeout=timeout,
        memory_limit_mb=memory_limit_mb,
        worker=worker,
        address=address,
        env=env,
        max_workers=max_workers,
    )
