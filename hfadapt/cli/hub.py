"""Commands about the Hub listing: crawl, models, census."""

from __future__ import annotations

import dataclasses
import json
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from hfadapt.cli._app import (
    DbOption,
    JsonOption,
    app,
    console,
    count_option,
    err_console,
    existing_engine,
    new_database_removed_on_failure,
)
from hfadapt.errors import HubUnreachableError, UsageError
from hfadapt.report.charts import plural

# Below this terminal width `models` drops its likes, library and params columns.
WIDE = 120


def _echo_json(data: object) -> None:
    # Plain print, not rich: JSON output is for pipes and must not be wrapped or coloured.
    typer.echo(json.dumps(data, indent=2, default=str))


def _no_crawl(db: str | None) -> None:
    from hfadapt.db.engine import describe, resolve_url
    from hfadapt.errors import UsageError

    raise UsageError(
        f"no crawl in {describe(resolve_url(db))} yet: run `hfadapt crawl` first (add --offline for the bundled snapshot)"
    )


@app.command()
def crawl(
    limit: Annotated[
        int, count_option("--limit", "How many models to rank (excluded ones included).")
    ] = 10_000,
    offline: Annotated[
        bool | None,
        typer.Option(
            "--offline/--online",
            help="--offline: read the bundled snapshot. --online: the Hub, or fail. Default: the Hub if reachable, else the snapshot.",
            show_default=False,
        ),
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option(
            "--endpoint",
            metavar="URL",
            help="Hub API URL (a mirror; default $HF_ENDPOINT or huggingface.co).",
            show_default=False,
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Rank the most-downloaded embedding models, prefilter them, and store them in the database."""
    from rich.progress import Progress

    from hfadapt.db.engine import describe
    from hfadapt.hub.crawl import crawl as run_crawl

    if offline and endpoint:
        raise UsageError(
            "--offline reads the bundled snapshot; it cannot be combined with --endpoint"
        )
    # the config.json of every kept model (online only): a bar while they come in, on a terminal
    bar = Progress(
        console=err_console, transient=True, disable=as_json or not err_console.is_terminal
    )
    with new_database_removed_on_failure(db) as engine, bar:
        task = bar.add_task("configs", total=None, visible=False)

        def configs_done(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, visible=True)

        try:
            result = run_crawl(
                engine,
                limit=limit,
                offline=offline,
                endpoint=endpoint,
                config_progress=configs_done,
            )
        except HubUnreachableError as exc:  # the library names no flag; the CLI names its own
            raise HubUnreachableError(f"{exc.one_line(flags=True)} with --offline") from exc
    if as_json:
        _echo_json({**dataclasses.asdict(result), "db": describe(engine)})
        return
    # What the crawl did is a summary: stderr (the ranking itself is `hfadapt models`).
    source = "the bundled snapshot" if result.source == "snapshot" else result.source
    for note in result.notes:
        err_console.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False, soft_wrap=True)
    err_console.print(
        f"crawled {escape(source)} into {escape(describe(engine))}: seen {result.seen:,}, "
        f"kept {result.kept:,}, excluded {result.seen - result.kept:,} in {result.seconds:.2f} s",
        highlight=False,
        soft_wrap=True,
    )
    if result.excluded:
        table = Table("excluded because", "models", box=None, pad_edge=False)
        for reason, count in result.excluded.items():
            table.add_row(escape(reason), f"{count:,}")
        err_console.print(table)


@app.command()
def models(
    top: Annotated[int, count_option("--top", "How many models to show.")] = 20,
    model_type: Annotated[
        str | None,
        typer.Option(
            "--model-type",
            metavar="TYPE",
            help="Only this model_type (e.g. bert).",
            show_default=False,
        ),
    ] = None,
    library: Annotated[
        str | None,
        typer.Option(
            "--library",
            metavar="NAME",
            help="Only this library (e.g. sentence-transformers).",
            show_default=False,
        ),
    ] = None,
    include_excluded: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Also list the models the crawl ranked but its prefilter excluded from sweeps "
            "(rerankers, ONNX/GGUF/MLX-only repos, adapter-only repos, mixture of experts, over 60B "
            "parameters, not a text embedding model), each flagged "
            "'excluded: REASON'; without it only the models a sweep would judge are listed.",
        ),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """The top models of the latest crawl, best first."""
    from hfadapt.db.tables import HubModel
    from hfadapt.hub.catalog import current_models, latest_crawl

    engine = existing_engine(db, hint="`hfadapt crawl`")
    if latest_crawl(engine) is None:
        _no_crawl(db)
    rows = current_models(
        engine, top=top, model_type=model_type, library=library, include_excluded=include_excluded
    )
    from hfadapt.report.models import latest_verdicts

    judged = latest_verdicts(engine, [row.id for row in rows])
    if as_json:
        fields = [name for name in HubModel.model_fields if name != "config_json"]
        _echo_json(
            [
                {name: getattr(row, name) for name in fields}
                | dict(
                    zip(
                        ("verdict", "evidence_level"), judged.get(row.id, (None, None)), strict=True
                    )
                )
                for row in rows
            ]
        )
        return
    if not rows:
        err_console.print(
            "no models match these filters (see hfadapt models --all)", highlight=False
        )
        return
    console.print(models_table(rows, console.width, judged))


def models_table(
    rows: list[Any], width: int, judged: dict[str, tuple[str, str]] | None = None
) -> Table:
    """The models as a table that fits ``width`` columns: numbers never wrap, a long id folds,
    and below WIDE columns the likes, library and params columns are left out. ``judged``
    (model id -> latest verdict and evidence level) adds those two columns after a sweep."""
    wide = width >= WIDE
    table = Table(pad_edge=False, collapse_padding=True)
    table.add_column("rank", justify="right", no_wrap=True)
    table.add_column("model", overflow="fold", ratio=1, min_width=16)
    table.add_column("downloads", justify="right", no_wrap=True)
    if wide:
        table.add_column("likes", justify="right", no_wrap=True)
    table.add_column("model_type", overflow="fold", max_width=16)
    if wide:
        table.add_column("library", overflow="fold", max_width=24)
        table.add_column("params", justify="right", no_wrap=True)
    table.add_column("flags", overflow="fold", max_width=24 if wide else 14)
    if judged:
        table.add_column("verdict", overflow="fold", max_width=22)
        table.add_column("evidence", overflow="fold", max_width=12)
    for row in rows:
        flags = [
            name
            for name, on in (
                ("gated", row.is_gated),
                ("custom code", row.is_custom_code),
                ("multimodal", row.is_multimodal),
            )
            if on
        ]
        if row.excluded_reason:
            flags.insert(0, f"excluded: {row.excluded_reason}")
        cells = [str(row.rank), escape(row.id), f"{row.downloads:,}"]
        if wide:
            cells.append(f"{row.likes:,}")
        cells.append(escape(row.model_type or ""))
        if wide:
            params = f"{row.num_parameters / 1e6:,.0f}M" if row.num_parameters else ""
            cells += [escape(row.library or ""), params]
        cells.append(escape(", ".join(flags)))
        if judged:
            cells += [escape(v or "") for v in judged.get(row.id, ("not judged", ""))]
        table.add_row(*cells)
    return table


@app.command()
def census(
    top: Annotated[
        int | None,
        count_option(
            "--top", "Only the N model_types with the most downloads.", show_default=False
        ),
    ] = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """How many models of the latest crawl, and what share of their downloads, each model_type
    has; most downloads first."""
    from hfadapt.hub.catalog import census as run_census

    result = run_census(existing_engine(db, hint="`hfadapt crawl`"), top=top)
    if result.crawl is None:
        _no_crawl(db)
    if as_json:
        _echo_json(
            {
                "models": result.models,
                "kept": result.kept,
                "downloads": result.downloads,
                "crawl_id": result.crawl.id if result.crawl else None,
                "source": result.crawl.source if result.crawl else None,
                "model_types": [dataclasses.asdict(r) for r in result.rows],
            }
        )
        return
    table = Table(
        "model_type",
        "models",
        "kept",
        "downloads",
        "share",
        title=f"{plural(result.models, 'model')}, {result.downloads:,} downloads",
    )
    for r in result.rows:
        table.add_row(
            escape(r.model_type),
            f"{r.models:,}",
            f"{r.kept:,}",
            f"{r.downloads:,}",
            f"{100 * r.share:.1f}%",
        )
    console.print(table)
