"""``hfadapt sweep``: judge every crawled model (the bundled snapshot, offline, in structural
mode by default) with a progress bar; ``hfadapt sweeps``: the sweeps recorded so far.
Thin: parse, call ``hfadapt.sweep.run.run_sweep``, render."""

from __future__ import annotations

import contextlib
import json
from typing import Annotated, Any

import typer
from rich.console import RenderableType
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from hfadapt.cli._app import (
    DbOption,
    DTypeOption,
    JsonOption,
    ProfileOption,
    app,
    console,
    count_option,
    existing_engine,
    finite_seconds,
)
from hfadapt.cli.progress_log import ProgressLog
from hfadapt.errors import UsageError
from hfadapt.options import Executor, Mode


def _log_line(text: str) -> None:
    console.print(text, highlight=False, soft_wrap=True, markup=False)


_ORDER = ("pass", "lowering_failed", "verification_failed", "unsupported_model", "load_failed",
          "reference_failed", "custom_code", "skipped", "worker_crashed", "worker_timeout")  # fmt: skip
_COLOURS = {
    "pass": "green",
    "lowering_failed": "red",
    "verification_failed": "red",
    "worker_crashed": "magenta",
    "worker_timeout": "yellow",
}


def _counts(counts: dict[str, int]) -> str:
    keys = [k for k in _ORDER if counts.get(k)] + sorted(
        k for k in counts if k not in _ORDER and counts[k]
    )
    parts = []
    for key in keys:
        colour = _COLOURS.get(key)
        text = f"{key} {counts[key]:,}"
        parts.append(f"[{colour}]{text}[/{colour}]" if colour else text)
    return "  ".join(parts)


class _Bar(Progress):
    """One progress line, and under it the models counted per verdict so far."""

    counts = ""

    def get_renderables(self) -> Any:
        table: RenderableType = self.make_tasks_table(self.tasks)
        yield table
        if self.counts:
            yield Text.from_markup(f"  {self.counts}")


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA ?"
    minutes, secs = divmod(int(seconds), 60)
    return f"ETA {minutes}:{secs:02d}"


