"""``hfadapt diagnose MODEL``: judge one model on the simulated Spyre device and show why.
Thin: parse, call ``hfadapt.judge.diagnose.diagnose``, render. Exit 0 pass, 1 the model fails, 2 bad input."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from hfadapt.cli._app import (
    DbOption,
    DTypeOption,
    JsonOption,
    ProfileOption,
    WithoutAdapterOption,
    app,
    console,
    err_console,
    left_out,
)
from hfadapt.cli._console import plan_exit
from hfadapt.errors import ModelNotFoundError, UsageError
from hfadapt.judge.environment import summary
from hfadapt.judge.evidence import describe_caches, describe_source
from hfadapt.options import Mode
from hfadapt.own_process import settle as settle_gc

_COLOURS = {
    "pass": "green",
    "verification_failed": "red",
    "lowering_failed": "red",
    "unsupported_model": "red",
}


def check_model_ref(model: str) -> None:
    """Refuse, before any work and whatever the mode, a MODEL that is neither an existing
    folder nor a Hub id (the same line full mode's loader gives)."""
    from hfadapt.hub.ids import invalid_model_id
    from hfadapt.hub.resolve import looks_like_path

    if not model.strip():
        raise UsageError("MODEL is empty: pass a Hub id or a model folder")
    if Path(model).expanduser().exists():
        return
    if looks_like_path(model):
        raise ModelNotFoundError(f"no such folder: {model}")
    if invalid_model_id(model):
        raise ModelNotFoundError(f"{model} is neither a folder nor a Hub model id")


@contextlib.contextmanager
def working(what: str, *, show: bool) -> Iterator[None]:
    """A spinner with the elapsed time on stderr while ``what`` runs, on a terminal only (it
    leaves nothing behind)."""
    if not (show and err_console.is_terminal):
        yield
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    ) as line:
        line.add_task(escape(what), total=None)
        yield


def _fmt(value: float | None, digits: int = 6) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


