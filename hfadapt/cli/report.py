"""``hfadapt failures`` (the failure census: fingerprints by the models and downloads they
block) and ``hfadapt report`` (coverage tables, and the HTML and JSON report). Thin: parse,
call ``hfadapt.report.coverage``, render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from hfadapt.cli._app import DbOption, JsonOption, app, console

SweepOption = Annotated[
    int | None,
    typer.Option(
        "--sweep", help="Sweep id (default: the newest; see `hfadapt sweeps`).", show_default=False
    ),
]


@app.command()
def failures(
    top: Annotated[int, typer.Option("--top", help="How many fingerprints to show.")] = 20,
    sweep: SweepOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Failure fingerprints, by the downloads of the models each one blocks (largest first)."""
    from hfadapt.db.engine import get_engine
    from hfadapt.report.charts import fmt_count
    from hfadapt.report.failures import failure_groups

    rows, blocking = failure_groups(get_engine(db), sweep_id=sweep, top=top)
    if as_json:
        # fingerprints first, as before; the blocking verdict groups follow as their own entries
        data = [r.to_dict() for r in rows] + [{"group": b.verdict, **b.to_dict()} for b in blocking]
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    if blocking:
        groups = Table("blocked before the device", "models", "downloads", "share", "e.g.")
        for b in blocking:
            groups.add_row(b.verdict, f"{b.count:,}", fmt_count(b.downloads), f"{b.share:.1%}",
                           b.models[0] if b.models else "")  # fmt: skip
        console.print(groups)
    if not rows:
        console.print("no failure fingerprints recorded (nothing failed to lower)", highlight=False)
        return
    table = Table("fingerprint", "rule, op, call site", "models", "downloads", "e.g.")
    for r in rows:
        what = "\n".join(x for x in (r.rule_id, r.op, r.site) if x)
        example = r.models[0] if r.models else ""
        table.add_row(r.fingerprint, what, f"{r.count:,}", fmt_count(r.downloads), example)
    console.print(table)
    console.print(
        "  next: hfadapt draft --top K  (the agent works from this list)", highlight=False
    )


@app.command()
def report(
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            help="Write the HTML report (one self-contained file) here.",
            show_default=False,
        ),
    ] = None,
    json_file: Annotated[
        Path | None,
        typer.Option("--json", help="Write the report as JSON here.", show_default=False),
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
            help="Diff against this earlier sweep (PASS, XFAIL, FAIL, IMPROVED).",
            show_default=False,
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Coverage of a sweep: pass rate by count and by downloads, per model_type, fingerprints,
    adapter impact, agreement with hf-adapters, and a diff against another sweep."""
    from hfadapt.db.engine import get_engine
    from hfadapt.report.charts import fmt_count
    from hfadapt.report.coverage import build_report
    from hfadapt.report.html import render_html

    rep = build_report(get_engine(db), sweep_id=sweep, against=against)
    where = f"sweep {rep.sweep['id']}" if rep.sweep else "latest run of every model"
    console.print(
        f"{where}: {rep.models:,} models; pass on their own weights or config {rep.passed:,} "
        f"({rep.pass_rate:.1%} by count, {rep.pass_rate_downloads:.1%} by downloads)",
        highlight=False,
        soft_wrap=True,
    )
    beside = f"  beside it: architecture passes {rep.passed_architecture:,} (this model's shapes were not checked)"
    if rep.passed_unknown:
        beside += f"; passes with no evidence level recorded {rep.passed_unknown:,}"
    console.print(beside, highlight=False, soft_wrap=True)
    levels = Table("evidence", "models", "pass", "downloads", "pass downloads",
                   title="by evidence level", title_justify="left")  # fmt: skip
    for lv in rep.by_evidence:
        levels.add_row(lv.level, f"{lv.models:,}", f"{lv.passed:,}", fmt_count(lv.downloads),
                       fmt_count(lv.passed_downloads))  # fmt: skip
    console.print(levels)
    table = Table(
        "model_type",
        "models",
        "pass",
        "arch. pass",
        "pass rate",
        "downloads",
        "pass rate (downloads)",
        title="by model_type (top 15)",
        title_justify="left",
    )
    for t in rep.by_model_type[:15]:
        table.add_row(
            t.model_type,
            f"{t.models:,}",
            f"{t.passed:,}",
            f"{t.passed_architecture:,}",
            f"{t.passed / t.models:.1%}",
            fmt_count(t.downloads),
            f"{t.passed_downloads / t.downloads:.1%}" if t.downloads else "n/a",
        )
    console.print(table)
    a = rep.agreement
    console.print(
        f"agreement with hf-adapters is_supported on {a.compared:,} models: {a.rate:.1%} "
        f"(both yes {a.both_yes:,}, both no {a.both_no:,}, only hfadapt {a.only_ours:,}, only hf-adapters {a.only_theirs:,})",
        highlight=False,
        soft_wrap=True,
    )
    if rep.diff is not None:
        counts = ", ".join(f"{k} {v:,}" for k, v in rep.diff.counts.items())
        console.print(f"against sweep {rep.diff.baseline}: {counts}", highlight=False)
    if html is not None:
        html.write_text(render_html(rep), encoding="utf-8")
        console.print(f"wrote {html}", highlight=False)
    if json_file is not None:
        json_file.write_text(json.dumps(rep.to_dict(), indent=2, default=str), encoding="utf-8")
        console.print(f"wrote {json_file}", highlight=False)
    if csv_file is not None:
        from hfadapt.report.models import rows_csv

        csv_file.write_text(rows_csv(rep.model_rows), encoding="utf-8")
        console.print(f"wrote {csv_file} ({len(rep.model_rows):,} models)", highlight=False)
