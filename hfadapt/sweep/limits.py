"""The resources a sweep worker gets (memory per worker) and how its end is described."""

from __future__ import annotations

import os
import signal


def total_memory_mb() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20)
    except (ValueError, OSError):
        return 8192


def default_memory_limit_mb(workers: int) -> int:
    """85% of this machine's memory shared by the workers, at least 2 GB each."""
    return max(2048, int(total_memory_mb() * 0.85 / max(1, workers)))


def max_local_workers(memory_limit_mb: int | None = None) -> tuple[int, str]:
    """How many local workers this machine holds, and why: one per CPU, and no more than fit in
    its memory at ``memory_limit_mb`` each (default and floor: 2 GB, what a worker needs)."""
    cpus = os.cpu_count() or 1
    ram = total_memory_mb()
    each = max(2048, memory_limit_mb or 0)
    cap = max(1, min(cpus, ram // each))
    return cap, f"{cpus} CPUs, {ram:,} MB of RAM at {each:,} MB per worker"


# What to do when a worker process died without a word (SIGKILL: the kernel's OOM killer).
CRASH_HINT = (
    "; if it ran out of memory, give each worker more (--memory-limit MB, or fewer --workers)"
)


def describe_exit(exitcode: int | None) -> str:
    """``"killed by SIGSEGV"``, ``"exited with code 3"``..."""
    if exitcode is None:
        return "vanished"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (the kernel's OOM killer, or kill -9)" if -exitcode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with code {exitcode}"
