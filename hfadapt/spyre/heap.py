"""The simulated card's memory: freed host memory kept for the next device tensor.

A card allocates from its own memory through a caching allocator: a tensor freed by one op is
the next op's output, with no trip to the operating system. The simulator holds device data in
host tensors, which glibc's malloc allocates: past malloc's mmap threshold (at most 32 MiB,
moved as the process frees memory) every allocation maps fresh pages, each zeroed by the
kernel on first touch, and the heap's free top goes back to the system whenever it passes the
trim threshold. The device then paid page faults the card never pays: a copy of attention
scores of 32 x 12 x 256 x 256 (100 MB) took 58.8 ms into fresh memory and 5.9 ms into reused
memory, and the chunked matmul's partial products were faulted in again on every linear.

On the device's first op, :func:`keep_freed_memory` raises both thresholds to 1 GiB (glibc's
``mallopt``), so freed memory stays in the process and is reused, as a card's pool is: the
process keeps its peak memory, as a process using CUDA keeps its cached blocks.
``HFADAPT_DEVICE_HEAP=0`` leaves malloc alone; elsewhere than glibc nothing changes."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

from hfadapt import settings

log = logging.getLogger(__name__)

# glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 30  # allocations above 1 GiB still map their own pages

_lock = threading.Lock()
kept = False  # True once keep_freed_memory ran (whatever it found): the device's ops check it
raised = False  # whether the thresholds were raised


def keep_freed_memory() -> bool:
    """Raise malloc's mmap and trim thresholds, once per process (see the module's text).
    True when they are raised."""
    global kept, raised
    with _lock:
        if not kept:
            raised = _raise_thresholds()
            kept = True
    return raised


def _raise_thresholds() -> bool:
    if not settings.device_heap():
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc: its allocator is left as it is
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, THRESHOLD))
    log.debug("malloc thresholds raised to %d bytes: %s", THRESHOLD, ok)
    return ok
