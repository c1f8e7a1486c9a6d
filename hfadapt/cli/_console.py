"""Where the CLI's output goes and how it looks: data on stdout (``console``), progress,
summaries and errors on stderr (``err_console``). Piped output is never cropped: without a
terminal (and without $COLUMNS) a console is as wide as its longest line. Every stored string
(runs.db holds text from the Hub, endpoints and sandboxes) reaches the terminal without its
control characters: a render hook strips them from everything either console prints, so an
ESC sequence in a model id cannot move the cursor, retitle the window or hide a line. The same
hook hides the password of any URL in the text (``scheme://user:***@host``,
``?password=***``), so no message, hint or table shows a database's or endpoint's credential."""

from __future__ import annotations

import re
import sys
from typing import IO

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook, RenderResult
from rich.segment import Segment

from hfadapt import settings
from hfadapt.untrusted import hide_url_credentials

__all__ = [
    "PIPE_WIDTH",
    "clean",
    "console",
    "err_console",
    "exit_code_planned",
    "interrupt_hint",
    "on_interrupt",
    "plan_exit",
]

# The width of a console that writes to a pipe or file: wide enough that no table wraps.
PIPE_WIDTH = 4096

# ESC sequences whole (CSI ... final byte, OSC ... BEL or ST, and two-byte ones), then any
# other C0 control but tab and newline, DEL, the C1 controls, and the bidirectional overrides
# and isolates that can make text read differently from what it is.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]"
)


def clean(text: str) -> str:
    """``text`` without control characters (tab and newline stay), and without the passwords
    of the URLs in it (hfadapt.untrusted.hide_url_credentials)."""
    return hide_url_credentials(_ESCAPES.sub("", text))


class _Clean:
    """A renderable printed through ``clean``: rich's own control segments (cursor moves of a
    live display) pass, text segments lose their control characters."""

    def __init__(self, renderable: ConsoleRenderable) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        for segment in console.render(self.renderable, options):
            if segment.control or not segment.text:
                yield segment
            else:
                yield Segment(clean(segment.text), segment.style)


class _CleanHook(RenderHook):
    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [r if isinstance(r, _Clean) else _Clean(r) for r in renderables]


def _make(stream: IO[str] | None, *, stderr: bool) -> Console:
    target = stream if stream is not None else (sys.stderr if stderr else sys.stdout)
    piped = not (hasattr(target, "isatty") and target.isatty())
    width = PIPE_WIDTH if piped and not settings.terminal_columns() else None
    made = Console(stderr=stderr, width=width)
    made.push_render_hook(_CleanHook())
    return made


console = _make(None, stderr=False)
err_console = _make(None, stderr=True)

# The exit code a command has decided on before it prints its result: a reader that closes
# the pipe early (``hfadapt diagnose M | head -1``) must not change it. And what to tell a user
# who presses Ctrl-C (how to resume).
_planned: list[int] = [0]
_interrupt: list[str] = [""]


def plan_exit(code: int) -> None:
    _planned[0] = code


def exit_code_planned() -> int:
    return _planned[0]


def on_interrupt(hint: str) -> None:
    """What ``main`` adds to "interrupted" if the user stops the command from now on."""
    _interrupt[0] = hint


def interrupt_hint() -> str:
    return _interrupt[0]
