"""What a sweep worker does: judge one unit of work (one structural signature, or one model)
and return its result as plain data, never touching runs.db. ``judge_unit`` is the real worker
function (``hfadapt.diagnose`` with ``record=False``); ``serve`` is the loop of a
long-lived worker process that runs many units under a memory limit. Executors (local pool,
Ray) call the same function, named by an import path so any process can load it."""

from __future__ import annotations

import contextlib
import contextvars
import os
import pkgutil
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Unpack

from hfadapt import own_process, settings, verdicts
from hfadapt.judge.device_runner import Runner
from hfadapt.judge.evidence_types import NarrowedEvidence, WorkerFailureEvidence, read_evidence
from hfadapt.judge.options import JudgeOptions
from hfadapt.loading import sizing
from hfadapt.options import Mode

DEFAULT_WORKER = "hfadapt.sweep.worker:judge_unit"
# Text of the allocation failures torch, numpy and Python raise under RLIMIT_AS.
_OOM_MARKERS = ("can't allocate memory", "cannot allocate memory", "std::bad_alloc", "MemoryError")
# The sweep's per-worker limit of the unit running in this process (judge_unit words with it).
_limit: contextvars.ContextVar[int | None] = contextvars.ContextVar("worker_limit", default=None)

__all__ = [
    "DEFAULT_WORKER",
    "Outcome",
    "Task",
    "crashed",
    "is_out_of_memory",
    "judge_unit",
    "memory_limit",
    "out_of_memory",
    "resolve",
    "run_task",
    "serve",
]


@dataclass
class Task:
    """One unit of work: judge ``model_id`` (the representative of ``key``) once."""

    key: str  # the structural signature, or "model:<id>" for a model judged alone
    model_id: str
    # how to judge it (sweeps keep the cost down: localization is for `hfadapt diagnose`)
    judge: JudgeOptions = field(
        default_factory=lambda: JudgeOptions(Mode.STRUCTURAL, localize=False)
    )
    config: dict[str, Any] | None = None  # the crawled config.json, when the crawl had it
    runner: str | None = None  # "module:attr" of a device runner (None: the simulated device)
    models: int = 1  # how many models share this unit (for messages)
    narrow: dict[str, Any] | None = None  # a narrower config with the same signature, tried first
    narrow_changes: dict[str, Any] | None = None  # field -> (real, narrowed)
    # where the planned config came from (hfadapt.judge.evidence): the run's evidence level
    config_source: str | None = None


@dataclass
class Outcome:
    """What a worker made of a Task: the verdict and the Run columns of the representative."""

    key: str
    model_id: str
    verdict: str
    reason: str
    row: dict[str, Any] = field(default_factory=dict)  # Run columns (no id, sweep_id)
    seconds: float = 0.0
    pid: int | None = None
    peak_rss_mb: float | None = None
    restart: bool = False  # the worker process should not be reused (memory exhausted)
    host: str | None = None  # the machine that judged it (set by the Ray executor)
    node: str | None = None  # the Ray node id (two nodes may share one machine)


def resolve(ref: str | Callable[..., object]) -> Callable[..., Any]:
    """A callable from ``"package.module:attr"`` (or the callable itself)."""
    if callable(ref):
        return ref
    target = pkgutil.resolve_name(ref)
    if not callable(target):
        raise TypeError(f"{ref} is not callable")
    return target  # type: ignore[no-any-return]


