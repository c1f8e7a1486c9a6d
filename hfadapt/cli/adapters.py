"""Commands about the adapter registry: list, show, verify, export."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table

from hfadapt.cli._app import JsonOption, ProfileOption, app, console, count_option

adapters_app = typer.Typer(
    help="The adapter registry: list, show, re-prove and export adapters.",
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
    for col in ("name", "form", "replaces", "works around", "origin", "source"):
        table.add_column(col)
    for a in reg.adapters:
        cells = (a.name, a.form, a.target.split(":")[-1], a.rule, a.provenance.origin, a.source)
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
    source = _source_of(a)
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


def _source_of(a: Any) -> str:
    """The code people read for an adapter: its Python, or for a graph adapter the drafted
    source kept beside the graph (text; it is not what runs)."""
    if a.form == "graph":
        from hfadapt.adapters.graph_adapter import draft_source

        return draft_source(Path(a.path))
    return inspect.getsource(a.fn)


@adapters_app.command("export")
def export(
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="A graph adapter (an accepted draft).")
    ],
    python: Annotated[
        Path,
        typer.Option(
            "--python", metavar="DIR", help="Write the drafted Python into this folder for review."
        ),
    ],
) -> None:
    """Write an accepted draft's Python source for people to review. hfadapt never runs it:
    promoting it to an adapter file is a person's decision (see the file's header)."""
    from hfadapt.adapters.graph_adapter import draft_source
    from hfadapt.adapters.registry import AGENT_MARKER, default_registry
    from hfadapt.errors import UsageError

    if not python.is_dir():
        raise UsageError(f"--python {python}: not a folder")
    a = default_registry().get(name)
    if a.form != "graph":
        raise UsageError(
            f"{name} is already Python code people wrote ({a.path}); nothing to export"
        )
    out = python / f"{a.name.replace('-', '_')}.py"
    if out.exists():
        raise UsageError(f"{out} exists; export into another folder or remove it first")
    header = "\n".join(
        [
            AGENT_MARKER,
            f"# Drafted by an agent; accepted by hfadapt as the graph adapter {a.name} ({a.path}).",
            "# This Python has never run outside hfadapt's sandbox, and hfadapt will not import it",
            "# while the line above is here. Review it. To promote it to an adapter file: delete the",
            "# first line, move this file into a folder on HFADAPT_ADAPTERS_PATH, and remove the",
            "# graph adapter's folder (two adapters of one name: the first one found is kept).",
            "",
        ]
    )
    body = draft_source(Path(a.path))
    try:
        out.write_text(header + "\n" + body, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from exc
    console.print(escape(f"wrote {out} (review it before promoting it)"), highlight=False)


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
) -> None:
    """Re-prove adapters: float64 equivalence with the code they replace, then that their
    rule no longer fires on the simulated device (graph adapters: every acceptance proof
    again, on the stored graph)."""
    from hfadapt.adapters.proofs import verify_adapter
    from hfadapt.adapters.registry import default_registry
    from hfadapt.agent.reprove import verify_graph_adapter

    reg = default_registry()
    targets = [reg.get(name)] if name else reg.adapters
    results: list[Any] = [
        verify_graph_adapter(a)
        if a.form == "graph"
        else verify_adapter(a, seeds=seeds, profile=profile)
        for a in targets
    ]
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
