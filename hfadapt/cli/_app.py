"""The typer app and the options several commands share (huggingface_hub style
`Annotated` aliases). Command modules import ``app`` and add their commands."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(
    name="hfadapt",
    help="Which Hugging Face embedding models run on IBM Spyre (simulated), and adapters that make more run.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

console = Console()
err_console = Console(stderr=True)

DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Database URL or path (default: $HFADAPT_DB, else ./runs.db).",
        show_default=False,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
ProfileOption = Annotated[
    str | None,
    typer.Option(
        "--profile",
        help="Device profile name or file (default: the newest bundled profile).",
        show_default=False,
    ),
]
