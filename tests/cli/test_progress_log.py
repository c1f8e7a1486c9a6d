"""A sweep without a terminal prints its progress as plain lines at least every 30 s, also
while one long unit keeps the state unchanged (driven here by a hand-set clock)."""

from __future__ import annotations

import pytest

from hfadapt.cli.progress_log import INTERVAL, ProgressLog


def test_a_line_at_least_every_interval_even_when_nothing_changes() -> None:
    now = [0.0]
    lines: list[str] = []
    log = ProgressLog(lines.append, clock=lambda: now[0])
    assert INTERVAL == 30.0
    log.update("1/10 models")
    assert lines == ["1/10 models"], lines  # the first state at once
    for t, state in ((10.0, "2/10 models"), (31.0, "3/10 models"), (45.0, "3/10 models")):
        now[0] = t
        log.update(state)
    assert lines == ["1/10 models", "3/10 models"], lines  # at 0 and 31 s
    for t in (50.0, 61.0, 70.0, 92.0):  # the heartbeat: no change since 31 s
        now[0] = t
        log.tick()
    assert lines == [
        "1/10 models",
        "3/10 models",
        "3/10 models (unchanged for 30 s: a unit is still running)",
        "3/10 models (unchanged for 61 s: a unit is still running)",
    ], lines
    assert log.lines_written == 4, log.lines_written


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval must be positive, not 0"):
        ProgressLog(print, interval=0)
