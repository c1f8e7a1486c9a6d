"""Command-line entry point. Commands live in small modules beside this one; each
parses, calls one library function and renders. Every error becomes one line on stderr and an
exit code: 2 for bad input (unknown or malformed options included), 1 for everything else."""

from __future__ import annotations

import sys

import typer
from rich.markup import escape
from typer import _click  # typer vendors click; its exceptions are these, not click's

# Command modules register themselves on import.
from hfadapt.cli import adapters as _adapters  # noqa: F401
from hfadapt.cli import agent as _agent  # noqa: F401
from hfadapt.cli import attempts as _attempts  # noqa: F401
from hfadapt.cli import diagnose as _diagnose  # noqa: F401
from hfadapt.cli import hub as _hub  # noqa: F401
from hfadapt.cli import report as _report  # noqa: F401
from hfadapt.cli import show as _show  # noqa: F401
from hfadapt.cli import sweep as _sweep  # noqa: F401
from hfadapt.cli._app import app, err_console
from hfadapt.errors import HfadaptError


def _fail(message: str, code: int) -> None:
    err_console.print(
        f"[red]error:[/red] {escape(' '.join(message.split()))}", highlight=False, soft_wrap=True
    )
    sys.exit(code)


def _usage_line(exc: _click.exceptions.UsageError) -> str:
    """click's usage error as one line that names the command and where to read its help."""
    ctx = exc.ctx
    path = ctx.command_path if ctx is not None else "hfadapt"
    if isinstance(exc, _click.exceptions.NoArgsIsHelpError):
        assert ctx is not None
        lister = getattr(ctx.command, "list_commands", None)
        names = sorted(lister(ctx)) if lister is not None else []
        return f"{path} needs a command: {', '.join(names)} (see {path} --help)"
    return f"{exc.format_message()} (see {path} --help)"


def main() -> None:
    try:
        # standalone_mode=False makes click return typer.Exit codes instead of exiting.
        rc = app(standalone_mode=False, prog_name="hfadapt")
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except HfadaptError as exc:
        _fail(exc.one_line(flags=True), exc.exit_code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        _fail("aborted", 1)
    except _click.exceptions.UsageError as exc:
        _fail(_usage_line(exc), 2)
    except _click.exceptions.ClickException as exc:  # e.g. a file option that cannot be opened
        _fail(exc.format_message(), 2)
    except OverflowError as exc:  # a number too large for a C integer (typer converting it)
        _fail(f"a number is too large: {exc}", 2)
