"""Commands about the adapter registry: list, show (an adapter as a card: what it replaces,
the rule, the change as a diff against the stock code, provenance as fields), verify (every
proof, why each one is ok, and a summary), export (an accepted draft's Python, for review)."""

from __future__ import annotations

import difflib
import inspect
import json
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from hfadapt.cli._app import (
    DbOption,
    JsonOption,
    ProfileOption,
    app,
    console,
    count_option,
    err_console,
)
from hfadapt.cli._console import plan_exit
from hfadapt.errors import NotFoundError, UsageError, did_you_mean
from hfadapt.report.charts import plural

if TYPE_CHECKING:
    from hfadapt.adapters.api import Adapter
    from hfadapt.adapters.registry import Registry
    from hfadapt.spyre.rules.profile import Profile

adapters_app = typer.Typer(
    help="The adapter registry: list, show, re-prove, export and remove adapters.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(adapters_app, name="adapters")


def _first_sentence(text: str) -> str:
    flat = " ".join(text.replace("``", "`").split())
    end = flat.find(". ")
    return flat if end < 0 else flat[: end + 1]


def markdown_table(adapters: list[Adapter]) -> str:
    """The adapters as the README's Markdown table: one row per (rule, what it does), every
    adapter named, in registry order (``hfadapt adapters list --markdown``)."""
    rows: dict[tuple[str, str], list[str]] = {}
    for a in adapters:
        rows.setdefault((a.rule, _first_sentence(a.description)), []).append(a.name)
    lines = ["| adapter | rule it works around | what it does |", "|---|---|---|"]
    for (rule, what), names in rows.items():
        cell = ", ".join(f"`{n}`" for n in names)
        lines.append(f"| {cell} | `{rule}` | {what.replace('|', chr(92) + '|')} |")
    return "\n".join(lines)


SessionOption = Annotated[
    list[int] | None,
    typer.Option(
        "--session",
        metavar="ID",
        help="A draft session (its id in `hfadapt draft`'s output or `hfadapt attempts`); "
        "repeatable.",
        show_default=False,
    ),
]


def _sessions(ids: list[int], db: str | None) -> list[Any]:
    """The recorded draft sessions ``ids``, in that order; NotFoundError for a missing one."""
    from hfadapt.cli._app import existing_engine
    from hfadapt.db.engine import session
    from hfadapt.db.tables import DraftSession

    engine = existing_engine(db, hint="`hfadapt draft`")
    with session(engine, write=False) as s:
        rows = [s.get(DraftSession, i) for i in ids]
    missing = [str(i) for i, r in zip(ids, rows, strict=True) if r is None]
    if missing:
        raise NotFoundError(f"no draft session {', '.join(missing)}; see hfadapt attempts")
    return rows


def _session_rows(ids: list[int], db: str | None) -> list[dict[str, Any]]:
    """What each session added: its adapter (name, folder, whether the folder is still there)."""
    out = []
    for row in _sessions(ids, db):
        path = Path(row.adapter_path) if row.adapter_path else None
        out.append(
            {
                "session": row.id,
                "fingerprint": row.fingerprint,
                "outcome": row.outcome,
                "adapter": row.adapter_name,
                "path": str(path) if path else None,
                "present": bool(path and (path / "adapter.json").is_file()),
            }
        )
    return out


@adapters_app.command("list")
def list_adapters(
    as_json: JsonOption = False,
    markdown: Annotated[
        bool,
        typer.Option(
            "--markdown", help="Print the table as Markdown (the README's adapter table)."
        ),
    ] = False,
    sessions: SessionOption = None,
    db: DbOption = None,
) -> None:
    """Every adapter found (bundled, user folders, entry points), and files that failed to load;
    with --session, what those draft sessions added."""
    from hfadapt.adapters.registry import default_registry

    if sessions:
        added = _session_rows(sessions, db)
        if as_json:
            typer.echo(json.dumps(added, indent=2))
            return
        table = Table("session", "fingerprint", "outcome", "adapter", "folder")
        for r in added:
            where = (r["path"] or "") + ("" if r["present"] or not r["path"] else " (removed)")
            row = (r["session"], r["fingerprint"], r["outcome"], r["adapter"] or "-", where)
            table.add_row(*(escape(str(c)) for c in row))
        console.print(table)
        return
    reg = default_registry()
    if markdown:
        typer.echo(markdown_table(reg.adapters))
        return
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
    table = Table(title=plural(len(reg.adapters), "adapter"))
    for col in ("name", "form", "replaces", "works around", "origin", "source"):
        table.add_column(col)
    for a in reg.adapters:
        cells = (a.name, a.form, a.target.split(":")[-1], a.rule, a.provenance.origin, a.source)
        table.add_row(*(escape(str(c)) for c in cells))
    console.print(table)
    for e in reg.errors:  # part of the listing: files that failed to load
        console.print(
            f"[red]broken[/red] {escape(f'{e.path}: {e.error}')}", highlight=False, soft_wrap=True
        )


def _remove_folder(path: Path) -> None:
    """Delete an accepted draft's folder from the named home and forget its proof."""
    import shutil

    from hfadapt.adapters.registry import user_adapters_dir
    from hfadapt.graphs.proven import forget_proven

    home = user_adapters_dir().resolve()
    if path.resolve().parent != home:
        raise UsageError(
            f"{path} is not in the adapters folder of $HFADAPT_HOME ({home}): hfadapt removes "
            "only the drafts it accepted there"
        )
    forget_proven(path)
    shutil.rmtree(path)


@adapters_app.command("remove")
def remove_adapters(
    names: Annotated[
        list[str] | None,
        typer.Argument(metavar="[NAME]...", help="Accepted drafts to remove, by name."),
    ] = None,
    sessions: SessionOption = None,
    db: DbOption = None,
) -> None:
    """Remove accepted drafts from $HFADAPT_HOME/adapters (by name, or what draft sessions
    added), with their proof records: they no longer apply to any model."""
    from hfadapt.adapters.registry import default_registry, user_adapters_dir

    if not names and not sessions:
        raise UsageError("give NAME(s) or --session ID to remove")
    home = user_adapters_dir()
    paths: list[Path] = []
    for name in names or []:
        path = home / name
        if not (path / "adapter.json").is_file():
            drafts = (d.name for d in home.iterdir()) if home.is_dir() else ()
            raise NotFoundError(
                f"no accepted draft named {name!r} in {home}{did_you_mean(name, drafts)}; "
                "see hfadapt adapters list"
            )
        paths.append(path)
    for r in _session_rows(sessions or [], db):
        if r["path"] and r["present"]:
            paths.append(Path(r["path"]))
        else:
            reason = "was removed already" if r["adapter"] else f"added nothing ({r['outcome']})"
            err_console.print(escape(f"session {r['session']} {reason}"), highlight=False)
    for path in dict.fromkeys(paths):
        _remove_folder(path)
        console.print(escape(f"removed {path.name} from {path.parent}"), highlight=False)
    default_registry(reload=True)


def _named(reg: Registry, name: str) -> Adapter:
    """The adapter called ``name``; NotFoundError (exit 2, as every "not found") otherwise."""
    for a in reg.adapters:
        if a.name == name:
            return a
    hint = did_you_mean(name, (a.name for a in reg.adapters))
    raise NotFoundError(f"no adapter named {name!r}{hint}; see hfadapt adapters list")


def _source(obj: Any) -> str | None:
    """A function's source from its ``def`` on (decorators are the registration, not code)."""
    try:
        text = textwrap.dedent(inspect.getsource(obj))
    except (OSError, TypeError):
        return None
    lines = text.splitlines(keepends=True)
    start = next(
        (i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "async def "))), 0
    )
    return "".join(lines[start:])


