"""Where sweep units run. ``LocalExecutor``: a pool of long-lived *spawned* worker processes
(imports paid once per worker, not per unit), each under a memory limit (RLIMIT_AS); a unit
past its time limit gets its worker killed (``worker_timeout``), a worker that dies mid-unit
is ``worker_crashed``, and either way a fresh worker takes its place and the sweep goes on.
``hfadapt.sweep.ray_pool.RayExecutor`` runs the same worker function on a Ray cluster."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from hfadapt import verdicts
from hfadapt.errors import SweepError
from hfadapt.sweep.limits import CRASH_HINT, describe_exit
from hfadapt.sweep.worker import DEFAULT_WORKER, Outcome, Task, crashed, serve

# A worker that dies this many times in a row before taking a unit cannot start at all.
MAX_START_FAILURES = 3
START_TIMEOUT_S = 300.0

__all__ = ["LocalExecutor"]


@contextlib.contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """SIGINT ignored while a worker is spawned, so the new process inherits that (Python keeps
    an ignored SIGINT at startup): a Ctrl-C that reaches the whole process group while a worker
    is still importing must not print its traceback. The worker ignores it anyway once serving."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class _Slot:
    process: Any
    conn: Connection
    ready: bool = False
    task: Task | None = None
    deadline: float | None = None
    started: float = 0.0
    pid: int | None = None


class LocalExecutor:
    """``workers`` spawned processes on this machine (see module doc)."""

    name = "local"

    def __init__(
        self,
        workers: int = 1,
        *,
        timeout: float | None = 600.0,
        memory_limit_mb: int | None = None,
        worker: str = DEFAULT_WORKER,
        threads: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.workers = workers
        self.timeout = timeout
        self.memory_limit_mb = memory_limit_mb
        self.worker = worker
        self.threads = threads or max(1, (os.cpu_count() or 1) // workers)
        self.env = env or {}
        self._ctx = mp.get_context("spawn")
        self._slots: list[_Slot] = []
        self._start_failures = 0
        self.restarts = 0
        self.worker_peak_rss_mb = 0.0

    # ---- processes -----------------------------------------------------------------------

    def _spawn(self) -> _Slot:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(
            target=serve,
            args=(child, self.worker, self.memory_limit_mb, self.threads, self.env),
            name="hfadapt-sweep-worker",
            daemon=True,
        )
        with _ctrl_c_ignored():
            process.start()  # the child starts with Ctrl-C ignored: it is the driver's to handle
        child.close()
        return _Slot(process, parent, started=time.monotonic())

    def _stop(self, slot: _Slot, *, kill: bool) -> None:
        if kill and slot.process.is_alive():
            with contextlib.suppress(Exception):
                slot.process.kill()
        elif slot.process.is_alive():
            with contextlib.suppress(Exception):
                slot.conn.send(None)
        slot.process.join(timeout=10)
        if slot.process.is_alive():
            slot.process.kill()
            slot.process.join(timeout=5)
        with contextlib.suppress(Exception):
            slot.conn.close()
        with contextlib.suppress(Exception):
            slot.process.close()

    def _replace(self, index: int, *, kill: bool) -> None:
        self._stop(self._slots[index], kill=kill)
        self._slots[index] = self._spawn()
        self.restarts += 1

    def close(self) -> None:
        """Stop every worker: idle ones are asked to exit, the others (busy, still starting)
        are killed; none is waited for longer than a few seconds."""
        for slot in self._slots:
            if slot.ready and slot.task is None and slot.process.is_alive():
                with contextlib.suppress(Exception):
                    slot.conn.send(None)
            else:
                with contextlib.suppress(Exception):
                    slot.process.kill()
        deadline = time.monotonic() + 5
        for slot in self._slots:
            slot.process.join(timeout=max(0.0, deadline - time.monotonic()))
            self._stop(slot, kill=True)
        self._slots = []

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the loop ------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the workers now (they import while the caller does something else)."""
        while len(self._slots) < self.workers:
            self._slots.append(self._spawn())

    def run(self, tasks: Iterable[Task]) -> Iterator[Outcome]:
        pending = deque(tasks)
        if not pending:
            self.close()
            return
        while len(self._slots) < min(self.workers, len(pending)):
            self._slots.append(self._spawn())
        try:
            yield from self._loop(pending)
        finally:
            self.close()

    def _loop(self, pending: deque[Task]) -> Iterator[Outcome]:
        while pending or any(s.task is not None for s in self._slots):
            for slot in self._slots:
                if slot.ready and slot.task is None and pending:
                    task = pending.popleft()
                    slot.conn.send(task)
                    slot.task = task
                    slot.started = time.monotonic()
                    slot.deadline = slot.started + self.timeout if self.timeout else None
            now = time.monotonic()
            deadlines = [s.deadline for s in self._slots if s.task is not None and s.deadline]
            deadlines += [s.started + START_TIMEOUT_S for s in self._slots if not s.ready]
            wait_for = max(0.0, min(deadlines) - now) if deadlines else None
            handles: list[Any] = [s.conn for s in self._slots] + [
                s.process.sentinel for s in self._slots
            ]
            ready = set(wait(handles, timeout=wait_for))
            for index, slot in enumerate(list(self._slots)):
                out = self._check(index, slot, ready)
                if out is not None:
                    yield out

    def _check(self, index: int, slot: _Slot, ready: set[Any]) -> Outcome | None:
        now = time.monotonic()
        if slot.conn in ready:
            try:
                kind, payload = slot.conn.recv()
            except (EOFError, OSError):
                kind, payload = "eof", None
            if kind == "ready":
                slot.ready, slot.pid = True, payload
                self._start_failures = 0
                return None
            if kind == "done":
                out: Outcome = payload
                slot.task = None
                self.worker_peak_rss_mb = max(self.worker_peak_rss_mb, out.peak_rss_mb or 0.0)
                if out.restart:
                    self._replace(index, kill=False)
                return out
        if slot.conn in ready or slot.process.sentinel in ready:
            slot.process.join(timeout=5)
            how = describe_exit(slot.process.exitcode)
            task = slot.task
            if task is None:
                self._start_failures += 1
                if self._start_failures >= MAX_START_FAILURES:
                    raise SweepError(
                        f"sweep workers cannot start: the last one {how} before taking any work"
                    )
                self._replace(index, kill=True)
                return None
            self._replace(index, kill=True)
            hint = CRASH_HINT if "SIGKILL" in how else ""
            out = crashed(
                task, f"the worker process {how} while judging {task.model_id}{hint}", exit=how
            )
            return self._stamp(out, now - slot.started, slot.pid)
        if slot.task is not None and slot.deadline is not None and now >= slot.deadline:
            task = slot.task
            self._replace(index, kill=True)
            out = crashed(
                task,
                f"no result within {self.timeout:g} s: the worker judging {task.model_id} was killed",
                verdict=verdicts.WORKER_TIMEOUT,
                timeout_s=self.timeout,
            )
            return self._stamp(out, now - slot.started, slot.pid)
        if not slot.ready and now - slot.started >= START_TIMEOUT_S:
            raise SweepError(f"a sweep worker did not start within {START_TIMEOUT_S:g} s")
        return None

    @staticmethod
    def _stamp(out: Outcome, seconds: float, pid: int | None) -> Outcome:
        out.seconds, out.pid = round(seconds, 3), pid
        return out
