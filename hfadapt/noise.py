"""What libraries print on their own while hfadapt works (torch and Dynamo log records such as
graph breaks, transformers' and huggingface_hub's warnings and "Loading weights" bars, Python
warnings including the simulated device's SpyreDowncastWarning): held instead of printed, and
counted. The command line holds them around every command and prints one summary line
(``--verbose`` lets them through); the library holds them around ``hfadapt.load`` and
``hfadapt.diagnose`` (``verbose=True`` or ``HFADAPT_VERBOSE=1`` lets them through) and counts
them in ``held_message_counts()``.

Progress bars are turned off through huggingface_hub's switch, which transformers follows
(``HF_HUB_DISABLE_PROGRESS_BARS`` for processes started meanwhile). Log records are caught
where every logger hands them to its handlers: torch installs its own handlers, with
propagation off, when it is first imported, so no handler set up beforehand would see them."""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, ParamSpec, TextIO, TypeVar

from hfadapt import settings

__all__ = ["LibraryNoise", "count_held", "held", "held_message_counts", "holding_now"]

_BARS_ENV = "HF_HUB_DISABLE_PROGRESS_BARS"


def _source(name: str) -> str:
    top = name.split(".", 1)[0] or "python"
    return "the simulated device" if name.startswith("hfadapt.spyre") else top


class LibraryNoise:
    """A context manager around one command or library call (see module doc); ``counts`` says
    what was held back, ``summary()`` in one line (None when nothing was)."""

    hint = "pass verbose=True (or set HFADAPT_VERBOSE=1) to see them"

    def __init__(self, *, verbose: bool = False) -> None:
        self.verbose = verbose
        self.counts: Counter[str] = Counter()
        self._saved: dict[str, Any] = {}
        self._stack = contextlib.ExitStack()

    # ---- what is held back --------------------------------------------------------------

    def _warning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        self.counts[f"{_source(category.__module__)} {category.__name__}"] += 1

    def _held(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or record.name.split(".", 1)[0] == "hfadapt":
            return False
        self.counts[f"{_source(record.name)} log"] += 1
        return True

    # ---- in and out ---------------------------------------------------------------------

    def __enter__(self) -> LibraryNoise:
        if self.verbose:
            return self
        self._saved["showwarning"] = warnings.showwarning
        warnings.showwarning = self._warning
        call = logging.Logger.callHandlers
        self._saved["callHandlers"] = call
        noise = self

        def call_handlers(logger: logging.Logger, record: logging.LogRecord) -> None:
            if not noise._held(record):
                call(logger, record)

        logging.Logger.callHandlers = call_handlers  # type: ignore[method-assign,assignment]
        # before the variable is exported: huggingface_hub reads it once, when first imported,
        # and imported under it its bars would stay off in this process after the hold
        self._bars(enable=False)
        self._stack.enter_context(settings.exported({_BARS_ENV: "1"}))
        with _held_lock:
            _active.append(self)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.verbose:
            return
        with _held_lock:
            _active.remove(self)
        warnings.showwarning = self._saved["showwarning"]
        logging.Logger.callHandlers = self._saved["callHandlers"]  # type: ignore[method-assign]
        self._stack.close()
        self._bars(enable=True)

    def _bars(self, *, enable: bool) -> None:
        """The hub's bars through its switch (imported here, before the variable is exported,
        so it reads the user's setting) and transformers' if imported; on the way out, only the
        ones this turned off come back, and transformers' when it was imported meanwhile (it
        copied the hub's switch, then off)."""
        import huggingface_hub.utils as hub  # a few ms; transformers follows its switch

        if not enable:
            self._saved["hub_bars"] = not hub.are_progress_bars_disabled()
            hub.disable_progress_bars()
        elif self._saved.get("hub_bars"):
            hub.enable_progress_bars()
        tlog = sys.modules.get("transformers.utils.logging")
        if tlog is not None:
            if not enable:
                self._saved["transformers_bars"] = tlog.is_progress_bar_enabled()
                tlog.disable_progress_bar()
            elif self._saved.get("transformers_bars"):
                tlog.enable_progress_bar()
            elif "transformers_bars" not in self._saved and not hub.are_progress_bars_disabled():
                # imported during the hold, it copied the hub's switch as it was then (off):
                # it follows the hub's, now restored
                tlog.enable_progress_bar()

    def summary(self) -> str | None:
        total = sum(self.counts.values())
        if not total:
            return None
        parts = ", ".join(f"{what} {n}" for what, n in self.counts.most_common())
        noun = "message" if total == 1 else "messages"
        return f"note: {total} library {noun} held back ({parts}); {self.hint}"


# What library calls held back in this process, by source and kind (see held_message_counts).
_held: Counter[str] = Counter()
_held_lock = threading.Lock()
# The holders inside whose ``with`` this process is, innermost last.
_active: list[LibraryNoise] = []
_P = ParamSpec("_P")
_R = TypeVar("_R")


def held_message_counts() -> dict[str, int]:
    """What ``hfadapt.load`` and ``hfadapt.diagnose`` held back in this process, by source and
    kind (e.g. ``{"transformers log": 2, "the simulated device SpyreDowncastWarning": 1}``);
    every device warning, shown or not, is also in ``hfadapt.device_warning_counts()``."""
    with _held_lock:
        return dict(_held)


def holding_now() -> bool:
    """Whether this process is holding library messages back now (a command without
    ``--verbose``, or inside ``hfadapt.load``): a child process it starts to do part of the work
    should hold its own the same way and send their counts back (:func:`count_held`)."""
    with _held_lock:
        return bool(_active)


def count_held(counts: Mapping[str, int]) -> None:
    """Adds what a child process held back, by source and kind, to the innermost holder of this
    process, so the command's one summary line (or ``held_message_counts()``) counts it too;
    nothing when none is active (the child was told not to hold)."""
    with _held_lock:
        if _active:
            _active[-1].counts.update({str(k): int(v) for k, v in counts.items()})


@contextlib.contextmanager
def holding(verbose: bool | None = None) -> Iterator[LibraryNoise]:
    """Hold library messages around a library call, unless ``verbose`` (None: the
    ``HFADAPT_VERBOSE`` setting); what was held is added to ``held_message_counts()``."""
    noise = LibraryNoise(verbose=settings.verbose() if verbose is None else verbose)
    try:
        with noise:
            yield noise
    finally:
        with _held_lock:
            _held.update(noise.counts)


def held(call: Callable[_P, _R]) -> Callable[_P, _R]:
    """``call`` with library messages held around it, as ``holding()`` holds them."""

    @functools.wraps(call)
    def quiet(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with holding():
            return call(*args, **kwargs)

    return quiet