def _stock(a: Adapter) -> tuple[str, str | None]:
    """(what the adapter replaces, in words; the stock code's source, when there is one)."""
    if a.kind == "method":
        cls = a.target_class()
        stock = getattr(cls, a.method_name, None) if cls is not None else None
        return f"{a.target} (the method, on each matching module)", _source(stock)
    if a.kind == "attention":
        return f"the attention function of {a.target} models (stock: PyTorch SDPA)", _source(
            a.original()
        )
    return f"nothing: runs before the forward of each {a.target}", None


def change_diff(a: Adapter) -> str:
    """The adapter's code as a unified diff against the stock code it replaces (its code
    alone, as added lines, when it replaces no single function)."""
    ours = _source_of(a)
    _, stock = _stock(a)
    where = Path(a.path).name if a.path else a.name
    return "".join(
        difflib.unified_diff(
            (stock or "").splitlines(keepends=True),
            ours.splitlines(keepends=True),
            fromfile=f"stock: {a.target}",
            tofile=f"adapter: {where}",
        )
    )


def _rule_source(profile: Profile, rule: str) -> str:
    """The public source the profile cites for ``rule`` (a device defect's too)."""
    found = profile.rule_source(rule)
    if not found:
        for defect in profile.defects:
            if defect.id == rule:
                found = profile.sources.get(defect.source, defect.source)
    return found or "no source recorded in the profile"