def peak_rss_mb() -> float:
    """The peak resident memory of this process so far, in MB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20, 1)
    except (OSError, ValueError):
        return peak_rss_mb()


def crashed(
    task: Task,
    reason: str,
    *,
    verdict: str = verdicts.WORKER_CRASHED,
    **evidence: Unpack[WorkerFailureEvidence],
) -> Outcome:
    """The Outcome of a unit whose worker died, hung or raised: no metrics, the reason why."""
    row = {
        "verdict": verdict,
        "reason": reason,
        "mode": task.judge.mode.value,
        "execution": task.judge.execution.value,
        "dtype": task.judge.dtype_name,
        "evidence": {k: v for k, v in evidence.items() if v is not None},
    }
    return Outcome(task.key, task.model_id, verdict, reason, row)


def is_out_of_memory(text: str) -> bool:
    """Whether an error's text is an allocation failure (torch's, numpy's, Python's)."""
    return any(marker.lower() in text.lower() for marker in _OOM_MARKERS)


def out_of_memory(
    task: Task, limit_mb: int | None, detail: str, *, judged_as: str | None = None
) -> Outcome:
    """The worker_crashed Outcome of a unit that ran out of memory, said in words with what to
    do; the allocator's own text goes to the evidence (``error``), never into the reason. The
    same for every executor: ``limit_mb`` is the sweep's per-worker limit as configured."""
    within = f"the worker's {limit_mb} MB limit" if limit_mb else "this machine's memory"
    sized = (
        f" (its structural stand-in was sized to {sizing.budget_for_limit(limit_mb)} MB)"
        if task.judge.structural
        else ""
    )
    reason = (
        f"out of memory: judging {task.model_id} needed more than {within}{sized}; what to do: "
        "give each worker more (--memory-limit MB, or fewer --workers), or judge it alone: "
        f"hfadapt diagnose {task.model_id} --mode {task.judge.mode.value}"
    )
    details = " ".join(detail.split())[:300]
    failure: WorkerFailureEvidence = {
        "out_of_memory": True,
        "memory_limit_mb": limit_mb,
        "allocator": details,
    }
    if judged_as is not None:
        failure["judged_as"] = judged_as
    out = crashed(task, reason, **failure)
    out.restart = True  # the allocator may hold what it could get: a fresh process goes on
    return out


@contextlib.contextmanager
def memory_limit(limit_mb: int | None) -> Iterator[None]:
    """Cap this process's address space (RLIMIT_AS soft limit) to ``limit_mb`` while inside."""
    if not limit_mb:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = int(limit_mb) * 2**20
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


# Verdicts a narrowed instance decides for its signature; any other is confirmed at full width.
NARROW_DECIDES = frozenset({verdicts.PASS, verdicts.LOWERING_FAILED, verdicts.UNSUPPORTED_MODEL})


def _diagnose(
    task: Task, config: dict[str, object] | None, runner: Runner | None
) -> tuple[str, str, dict[str, Any]]:
    """(verdict, reason, Run columns) of one diagnosis of the task's model; in structural mode
    with ``config`` (the crawled one, or a narrowed instance) instead of the one hfadapt would
    find for it, labelled with the config source the plan found."""
    from hfadapt.errors import InputError
    from hfadapt.judge.diagnose import diagnose

    judge = task.judge
    given = config if judge.structural else None
    try:
        diag = diagnose(
            task.model_id,
            mode=judge.mode,
            dtype=judge.dtype_name,
            execution=judge.execution,
            adapters=judge.adapters,
            without_adapters=judge.without_adapters,
            profile=judge.profile,
            runner=runner,
            record=False,
            localize_failures=judge.localize,
            config=given,
            config_source=task.config_source if given is not None else None,
            reuse_reference=False,  # each model is judged once: entries would only churn
        )
    except InputError as exc:  # no model to judge (not cached, no config): it does not load
        reason = ("[structural] " if judge.structural else "") + exc.one_line()
        out = crashed(task, reason, verdict=verdicts.LOAD_FAILED, error=type(exc).__name__)
        return out.verdict, out.reason, out.row
    row = diag.to_run_row().model_dump(exclude={"id", "sweep_id"})
    return diag.verdict, diag.reason, row


def _fresh_dynamo() -> None:
    """Forget the previous unit's compiled frames. A worker judges many models; Dynamo keeps
    every audit's cache entries on shared code (transformers' forward wrappers), which holds
    the old models alive and lets a later call pick up another model's graph boundaries
    (seen with the post-LN handoff clone: a stock BERT ran the adapted copy's two graphs)."""
    from hfadapt import torch_internals as ti

    ti.dynamo_reset()


def judge_unit(task: Task) -> Outcome:
    """The real worker: diagnose the representative without recording and return its Run
    columns. A narrowed instance (``task.narrow``) goes first; a verdict it cannot decide
    alone (numerics, loading) is confirmed on the real config."""
    runner = resolve(task.runner) if task.runner else None
    _fresh_dynamo()
    try:
        return _judge_unit(task, runner)
    finally:
        _fresh_dynamo()  # nothing of this unit's models is held while the worker waits


