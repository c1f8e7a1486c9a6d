"""The typer app, the options several commands share (huggingface_hub style ``Annotated``
aliases), and the checks every command applies the same way: bounded numbers, databases opened
for reading (nothing created, written or left behind) or for writing. Command modules import
``app`` and add their commands; output conventions live in ``hfadapt.cli._console``."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from hfadapt import settings
from hfadapt.cli._console import console, err_console
from hfadapt.errors import UsageError
from hfadapt.options import DType
from hfadapt.version import __version__

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

__all__ = ["EXIT_CODES", "REGRESSIONS_FOUND", "app", "console", "err_console"]

EXIT_CODES = (
    "Exit codes: 0 ok; 1 the model failed (diagnose, draft, adapters verify) or hfadapt did; "
    "2 bad input (an option, a model id, a path, a database that cannot be used, a name that "
    "matches nothing); 3 something this machine lacks (Ray for --executor ray, bubblewrap, the "
    "Hub when it was asked for); 4 regressions found (cycle: a model that passed in the last "
    "cycle fails now); 130 interrupted (Ctrl-C)."
)
REGRESSIONS_FOUND = 4  # hfadapt cycle: models that passed in the last completed cycle fail now

ENVIRONMENT = (
    "Environment: "
    + ", ".join(v.name for v in settings.VARIABLES if v.owner == "hfadapt")
    + "; what each holds, and the other libraries' variables hfadapt reads: docs/settings.md."
)

app = typer.Typer(
    name="hfadapt",
    help="Which Hugging Face embedding models run on IBM Spyre (simulated), and adapters that "
    "make more run. Data goes to stdout, progress and notes to stderr.",
    epilog=f"{EXIT_CODES}\n\n{ENVIRONMENT}",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text is plain: "hfadapt[ray]" must not be read as markup
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        console.print(f"hfadapt {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            help="Let library warnings, log records and progress bars through as they come "
            "(otherwise held back and counted in one line at the end); also print the "
            "traceback of an unexpected error. Accepted after the command too.",
        ),
    ] = False,
) -> None:
    """Which Hugging Face embedding models run on IBM Spyre (simulated), and adapters that
    make more run. Data goes to stdout, progress and notes to stderr."""


# Larger counts are nonsense for every count option (the Hub lists ~10^6 models), and typer
# turns an over-long integer into an OverflowError without this bound.
MAX_COUNT = 10_000_000

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        metavar="URL|PATH",
        help="Database URL or path (default: $HFADAPT_DB, else ./runs.db).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
DTypeOption = Annotated[
    DType | None,
    typer.Option(
        "--dtype",
        help="Device dtype (default: the profile's dtype for the model's family: bf16 for "
        "Gemma and T5, fp16 otherwise).",
        show_default=False,
    ),
]
WithoutAdapterOption = Annotated[
    list[str] | None,
    typer.Option(
        "--without-adapter",
        metavar="NAME",
        help="Leave this registry adapter out (repeatable): what does it buy?",
        show_default=False,
    ),
]
ProfileOption = Annotated[
    str | None,
    typer.Option(
        "--profile",
        metavar="NAME|FILE",
        help="Device profile name or file (default: the bundled spyre-2026.07).",
        show_default=False,
    ),
]


def left_out(no_adapters: bool, without_adapter: list[str] | None) -> tuple[str, ...]:
    """The adapters ``--without-adapter`` names (UsageError beside ``--no-adapters``)."""
    if no_adapters and without_adapter:
        raise UsageError("--without-adapter applies only with adapters (not with --no-adapters)")
    return tuple(without_adapter or ())


def finite_seconds(flag: str) -> Any:
    """A typer callback: the value is a finite number of seconds above zero, or a UsageError
    naming ``flag`` (typer itself lets ``nan``, ``inf`` and ``1e309`` through)."""

    def check(value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UsageError(f"{flag} must be a finite number of seconds above 0 (got {value})")
        return value

    return check


def count_option(flag: str, help: str, *, minimum: int = 1, **kwargs: Any) -> Any:
    """A typer option for a count: an integer in [minimum, MAX_COUNT], checked by typer."""
    return typer.Option(flag, min=minimum, max=MAX_COUNT, metavar="N", help=help, **kwargs)


# Engines a command opened: closed when it ends, so SQLite removes its -wal and -shm files
# then, not whenever the garbage collector gets to them.
_opened: list[Any] = []


def existing_engine(db: str | None, *, hint: str) -> Engine:
    """The engine of a read-only command (hfadapt.db.readonly): a database that must already
    exist, opened so that nothing is created or written. ``hint`` says which command makes it."""
    from hfadapt.db.readonly import open_readonly

    engine = open_readonly(db, hint=hint)
    _opened.append(engine)
    return engine


def writing_engine(db: str | None) -> Engine:
    """The engine of a command that records something: created when missing (in an existing
    folder), refused in one line when damaged (hfadapt.db.engine.get_engine)."""
    from hfadapt.db.engine import get_engine

    engine = get_engine(db)
    _opened.append(engine)
    return engine


def close_engines() -> None:
    """Close every engine the command opened (hfadapt.cli.main calls it when a command ends)."""
    while _opened:
        _opened.pop().dispose()


@contextmanager
def new_database_removed_on_failure(db: str | None) -> Iterator[Engine]:
    """The writing engine of a command whose failure leaves nothing worth keeping (a crawl
    that could not reach the Hub): when the database file did not exist before and the command
    fails, the file it created (and SQLite's files beside it) is removed again."""
    from hfadapt.db.engine import resolve_url, sqlite_path

    try:
        path = sqlite_path(resolve_url(db))
    except Exception:  # not a URL at all: get_engine says so in one line
        path = None
    created = path is not None and not path.exists()
    engine = writing_engine(db)
    try:
        yield engine
    except BaseException:
        if created and path is not None:
            engine.dispose()
            for extra in ("", "-wal", "-shm", "-journal"):
                Path(f"{path}{extra}").unlink(missing_ok=True)
        raise
