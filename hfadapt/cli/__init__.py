"""Command-line entry point. Commands live in small modules beside this one; each
parses, checks its inputs before any work, calls one library function and renders. Every
error becomes one line on stderr and an exit code (``EXIT_CODES`` in hfadapt.cli._app: 1 the
model failed, 2 bad input, 3 something this machine lacks, 4 regressions found (cycle), 130
interrupted); an unexpected one too, with ``--verbose`` for its traceback. A reader that closes the pipe early ends the command
quietly with the exit code it had decided on."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import traceback
from typing import Any

import typer
from rich.markup import escape

# Command modules register themselves on import.
from hfadapt.cli import adapters as _adapters  # noqa: F401
from hfadapt.cli import agent as _agent  # noqa: F401
from hfadapt.cli import attempts as _attempts  # noqa: F401
from hfadapt.cli import cache as _cache  # noqa: F401
from hfadapt.cli import cycle as _cycle  # noqa: F401
from hfadapt.cli import diagnose as _diagnose  # noqa: F401
from hfadapt.cli import hub as _hub  # noqa: F401
from hfadapt.cli import report as _report  # noqa: F401
from hfadapt.cli import serve as _serve  # noqa: F401
from hfadapt.cli import show as _show  # noqa: F401
from hfadapt.cli import sweep as _sweep  # noqa: F401
from hfadapt.cli._app import app, close_engines, err_console
from hfadapt.cli._console import exit_code_planned, interrupt_hint, on_interrupt, plan_exit
from hfadapt.cli._noise import LibraryNoise
from hfadapt.errors import HfadaptError
from hfadapt.own_process import leave
from hfadapt.own_process import tune as tune_gc
from hfadapt.untrusted import hide_url_credentials

INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def _fail(message: str) -> None:
    # no URL password in an error line, whatever raised it (the console's hook hides them too)
    text = hide_url_credentials(" ".join(message.split()))
    err_console.print(f"[red]error:[/red] {escape(text)}", highlight=False, soft_wrap=True)


def _usage_line(exc: typer.TyperException) -> str:
    """A usage error of the command line parser as one line that names the command and where
    to read its help. typer's parser errors all derive from the public ``TyperException``; a
    usage error carries the parser's context (``ctx``), and a group called without a command
    answers with its whole help text, which becomes the list of its commands."""
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "hfadapt"
    if ctx is not None and exc.format_message() == ctx.get_help():
        lister = getattr(ctx.command, "list_commands", None)
        names = sorted(lister(ctx)) if lister is not None else []
        return f"{path} needs a command: {', '.join(names)} (see {path} --help)"
    return f"{exc.format_message()} (see {path} --help)"


def _hoist_verbose(args: list[str]) -> tuple[bool, list[str]]:
    """``--verbose`` anywhere before ``--`` is the global option (``hfadapt diagnose M
    --verbose`` works as ``hfadapt --verbose diagnose M``)."""
    end = args.index("--") if "--" in args else len(args)
    if "--verbose" not in args[:end]:
        return False, args
    rest = [a for i, a in enumerate(args) if not (i < end and a == "--verbose")]
    return True, ["--verbose", *rest]


def _broken_pipe(exc: BaseException | None) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.ECONNRESET)


def _silence_stdout() -> None:
    """After the reader went away: later writes (and the flush at exit) go nowhere."""
    # no real file descriptor (a test's capture) is fine: nothing else will be written
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _database_error(exc: Exception) -> HfadaptError:
    """An SQLAlchemy or sqlite3 error no library call translated, as one line (exit 2)."""
    from hfadapt.errors import DatabaseUnavailableError

    first = " ".join(str(getattr(exc, "orig", None) or exc).split())[:300]
    return DatabaseUnavailableError(f"the database cannot be used: {first}")


def _unexpected(exc: BaseException, verbose: bool) -> int:
    """One line for an error hfadapt did not raise on purpose (a bug, or something the system
    refused); ``--verbose`` adds the traceback."""
    if isinstance(exc, OSError) and exc.filename:
        what = f"{exc.strerror or type(exc).__name__}: {exc.filename}"
        _fail(what)
        return 2
    if isinstance(exc, RecursionError):
        _fail("a stored value is nested too deeply to read (RecursionError); nothing was changed")
        return 1
    if isinstance(exc, MemoryError):
        _fail("out of memory (MemoryError)")
        return 1
    if verbose:  # the traceback, with no URL password in it either
        text = "".join(traceback.format_exception(exc))
        sys.stderr.write(hide_url_credentials(text))
    text = " ".join(str(exc).split())[:300]
    hint = "" if verbose else "; hfadapt --verbose shows the traceback"
    _fail(f"unexpected {type(exc).__name__}: {text} (a bug in hfadapt: please report it{hint})")
    return 1


def _invoke(args: list[str], verbose: bool) -> int:
    """Run one command; the exit code, every error printed as one line."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        try:
            rc: Any = app(args=args, standalone_mode=False, prog_name="hfadapt")
            sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        except SystemExit as exc:
            # typer turns a broken pipe into sys.exit(1) (with the OSError as the context)
            if _broken_pipe(exc.__context__):
                raise BrokenPipeError(errno.EPIPE, "broken pipe") from None
            raise
        if rc == INTERRUPTED:  # typer turns KeyboardInterrupt into Exit(130)
            raise KeyboardInterrupt
        return rc if isinstance(rc, int) else 0
    except HfadaptError as exc:
        _fail(exc.one_line(flags=True))
        return exc.exit_code
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        hint = hide_url_credentials(interrupt_hint())
        err_console.print(
            "interrupted" + (f": {hint}" if hint else ""),
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
        return INTERRUPTED
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        _fail("aborted")
        return 1
    except typer.TyperException as exc:
        # a usage error (it knows its command), or e.g. a file option that cannot be opened
        _fail(_usage_line(exc) if getattr(exc, "ctx", None) is not None else exc.format_message())
        return 2
    except OverflowError as exc:  # a number too large for a C integer (typer converting it)
        _fail(f"a number is too large: {exc}")
        return 2
    except OSError as exc:
        if _broken_pipe(exc):
            _silence_stdout()
            return exit_code_planned()
        return _unexpected(exc, verbose)
    except SQLAlchemyError as exc:
        store = _database_error(exc)
        _fail(store.one_line(flags=True))
        return store.exit_code
    except Exception as exc:
        import sqlite3

        if isinstance(exc, sqlite3.Error):
            store = _database_error(exc)
            _fail(store.one_line(flags=True))
            return store.exit_code
        return _unexpected(exc, verbose)


def main() -> None:
    """The ``hfadapt`` console script."""
    verbose, args = _hoist_verbose(sys.argv[1:])
    tune_gc()
    plan_exit(0)
    on_interrupt("")
    noise = LibraryNoise(verbose=verbose)
    with noise:
        try:
            code = _invoke(args, verbose)
        finally:
            close_engines()
    summary = noise.summary()
    if summary:
        with contextlib.suppress(OSError):
            err_console.print(summary, highlight=False, soft_wrap=True, markup=False)
    sys.exit(code)


def entry() -> None:
    """The ``hfadapt`` console script and ``python -m hfadapt``: ``main``, then leaving without
    the interpreter's teardown (hfadapt.own_process)."""
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    leave(code if isinstance(code, int) else (0 if code is None else 1))
