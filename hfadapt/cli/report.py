"""``hfadapt failures`` (the failure census: fingerprints by the models and downloads they
block) and ``hfadapt report`` (coverage tables, and the HTML and JSON report). Thin: parse,
call ``hfadapt.report.coverage``, render."""

from __future__ import annotations

import json
from pathlib import Path
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
)
from hfadapt.cli._files import check_output, write_output
from hfadapt.errors import UsageError
from hfadapt.report.charts import plural

SweepOption = Annotated[
    int | None,
    typer.Option(
        "--sweep",
        min=1,
        metavar="ID",
        help="Sweep id (default: the newest; see `hfadapt sweeps`).",
        show_default=False,
    ),
]


def site_lines(site: str) -> str:
    """A call site ``dir/file.py:LINE in fn`` as lines that a narrow column folds only inside
    the directory: the file, its line number and the function stay on one line together."""
    where, _, function = site.partition(" in ")
    folder, slash, name = where.rpartition("/")
    lines = [folder + slash] if folder else []
    lines.append(f"{name} in {function}" if function else name)
    return "\n".join(lines)


@app.command()
def failures(
    top: Annotated[int, count_option("--top", "How many fingerprints to show.")] = 20,
    sweep: SweepOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Failure fingerprints, by the downloads of the models each one blocks (largest first),
    and every failing model without a fingerprint, grouped by verdict."""
    from hfadapt.db.census import failure_groups
    from hfadapt.report.charts import fmt_count

    rows, blocking = failure_groups(
        existing_engine(db, hint="`hfadapt sweep`"), sweep_id=sweep, top=top
    )
    if as_json:
        # fingerprints first, as before; the verdict groups follow as their own entries
        data = [r.to_dict() for r in rows] + [{"group": b.verdict, **b.to_dict()} for b in blocking]
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    if blocking:
        groups = Table("failing without a fingerprint", "models", "downloads", "share", "e.g.")
        groups.columns[4].overflow = "fold"
        for b in blocking:
            example = f"{b.models[0]}: {b.example_reason}" if b.models else ""
            groups.add_row(
                escape(b.verdict),
                f"{b.count:,}",
                fmt_count(b.downloads),
                f"{b.share:.1%}",
                escape(example),
            )
        console.print(groups)
        err_console.print(
            f"  {sum(b.count for b in blocking):,} failing models without a fingerprint "
            "(their rows: --json, or hfadapt show MODEL)",
            highlight=False,
        )
    if not rows:
        err_console.print(
            "no failure fingerprints recorded (nothing failed to lower)", highlight=False
        )
        return
    table = Table(pad_edge=False)
    table.add_column("fingerprint", no_wrap=True)
    table.add_column("rule, op, call site", overflow="fold", ratio=3, min_width=24)
    table.add_column("models", justify="right", no_wrap=True)
    table.add_column("downloads", justify="right", no_wrap=True)
    table.add_column("e.g.", overflow="fold", ratio=2, min_width=12)
    for r in rows:
        what = "\n".join(x for x in (r.rule_id, r.op, site_lines(r.site) if r.site else "") if x)
        example = r.models[0] if r.models else ""
        table.add_row(
            escape(r.fingerprint),
            escape(what),
            f"{r.count:,}",
            fmt_count(r.downloads),
            escape(example),
        )
    console.print(table)
    top = min(len(rows), 5)
    err_console.print(
        f"  next: hfadapt draft --top {top} --list  (the agent works from this list; to draft, "
        "drop --list and name an endpoint: --base-url URL --model NAME)",
        highlight=False,
    )


@app.command()
def report(
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="PATH",
            help="Write the HTML report (one self-contained file) here.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            metavar="PATH",
            help="Write the report as JSON here.",
            show_default=False,
        ),
    ] = None,
    csv_file: Annotated[
        Path | None,
        typer.Option(
            "--csv",
            help="Write one row per model (verdict, evidence level) here.",
            show_default=False,
        ),
    ] = None,
    sweep: SweepOption = None,
    against: Annotated[
        int | None,
        typer.Option(
            "--against",
            min=1,
            metavar="ID",
            help="Diff against this other sweep (PASS, XFAIL, FAIL, IMPROVED).",
            show_default=False,
        ),
    ] = None,
    db: DbOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as JSON instead of tables.")
    ] = False,
) -> None:
    """Coverage of a sweep: pass rate by count and by downloads, per model_type, fingerprints,
    adapter impact, agreement with hf-adapters, and a diff against another sweep."""
    from hfadapt.db.census import latest_sweep
    from hfadapt.report.coverage import build_report

    # every output path first: a mistyped folder fails now, not after the report is built
    check_output(html, "--html")
    check_output(output, "--output")
    check_output(csv_file, "--csv")
    engine = existing_engine(db, hint="`hfadapt sweep`")
    if against is not None:
        newest = latest_sweep(engine) if sweep is None else None
        reported = sweep if sweep is not None else (newest.id if newest else None)
        if against == reported:
            raise UsageError(
                f"--against {against} is the sweep being reported: pass another sweep id "
                "(see `hfadapt sweeps`), or choose the reported one with --sweep"
            )
    rep = build_report(engine, sweep_id=sweep, against=against)
    data = rep.to_dict() if (as_json or output is not None) else None
    _write_files(rep, data, html=html, output=output, csv_file=csv_file)
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    _print_report(rep)


def _write_files(
    rep: Any, data: Any, *, html: Path | None, output: Path | None, csv_file: Path | None
) -> None:
    """The files asked for, each said in one line on stderr."""
    from hfadapt.report.html import render_html

    written: list[str] = []
    if html is not None:
        write_output(html, render_html(rep), "--html")
        written.append(f"wrote {html}")
    if output is not None:
        write_output(output, json.dumps(data, indent=2, default=str), "--output")
        written.append(f"wrote {output}")
    if csv_file is not None:
        from hfadapt.report.models import rows_csv

        write_output(csv_file, rows_csv(rep.model_rows), "--csv")
        written.append(f"wrote {csv_file} ({plural(len(rep.model_rows), 'model')})")
    for line in written:
        err_console.print(escape(line), highlight=False, soft_wrap=True)


def _print_report(rep: Any) -> None:
    """The report's tables on stdout."""
    from hfadapt.report.charts import fmt_count
    from hfadapt.report.coverage import TYPE_COLUMNS

    where = f"sweep {rep.sweep['id']}" if rep.sweep else "latest run of every model"
    console.print(
        f"{where}: {plural(rep.models, 'model')}; pass on their own weights or config {rep.passed:,} "
        f"({rep.pass_rate:.1%} by count, {rep.pass_rate_downloads:.1%} by downloads)",
        highlight=False,
        soft_wrap=True,
    )
    beside = f"  beside it: architecture passes {rep.passed_architecture:,} (this model's shapes were not checked)"
    if rep.passed_unknown:
        beside += f"; passes with no evidence level recorded {rep.passed_unknown:,}"
    console.print(beside, highlight=False, soft_wrap=True)
    levels = Table(
        "evidence",
        "models",
        "pass",
        "downloads",
        "pass downloads",
        title="by evidence level",
        title_justify="left",
    )
    for lv in rep.by_evidence:
        levels.add_row(
            escape(lv.level),
            f"{lv.models:,}",
            f"{lv.passed:,}",
            fmt_count(lv.downloads),
            fmt_count(lv.passed_downloads),
        )
    console.print(levels)
    table = Table(*TYPE_COLUMNS, title="by model_type (top 15)", title_justify="left")
    for t in rep.by_model_type[:15]:
        table.add_row(
            escape(t.model_type),
            f"{t.models:,}",
            f"{t.passed:,}",
            f"{t.passed_architecture:,}",
            f"{t.passed / t.models:.1%}",
            fmt_count(t.downloads),
            f"{t.passed_downloads / t.downloads:.1%}" if t.downloads else "n/a",
        )
    console.print(table)
    for name, models, downloads in rep.ineffective:
        console.print(
            f"[bold]adapter without effect:[/bold] {escape(name)} was applied to "
            f"{plural(models, 'model')} ({fmt_count(downloads)} downloads) whose runs still met "
            "its rule in the code it rewrites: check it with hfadapt adapters verify "
            f"{escape(name)}",
            highlight=False,
            soft_wrap=True,
        )
    a = rep.agreement
    console.print(
        f"agreement with hf-adapters is_supported on {plural(a.compared, 'model')}: {a.rate:.1%} "
        f"(both yes {a.both_yes:,}, both no {a.both_no:,}, only hfadapt {a.only_ours:,}, only hf-adapters {a.only_theirs:,})",
        highlight=False,
        soft_wrap=True,
    )
    if rep.diff is not None:
        counts = ", ".join(f"{k} {v:,}" for k, v in rep.diff.counts.items())
        console.print(f"against sweep {rep.diff.baseline}: {counts}", highlight=False)
        envs = rep.diff.environment_line()
        if envs:
            console.print(f"  {escape(envs)}", style="yellow", highlight=False, soft_wrap=True)