def _judge_unit(task: Task, runner: Runner | None) -> Outcome:
    tried: NarrowedEvidence | None = None
    if task.narrow is not None:
        verdict, reason, row = _diagnose(task, task.narrow, runner)
        tried = {"changes": task.narrow_changes, "verdict": verdict}
        if verdict not in NARROW_DECIDES:
            tried["reason"] = reason
            _fresh_dynamo()
            verdict, reason, row = _diagnose(task, task.config, runner)
            tried["confirmed_at_full_width"] = True
    else:
        verdict, reason, row = _diagnose(task, task.config, runner)
    evidence = read_evidence(row.get("evidence"))
    if tried is not None:
        evidence["narrowed"] = tried
    row["evidence"] = evidence
    out = Outcome(task.key, task.model_id, verdict, reason, row)
    if verdict != verdicts.PASS and is_out_of_memory(reason):  # the judge caught it: a verdict
        out = out_of_memory(task, _limit.get(), reason, judged_as=verdict)
    return out


def run_task(
    fn: Callable[[Task], Outcome],
    task: Task,
    *,
    limit_mb: int | None = None,
    set_limit: bool = True,
    extra_mb: int = 0,
    collect: bool = False,
) -> Outcome:
    """Run one task in this process; an exception is a worker_crashed Outcome, not a raise.
    ``limit_mb``, the sweep's per-worker limit, caps the address space while the task runs
    (plus ``extra_mb`` the process maps already: a Ray worker's object store; unless the process
    is capped already: ``set_limit=False``), sizes the structural stand-ins it builds
    (hfadapt.loading.sizing.budget_for_limit), and says when the process is too full to take
    another unit. Running out of memory is the same Outcome whatever the executor. ``collect``:
    a full garbage collection once the unit is done, before its memory is measured (a process
    whose collector runs less often than Python's default, hfadapt.own_process)."""
    start = time.perf_counter()
    cap = limit_mb + extra_mb if limit_mb and set_limit else None
    token = _limit.set(limit_mb)
    try:
        with memory_limit(cap), sizing.budget(sizing.budget_for_limit(limit_mb)):
            out = fn(task)
    except MemoryError as exc:
        out = out_of_memory(task, limit_mb, f"MemoryError: {exc}")
    except Exception as exc:
        text = " ".join(str(exc).split())[:300]
        if is_out_of_memory(text):
            out = out_of_memory(task, limit_mb, f"{type(exc).__name__}: {text}")
        else:
            out = crashed(
                task,
                f"the worker raised {type(exc).__name__}: {text}",
                traceback="".join(traceback.format_exception(exc)[-6:])[-2000:],
            )
    finally:
        _limit.reset(token)
    if collect:
        own_process.collect()
    out.seconds = round(time.perf_counter() - start, 3)
    out.pid = os.getpid()
    out.peak_rss_mb = peak_rss_mb()
    if not out.restart and limit_mb and current_rss_mb() > 0.6 * limit_mb:
        out.restart = True  # freed memory the allocator keeps would crowd the next unit out
    return out


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the driver dies (kill -9 included)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def setup_process(threads: int | None, env: dict[str, str] | None) -> None:
    """Environment and thread count of a worker process. torch reads the thread variables
    when it is imported (by the worker function, not here: a stand-in worker never needs it)."""
    if env:
        settings.export(env)
    if threads:
        names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
        settings.export(dict.fromkeys(names, str(threads)))
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.set_num_threads(threads)


def serve(
    conn: Any, fn_ref: str, limit_mb: int | None, threads: int | None, env: dict[str, str] | None
) -> None:
    """A long-lived worker process: receive Tasks on ``conn``, send back Outcomes, until the
    driver sends None or goes away; then the process ends (without the interpreter's
    teardown). The memory limit holds for the whole process. Its garbage collector is tuned as
    the ``hfadapt`` command's is, with a full collection after every unit
    (hfadapt.own_process)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    own_process.tune()  # before the worker function's imports (torch, transformers)
    setup_process(threads, env)
    fn = resolve(fn_ref)
    if limit_mb:
        _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = int(limit_mb) * 2**20
        resource.setrlimit(
            resource.RLIMIT_AS, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard)
        )
    conn.send(("ready", os.getpid()))
    _serve_units(conn, fn, limit_mb)
    own_process.leave(0)


def _serve_units(conn: Any, fn: Callable[[Task], Outcome], limit_mb: int | None) -> None:
    """The loop of ``serve``. Once the first unit is done and its garbage collected, what is
    still alive (the modules it imported, their caches) is exempt from later collections."""
    settled = False
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        out = run_task(fn, task, limit_mb=limit_mb, set_limit=False, collect=True)
        if not settled:
            own_process.settle()
            settled = True
        try:
            conn.send(("done", out))
        except (BrokenPipeError, OSError):
            return
        if out.restart:
            return
