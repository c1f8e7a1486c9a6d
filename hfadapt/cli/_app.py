"""The typer app, the options several commands share (huggingface_hub style ``Annotated``
aliases), and the checks every command applies the same way: bounded numbers, a database that
must already exist for read-only commands, the sweep worker cap. Command modules import ``app``
and add their commands."""

from __future__ import annotations

import math
from typing import Annotated, Any

import typer
from rich.console import Console

from hfadapt.errors import UsageError
from hfadapt.options import DType

app = typer.Typer(
    name="hfadapt",
    help="Which Hugging Face embedding models run on IBM Spyre (simulated), and adapters that make more run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text is plain: "hfadapt[ray]" must not be read as markup
)

console = Console()
err_console = Console(stderr=True)

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
ProfileOption = Annotated[
    str | None,
    typer.Option(
        "--profile",
        metavar="NAME|FILE",
        help="Device profile name or file (default: the bundled spyre-2026.07).",
        show_default=False,
    ),
]


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


def existing_engine(db: str | None, *, hint: str) -> Any:
    """The engine of a database that already exists: a read-only command must not create one at
    a mistyped ``--db`` path. ``hint`` says which command creates it."""
    from hfadapt.db.engine import describe, get_engine, require_schema, resolve_url, sqlite_path

    url = resolve_url(db)
    try:
        path = sqlite_path(url)
    except Exception:  # not a URL at all: get_engine says so in one line
        path = None
    if path is not None and not path.exists():
        raise UsageError(
            f"no database at {describe(url)}: check --db / $HFADAPT_DB, or run {hint} first"
        )
    if path is None:  # a server's database (PostgreSQL): it must hold hfadapt's tables already
        require_schema(url, hint=hint)
    return get_engine(db)
