"""How hfadapt's own processes end (hfadapt.own_process): ``leave`` (the command, a sweep
worker) runs the exit handlers and waits for a thread that is not a daemon, as the interpreter
would, but not for a daemon thread, and then skips the interpreter's teardown unless it waited;
``end`` (a sandboxed worker, its results written) runs no
exit handler and waits for no thread. Each is run in a process of its own: ending it is the
point."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

SCRIPT = """
import atexit, sys, threading, time
from hfadapt import own_process
atexit.register(lambda: print("handler", flush=True))
class Torn:  # says when the interpreter's teardown frees the module's objects
    def __del__(self): print("teardown", flush=True)
torn = Torn()
threading.Thread(target=lambda: (time.sleep({sleep}), print("thread done", flush=True)),
                 daemon={daemon}).start()
print("output", end="")  # left in the buffer: the ending flushes it
own_process.{how}(3)
"""


def _run(how: str, *, daemon: bool, sleep: float) -> tuple[int, str, float]:
    code = SCRIPT.format(how=how, daemon=daemon, sleep=sleep)
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - start


@pytest.mark.parametrize(
    ("how", "daemon", "lines", "waits"),
    [
        ("leave", True, ["output", "handler"], False),
        ("leave", False, ["output", "thread done", "handler", "teardown"], True),
        ("end", True, ["output"], False),
        ("end", False, ["output"], False),
    ],
)
def test_leave_waits_as_the_interpreter_would_and_end_waits_for_nothing(
    how: str, daemon: bool, lines: list[str], waits: bool
) -> None:
    code, out, seconds = _run(how, daemon=daemon, sleep=4.0)
    print(f"{how}, daemon thread {daemon}: exit {code} in {seconds:.1f} s, printed {out!r}")
    assert code == 3, out
    assert [ln for ln in out.replace("output", "output\n").splitlines() if ln] == lines, out
    assert (seconds >= 4.0) == waits, f"{seconds:.1f} s (the thread sleeps 4 s)"
