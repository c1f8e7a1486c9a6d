"""Which simulated card a thread uses: how many cards this process simulates
(``HFADAPT_SPYRE_DEVICES``, a Spyre server holds up to 8) and the thread's current index.
Kept apart from ``device`` so that the op handlers can read it without importing the module
that registers them."""

from __future__ import annotations

import threading

from hfadapt import settings

DEVICE_TYPE = "spyre"
DEVICE_COUNT = settings.spyre_devices()

_local = threading.local()


def thread_index() -> int:
    """The index of the card this thread uses (0 until ``set_thread_index``)."""
    return int(getattr(_local, "index", 0))


def set_thread_index(index: int) -> None:
    _local.index = index
