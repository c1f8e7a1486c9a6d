"""Time as tests measure it: the sleeps a test asked for."""

from __future__ import annotations

import pytest


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The seconds each ``time.sleep`` of the test's own thread asked for (retry backoff is
    measured by what was asked, not by a wall clock); sleeps still happen."""
    import threading
    import time

    asked: list[float] = []
    real = time.sleep
    main = threading.current_thread()

    def sleep(seconds: float) -> None:
        if threading.current_thread() is main:
            asked.append(float(seconds))
        real(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return asked
