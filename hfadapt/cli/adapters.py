"""Commands about the adapter registry: list, show, verify."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table

from hfadapt.cli._app import JsonOption, ProfileOption, app, console, count_option

adapters_app = typer.Typer(
    help="The adapter registry: list, show and re-prove adapters.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(adapters_app, name="adapters")


@adapters_app.command("list")
def list_adapters(as_json: JsonOption = False) -> None:
    """Every adapter found (bundled, user folders, entry points), and files that failed to load."""
    from hfadapt.adapters.registry import default_registry

    reg = default_registry()
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "adapters": [a.summary() for a in reg.adapters],
                    "errors": [e.__dict__ for e in reg.errors],
                },
                indent=2,
            )
        )
        return
    table = Table(title=f"{len(reg.adapters)} adapters")
    for col in ("name", "kind", "replaces", "works around", "origin", "source"):
        table.add_column(col)
    for a in reg.adapters:
        cells = (a.name, a.kind, a.target.split(":")[-1], a.rule, a.provenance.origin, a.source)
        table.add_row(*(escape(str(c)) for c in cells))
    console.print(table)
    for e in reg.errors:
        console.print(f"[red]broken[/red] {escape(f'{e.path}: {e.error}')}", highlight=False)


@adapters_app.command("show")
def show(
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="Adapter name (see `hfadapt adapters list`).")
    ],
    as_json: JsonOption = False,
) -> None:
    """An adapter's metadata, what it fixes, and its source."""
    from hfadapt.adapters.registry import default_registry
    from hfadapt.spyre.profile import load_profile

    a = default_registry().get(name)
    source = inspect.getsource(a.fn)
    if as_json:
        typer.echo(json.dumps({**a.summary(), "code": source}, indent=2))
        return
    profile = load_profile()
    console.print(
        f"[bold]{escape(a.name)}[/bold] ({escape(a.kind)}) replaces [cyan]{escape(a.target)}[/cyan]",
        highlight=False,
    )
    source_of_rule = profile.rule_source(a.rule) or "see the profile"
    console.print(
        f"works around rule [yellow]{escape(a.rule)}[/yellow] — {escape(source_of_rule)}",
        highlight=False,
    )
    console.print(escape(f"provenance: {a.provenance.to_dict()}   file: {a.path}"), highlight=False)
    if a.description:
        console.print(a.description, markup=False, highlight=False)
    console.print(Syntax(source, "python", line_numbers=False))


@adapters_app.command("verify")
def verify(
    name: Annotated[
        str | None,
        typer.Argument(metavar="NAME", help="One adapter (default: all).", show_default=False),
    ] = None,
    seeds: Annotated[
        int, count_option("--seeds", "Random seeds for the float64 proof.", minimum=1)
    ] = 3,
    profile: ProfileOption = None,
    as_json: JsonOption = False,
    unsafe_no_isolation: Annotated[
        bool,
        typer.Option(
            "--unsafe-no-isolation",
            help="Re-prove agent-drafted adapters even where no OS sandbox can be had.",
        ),
    ] = False,
) -> None:
    """Re-prove adapters: float64 equivalence with the code they replace, then that their
    rule no longer fires on the simulated device."""
    from hfadapt.adapters.proofs import verify_adapter
    from hfadapt.adapters.registry import default_registry, is_agent_origin

    reg = default_registry()
    targets = [reg.get(name)] if name else reg.adapters
    drafted = [a for a in targets if a.path and is_agent_origin(Path(a.path))]
    if drafted:
        from hfadapt.isolation import require_isolation

        require_isolation(unsafe=unsafe_no_isolation)
    results = [verify_adapter(a, seeds=seeds, profile=profile) for a in targets]
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in results], indent=2))
    else:
        table = Table(title="adapter proofs")
        for col in ("adapter", "equivalence (max rel err)", "rule gone on device", "verdict"):
            table.add_column(col)
        for r in results:
            table.add_row(
                escape(r.name),
                escape(r.equivalence_text),
                escape(r.device_text),
                "[green]ok[/green]" if r.ok else f"[red]{escape(str(r.failure))}[/red]",
            )
        console.print(table)
    if not all(r.ok for r in results):
        raise typer.Exit(1)