@app.command()
def diagnose(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL",
            help="A Hub id (HF cache, or downloaded), or a local model folder.",
            show_default=False,
        ),
    ],
    mode: Annotated[
        Mode,
        typer.Option(
            "--mode", help="full: real weights. structural: real config, random weights, 2 layers."
        ),
    ] = Mode.FULL,
    dtype: DTypeOption = None,
    compile_: Annotated[
        bool,
        typer.Option(
            "--compile/--eager",
            help="torch.compile with the spyre backend (the default, as hf-adapters judges on "
            "the card), or eager ops (--eager).",
        ),
    ] = True,
    no_adapters: Annotated[
        bool, typer.Option("--no-adapters", help="Run the stock model, without registry adapters.")
    ] = False,
    without_adapter: WithoutAdapterOption = None,
    trust_remote_code: Annotated[
        bool,
        typer.Option(
            "--trust-remote-code",
            help="Run code from the model repository (review it first): only inside the OS "
            "sandbox (bubblewrap: no network, no secrets, read-only root).",
        ),
    ] = False,
    unsafe_no_isolation: Annotated[
        bool,
        typer.Option(
            "--unsafe-no-isolation",
            help="With --trust-remote-code where bubblewrap is unavailable: run the model's "
            "code without OS isolation (recorded as such).",
        ),
    ] = False,
    revision: Annotated[
        str | None,
        typer.Option("--revision", help="Hub branch, tag or commit to load (default: main)."),
    ] = None,
    cache_dir: Annotated[
        str | None,
        typer.Option("--cache-dir", help="Model cache folder instead of the HF cache."),
    ] = None,
    local_files_only: Annotated[
        bool,
        typer.Option("--local-files-only", help="Never ask the Hub: use cached files only."),
    ] = False,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", envvar="HF_TOKEN", show_envvar=False, help="Hub token (default: HF_TOKEN)."
        ),
    ] = None,
    profile: ProfileOption = None,
    no_cache: Annotated[
        bool,
        typer.Option(
            "--no-cache",
            help="Neither read nor write the compile and CPU reference caches in this run "
            "(computed afresh; 'hfadapt cache clear' empties them for every run).",
        ),
    ] = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Diagnose one model: lowering, numerics against a CPU fp32 reference, first divergent module."""
    from hfadapt.errors import InputError
    from hfadapt.judge.diagnose import diagnose as run_diagnose

    settle_gc()  # torch, transformers and the judge are imported: no collection walks them again
    check_model_ref(model)
    if unsafe_no_isolation and not trust_remote_code:
        raise UsageError("--unsafe-no-isolation applies only with --trust-remote-code")
    without = left_out(no_adapters, without_adapter)
    if trust_remote_code:
        from hfadapt.errors import option
        from hfadapt.isolation import require_isolation

        # before the database is touched; worded as the library words it
        require_isolation(
            unsafe=unsafe_no_isolation, what=f"the model's own code ({option('trust_remote_code')})"
        )
    how = f"{mode.value}, {'compile' if compile_ else 'eager'}"
    with working(f"diagnosing {model} ({how}): load, reference, device, metrics", show=not as_json):
        diag = run_diagnose(
            model,
            mode=mode.value,
            dtype=dtype.value if dtype is not None else None,
            execution="compile" if compile_ else "eager",
            adapters=not no_adapters,
            without_adapters=without,
            trust_remote_code=trust_remote_code,
            profile=profile,
            db=db,
            revision=revision,
            token=token,
            cache_dir=cache_dir,
            local_files_only=local_files_only,
            unsafe_no_isolation=unsafe_no_isolation,
            caches=not no_cache,
        )
    plan_exit(diag.exit_code)  # a reader closing the pipe early does not change it
    if as_json:
        typer.echo(json.dumps(diag.to_dict(), indent=2, default=str))
    elif diag.exit_code == InputError.exit_code:
        # Bad input: one line, like every other input error; the row is still recorded.
        run = f", run {diag.run_id}" if diag.run_id is not None else ""
        err_console.print(
            f"[red]error:[/red] {escape(diag.reason)} (recorded as {diag.verdict}{run})",
            highlight=False,
            soft_wrap=True,
        )
    else:
        render(diag)
    if diag.exit_code:
        raise typer.Exit(diag.exit_code)


def _say(prefix: str, text: str = "", *, style: str = "") -> None:
    """One line: ``prefix`` is rich markup, ``text`` is data (escaped: a rule id like
    ``[op.pow]`` must not be read as markup)."""
    body = escape(text)
    if style:
        body = f"[{style}]{body}[/{style}]"
    console.print(f"{prefix}{body}", highlight=False, soft_wrap=True)


def _table(title: str, *columns: str) -> Table:
    return Table(*columns, title=title, title_justify="left", box=None, pad_edge=False)


def render(diag: Any) -> None:
    """The human report: verdict, violations with source lines, fallbacks, metrics, divergence."""
    colour = _COLOURS.get(diag.verdict, "yellow")
    console.print(
        f"[bold]{escape(diag.model_id)}[/bold]: [bold {colour}]{diag.verdict}[/bold {colour}]",
        highlight=False,
        soft_wrap=True,
    )
    level = diag.evidence_level or "unknown"
    where = describe_source(diag.config_source)
    if diag.structural:
        _say(
            f"[yellow]structural run ({level} evidence):[/yellow] ",
            f"config: {where}; seeded random weights, layers truncated",
        )
    elif diag.config_source is not None:
        _say(f"[green]{level} evidence:[/green] ", where)
    _say("  ", diag.reason)
    sandbox = diag.evidence.get("sandbox")
    if isinstance(sandbox, dict):
        how = "in the OS sandbox" if sandbox.get("isolated") else "WITHOUT OS isolation (unsafe)"
        _say("  ", f"judged with the model's own code {how}, {sandbox.get('seconds', 0):.1f} s")
    revision = f"; revision {diag.revision}" if diag.revision else ""
    _say(
        "  ",
        f"{diag.mode}, {diag.dtype}, {diag.execution}; {summary(diag.versions)}{revision}",
        style="dim",
    )
    caches = describe_caches(diag.evidence.get("caches"))
    if caches is not None:
        _say("  ", caches, style="dim")
    for note in diag.evidence.get("notes", []):
        _say("  ", str(note), style="dim")
    for warning in diag.evidence.get("device_warnings", []):
        _say("  [yellow]device:[/yellow] ", str(warning))
    _render_report(diag.report)
    _render_defects(diag.evidence.get("defects", []))
    if diag.adapters:
        _say("  adapters applied: ", ", ".join(diag.adapters))
    for broken in diag.evidence.get("adapters_ineffective", []):
        _say(
            "  [bold]adapter without effect:[/bold] ",
            f"{broken['adapter']}: its rule {broken['rule']} still fires at {broken['where']}",
        )
    if diag.evidence.get("without_adapters"):
        _say("  adapters left out: ", ", ".join(diag.evidence["without_adapters"]))
    if diag.metrics is not None:
        _render_metrics(diag.metrics, diag.evidence.get("margin"))
    if diag.divergence is not None:
        _say("  [bold]first divergent module:[/bold] ", diag.divergence.summary())
    elif "localize_error" in diag.evidence:
        _say("  localization failed: ", str(diag.evidence["localize_error"]))
    _say(
        "  ", "timings: " + ", ".join(f"{k} {t:.2f}s" for k, t in diag.timings.items()), style="dim"
    )
    if diag.next_step:
        _say("  [bold]next:[/bold] ", diag.next_step)
    if diag.run_id is not None:
        _say("  ", f"recorded as run {diag.run_id}", style="dim")


def _render_report(report: Any) -> None:
    """The violations (with their source lines) and the CPU fallbacks of a lowering report."""
    if report is not None and report.violations:
        # One block per violation, not a table: messages and source lines are long.
        console.print(f"  [bold]violations ({len(report.violations)}):[/bold]", highlight=False)
        for viol in report.violations:
            shapes = ", ".join("x".join(map(str, s)) for s in viol.shapes)
            detail = "; ".join(x for x in (", ".join(viol.dtypes), shapes) if x)
            what = f"{viol.op} ({detail})" if detail else viol.op
            _say("    ", f"[{viol.rule_id}] {what}: {viol.message}")
            if viol.location:
                _say("      at ", str(viol.location), style="cyan")
                if viol.location.code:
                    _say("        ", viol.location.code.strip(), style="dim")
    if report is not None and report.fallbacks:
        _say(
            "  CPU fallbacks: ", ", ".join(f"{op} x{n}" for op, n in report.fallbacks.most_common())
        )


def _render_defects(defects: list[dict[str, Any]]) -> None:
    """Each device defect that fired: where, its effect, and the source that documents it."""
    for defect in defects:
        # silent device failures: the graph lowered, the card computes these wrongly
        modules = sorted({f.get("module") or "<model>" for f in defect.get("firings", [])})
        shown = ", ".join(modules[:4]) + (
            f" (+{len(modules) - 4} more)" if len(modules) > 4 else ""
        )
        tag = escape(f"[{defect['defect_id']}]")
        _say(f"  [red]device defect {tag}[/red] ", f"fired in {shown}")
        _say("    ", str(defect.get("effect", "")), style="dim")
        _say("    source: ", str(defect.get("source", "")), style="dim")


def _render_metrics(m: Any, margin: Any) -> None:
    """The numbers that decide a verdict, as a table, and how close they came to their bounds."""
    from hfadapt.judge.margin import read_margin

    table = _table("metrics (real tokens only)", "metric", "value")
    table.add_row("min per-token cosine", f"{_fmt(m.min_token_cosine)}  (pass >= {m.threshold})")
    table.add_row(
        "max per-token norm error", f"{_fmt(m.max_norm_error)}  (pass <= {m.norm_threshold})"
    )
    table.add_row("mean per-token cosine", _fmt(m.mean_token_cosine))
    table.add_row("pooled cosine", f"{_fmt(m.pooled_cosine)}  ({escape(m.pooling)})")
    table.add_row("max abs diff", _fmt(m.max_abs_diff, 4))
    table.add_row("NaN / inf", f"{m.has_nan} / {m.has_inf}")
    table.add_row("real tokens", f"{m.tokens}")
    console.print(table)
    found = read_margin(margin)
    _say("  [bold]margin:[/bold] ", found.text() if found is not None else "-")
