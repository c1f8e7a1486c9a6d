"""Command-line entry point. Commands live in small modules beside this one; each
parses, calls one library function and renders. Errors become one line + exit code."""

from __future__ import annotations

import sys

# Command modules register themselves on import.
from hfadapt.cli import adapters as _adapters  # noqa: F401
from hfadapt.cli import agent as _agent  # noqa: F401
from hfadapt.cli import diagnose as _diagnose  # noqa: F401
from hfadapt.cli import hub as _hub  # noqa: F401
from hfadapt.cli import report as _report  # noqa: F401
from hfadapt.cli import show as _show  # noqa: F401
from hfadapt.cli import sweep as _sweep  # noqa: F401
from hfadapt.cli._app import app, err_console
from hfadapt.errors import HfadaptError


def main() -> None:
    try:
        # standalone_mode=False makes click return typer.Exit codes instead of exiting.
        rc = app(standalone_mode=False)
        if isinstance(rc, int) and rc:
            sys.exit(rc)
    except HfadaptError as exc:
        err_console.print(f"[red]error:[/red] {exc.one_line()}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
    except Exception as exc:  # click's usage errors and anything unexpected
        import click

        if isinstance(exc, click.exceptions.Exit):
            sys.exit(exc.exit_code)
        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(2)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(1)
        raise