@app.command()
def sweep(
    top: Annotated[
        int | None,
        count_option(
            "--top",
            "Only the N best-ranked models (default: every crawled one).",
            show_default=False,
        ),
    ] = None,
    model_type: Annotated[
        str | None,
        typer.Option(
            "--model-type",
            metavar="TYPE",
            help="Only this model_type (e.g. bert).",
            show_default=False,
        ),
    ] = None,
    mode: Annotated[
        Mode,
        typer.Option(
            "--mode",
            help="structural: real config (or defaults), random weights, 2 layers, one run per signature. full: real weights, every model.",
        ),
    ] = Mode.STRUCTURAL,
    workers: Annotated[
        int | None,
        count_option(
            "--workers",
            "Parallel worker processes (default: CPUs, at most 2 locally; at most what the CPUs and RAM hold).",
            show_default=False,
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout",
            metavar="SECONDS",
            callback=finite_seconds("--timeout"),
            help="Seconds per unit of work before worker_timeout.",
        ),
    ] = 600.0,
    memory_limit: Annotated[
        int | None,
        typer.Option(
            "--memory-limit",
            min=0,
            max=2**40,
            metavar="MB",
            help="MB of address space per worker (default: 85% of RAM shared; 0: none).",
            show_default=False,
        ),
    ] = None,
    executor: Annotated[
        Executor,
        typer.Option("--executor", help="local (spawned processes) or ray (needs hfadapt[ray])."),
    ] = Executor.LOCAL,
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            metavar="HOST:PORT",
            help="Ray cluster address (default: a local Ray instance).",
            show_default=False,
        ),
    ] = None,
    compile_: Annotated[
        bool,
        typer.Option(
            "--compile/--eager",
            help="torch.compile with the spyre backend (the default, as hf-adapters judges on "
            "the card), or eager ops (--eager).",
        ),
    ] = True,
    dtype: DTypeOption = None,
    without_adapter: Annotated[
        list[str] | None,
        typer.Option(
            "--without-adapter",
            metavar="NAME",
            help="Leave this registry adapter out of every unit (repeatable).",
            show_default=False,
        ),
    ] = None,
    full_width: Annotated[
        bool,
        typer.Option(
            "--full-width",
            help="Judge wide signatures at their real width (slower), not on a narrowed instance.",
        ),
    ] = False,
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="Start a new sweep instead of resuming an unfinished one with the same options.",
        ),
    ] = False,
    trust_remote_code: Annotated[
        bool,
        typer.Option(
            "--trust-remote-code",
            help="Judge models that need their own code (no native translation) with it, each "
            "only inside the OS sandbox (no network: their code must be in the HF cache).",
        ),
    ] = False,
    unsafe_no_isolation: Annotated[
        bool,
        typer.Option(
            "--unsafe-no-isolation",
            help="With --trust-remote-code where bubblewrap is unavailable: run that code "
            "without OS isolation (recorded as such).",
        ),
    ] = False,
    profile: ProfileOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Judge every crawled model on the simulated device (resumes an interrupted sweep)."""
    from hfadapt.db.engine import describe, get_engine
    from hfadapt.sweep.limits import max_local_workers
    from hfadapt.sweep.run import run_sweep

    if unsafe_no_isolation and not trust_remote_code:
        raise UsageError("--unsafe-no-isolation applies only with --trust-remote-code")
    if executor == Executor.LOCAL and workers is not None:
        cap, why = max_local_workers(memory_limit)
        if workers > cap:
            raise UsageError(
                f"--workers {workers} is more than this machine holds: at most {cap} ({why})"
            )
    engine = get_engine(db)
    progress = _Bar(
        TextColumn("[bold]sweep {task.fields[sweep]}"),
        BarColumn(bar_width=20),
        TaskProgressColumn(),
        TextColumn("{task.completed:,.0f}/{task.total:,.0f} models, units {task.fields[units]}"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[eta]}"),
        console=console,
        transient=as_json,
        disable=as_json,
    )
    bar: dict[str, Any] = {}

    def update(p: Any) -> None:
        fields = {
            "sweep": p.sweep_id,
            "units": f"{p.units_done}/{p.units_total}",
            "rate": f"{p.models_per_minute:,.0f}/min",
            "eta": _eta(p.eta),
        }
        progress.counts = _counts(dict(p.counts))
        if log is not None:
            plain = ", ".join(f"{k} {v:,}" for k, v in p.counts.items() if v)
            log.update(
                f"sweep {p.sweep_id}: {p.done:,}/{p.total:,} models, units {fields['units']}, "
                f"{fields['rate']}, {fields['eta']}; {plain}"
            )
        if "task" not in bar:
            bar["task"] = progress.add_task("sweep", total=p.total, **fields)
        progress.update(bar["task"], completed=p.done, total=p.total, **fields)

    # Without a terminal the bar prints nothing until the end: plain lines instead (CI, nohup).
    log = None if as_json or console.is_terminal else ProgressLog(_log_line)
    with progress, log or contextlib.nullcontext():
        result = run_sweep(
            engine,
            top=top,
            model_type=model_type,
            mode=mode.value,
            workers=workers,
            timeout=timeout,
            memory_limit=memory_limit,
            executor=executor.value,
            address=address,
            execution="compile" if compile_ else "eager",
            dtype=dtype.value if dtype is not None else None,
            profile=profile,
            without_adapters=tuple(without_adapter or ()),
            narrow=not full_width,
            resume=not fresh,
            progress=update,
            trust_remote_code=trust_remote_code,
            unsafe_no_isolation=unsafe_no_isolation,
        )
    if as_json:
        typer.echo(json.dumps({**vars(result), "db": describe(engine)}, indent=2, default=str))
        return
    resumed = (
        f" (resumed; {result.already_done:,} models were done before)" if result.resumed else ""
    )
    console.print(
        f"sweep {result.sweep_id}{resumed}: {result.models:,} models in {result.seconds:.0f} s "
        f"({result.models_per_minute:,.0f} models/min); {result.units} units of work, {result.judged} judged now, "
        f"dedupe factor {result.dedupe_factor}; recorded in {describe(engine)}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"  {_counts(result.counts)}", highlight=False, soft_wrap=True)
    console.print("  next: hfadapt failures; hfadapt report --html report.html", highlight=False)


@app.command()
def sweeps(db: DbOption = None, as_json: JsonOption = False) -> None:
    """The sweeps recorded in the database, newest first."""
    from hfadapt.sweep.store import list_sweeps

    rows = list_sweeps(existing_engine(db, hint="`hfadapt sweep`"))
    if as_json:
        typer.echo(json.dumps([r.model_dump() for r in rows], indent=2, default=str))
        return
    table = Table("id", "status", "mode", "top", "models", "units", "seconds", "verdicts")
    for r in rows:
        table.add_row(
            str(r.id),
            r.status,
            r.mode,
            str(r.top or "all"),
            f"{r.models:,}",
            f"{r.units:,}",
            f"{r.seconds:.0f}",
            _counts(r.counts or {}),
        )
    console.print(table)