_DIFF_STYLES = {"+": "green", "-": "red", "@": "cyan"}


def _field(label: str, text: str) -> None:
    console.print(f"  [bold]{label:<11}[/bold]{escape(text)}", highlight=False, soft_wrap=True)


@adapters_app.command("show")
def show(
    name: Annotated[
        str, typer.Argument(metavar="NAME", help="Adapter name (see `hfadapt adapters list`).")
    ],
    as_json: JsonOption = False,
) -> None:
    """One adapter as a card: what it replaces, the rule it works around, the change (a diff
    against the stock code), and where it came from."""
    from hfadapt.adapters.registry import default_registry
    from hfadapt.spyre.rules.profile import load_profile

    a = _named(default_registry(), name)
    diff = change_diff(a)
    if as_json:
        typer.echo(json.dumps({**a.summary(), "code": _source_of(a), "diff": diff}, indent=2))
        return
    replaces, _ = _stock(a)
    rule_source = _rule_source(load_profile(), a.rule)
    console.print(
        f"[bold]{escape(a.name)}[/bold]  {escape(a.kind)} adapter, {escape(a.source or 'inline')}",
        highlight=False,
        soft_wrap=True,
    )
    _field("replaces", replaces)
    _field("rule", f"{a.rule} ({rule_source})")
    if a.description:
        _field("what", " ".join(a.description.split()))
    prov = a.provenance
    _field("origin", prov.origin + (f", by {prov.author}" if prov.author else ""))
    if prov.date:
        _field("date", prov.date)
    if prov.endpoint_model:
        _field("drafted by", f"{prov.endpoint_model} (attempt {prov.attempt_id})")
    for key, value in sorted(prov.evidence.items()):
        _field("evidence", f"{key}: {value}")
    _field("file", a.path or "(defined inline)")
    _field("priority", str(a.priority))
    console.print("  [bold]change[/bold]", highlight=False)
    for line in (diff or "(no source)\n").splitlines():
        style = _DIFF_STYLES.get(line[:1], "") if not line.startswith(("---", "+++")) else "bold"
        console.print(Text(f"    {line}", style=style), highlight=False, soft_wrap=True)


