"""Progress as plain lines for a sweep run without a terminal (CI, ``nohup``, a log file),
where a live progress bar prints nothing until the end: the newest state as one line at least
every ``interval`` seconds, also while one long unit of work keeps the state from changing
(a heartbeat thread repeats it, with how long it has been unchanged)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

__all__ = ["INTERVAL", "ProgressLog"]

INTERVAL = 30.0  # seconds between lines at most


class ProgressLog:
    """Call ``update(line)`` on every change; ``tick()`` (the heartbeat's call) writes the
    newest line when ``interval`` has passed since the last one written."""

    def __init__(
        self,
        write: Callable[[str], None],
        *,
        interval: float = INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be positive, not {interval}")
        self.write = write
        self.interval = interval
        self.clock = clock
        self.line: str | None = None
        self.changed_at = clock()
        self.written_at = float("-inf")  # the first state is written at once
        self.lines_written = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def update(self, line: str) -> None:
        """A new state: written at once when the last line is ``interval`` old."""
        with self._lock:
            if line != self.line:
                self.line, self.changed_at = line, self.clock()
        self.tick()

    def tick(self) -> None:
        with self._lock:
            now = self.clock()
            if self.line is None or now - self.written_at < self.interval:
                return
            quiet = now - self.changed_at
            suffix = (
                f" (unchanged for {quiet:.0f} s: a unit is still running)"
                if quiet >= self.interval
                else ""
            )
            self.written_at = now
            self.lines_written += 1
            text = self.line + suffix
        self.write(text)

    def __enter__(self) -> ProgressLog:
        self._thread = threading.Thread(target=self._beat, name="hfadapt-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval)

    def _beat(self) -> None:
        while not self._stop.wait(min(self.interval / 4, 5.0)):
            self.tick()