def _source_of(a: Adapter) -> str:
    """The code people read for an adapter: its Python, or for a graph adapter the drafted
    source kept beside the graph (text; it is not what runs)."""
    if a.form == "graph":
        from hfadapt.adapters.graph_adapter import draft_source

        return draft_source(Path(a.path))
    return _source(a.fn) or ""


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
    a = _named(default_registry(), name)
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
    err_console.print(escape(f"wrote {out} (review it before promoting it)"), highlight=False)


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
    again, on the stored graph, against the baseline it was accepted on). A graph adapter
    folder this machine has not proven (copied, shared, edited) is proven when named, and
    once it passes the registry applies it."""
    from hfadapt.adapters.proofs import verify_adapter
    from hfadapt.adapters.registry import default_registry
    from hfadapt.agent.reprove import verify_graph_adapter

    reg = default_registry()
    if name:
        unproven = None if any(a.name == name for a in reg.adapters) else _unproven_graph(name)
        targets = [unproven] if unproven is not None else [_named(reg, name)]
    else:
        targets = reg.adapters
    results: list[Any] = [
        verify_graph_adapter(a)
        if a.form == "graph"
        else verify_adapter(a, seeds=seeds, profile=profile)
        for a in targets
    ]
    failed = [r for r in results if not r.ok]
    if any(a.form == "graph" for a in targets) and len(failed) < len(results):
        default_registry(reload=True)  # what was proven now applies
    plan_exit(1 if failed else 0)
    if as_json:
        typer.echo(
            json.dumps(
                [{**r.to_dict(), "why": why_ok(r) if r.ok else r.failure} for r in results],
                indent=2,
            )
        )
    else:
        table = Table(title="adapter proofs")
        for col in ("adapter", "equivalence (max rel err)", "on the device", "verdict"):
            table.add_column(col)
        for r in results:
            verdict = (
                f"[green]ok[/green]: {escape(why_ok(r))}"
                if r.ok
                else f"[red]failed[/red]: {escape(str(r.failure))}"
            )
            table.add_row(
                escape(r.name), escape(r.equivalence_text), escape(r.device_text), verdict
            )
        console.print(table)
        ok = len(results) - len(failed)
        names = f": {', '.join(r.name for r in failed)}" if failed else ""
        err_console.print(
            f"{plural(len(results), 'adapter')} re-proven: {ok:,} ok, {len(failed):,} failed{names}",
            highlight=False,
            soft_wrap=True,
            markup=False,
        )
    if failed:
        raise typer.Exit(1)


def _unproven_graph(name: str) -> Adapter | None:
    """The graph adapter folder named ``name`` in the user folders that the registry refused
    as not proven on this machine (loaded without that check, graph not parsed), or None."""
    from hfadapt.adapters.graph_adapter import is_graph_folder, load_graph_adapter, read_manifest
    from hfadapt.adapters.registry import user_dirs
    from hfadapt.errors import HfadaptError

    for folder in user_dirs():
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.name.startswith(("_", ".")) or not is_graph_folder(path):
                continue
            try:
                if read_manifest(path).get("name") == name:
                    return load_graph_adapter(path, "user", proven=False, lazy=True)
            except HfadaptError:
                continue
    return None


def why_ok(r: Any) -> str:
    """Why a proof passed, in words: what was shown on the device for the adapter's rule."""
    if getattr(r, "steps", None) is not None:  # a graph adapter: its acceptance proofs again
        passed = [s.step for s in r.steps if s.status == "pass"]
        return "the stored graph passed its acceptance proofs again: " + (
            ", ".join(passed) or "none ran"
        )
    equivalent = (
        f"equivalent in float64 (max rel err {r.equivalence.max_rel_err:.1e})"
        if r.equivalence is not None
        else "no float64 check for this kind"
    )
    d = r.device
    if d is None:
        return f"{equivalent}; no device check for this kind"
    fired = r.rule in d.stock_rules
    if r.rule.startswith("numerics."):
        return (
            f"{equivalent}; on the device its error is no worse than the stock code's "
            "and nothing new fires"
        )
    if r.rule.startswith("defect."):
        return (
            f"{equivalent}; the defect fires on the stock code, not on the adapter's, "
            "whose device error is lower"
        )
    if fired:
        return f"{equivalent}; {r.rule} fires on the stock code and not on the adapter's"
    return (
        f"{equivalent}; nothing fires on the adapter's code, but {r.rule} does not fire on the "
        "stock code of this example either: a precaution, not a fix shown here"
    )
