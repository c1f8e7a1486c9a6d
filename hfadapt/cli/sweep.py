"""``hfadapt sweep``: judge every crawled model (the bundled snapshot, offline, in structural
mode by default) with a progress bar; ``hfadapt sweeps``: the sweeps recorded so far.
Thin: parse, call ``hfadapt.sweep.run.run_sweep``, render."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shlex
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import RenderableType
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from hfadapt.cli._app import (
    DbOption,
    DTypeOption,
    JsonOption,
    ProfileOption,
    WithoutAdapterOption,
    app,
    console,
    count_option,
    err_console,
    existing_engine,
    finite_seconds,
    left_out,
    writing_engine,
)
from hfadapt.cli._console import on_interrupt
from hfadapt.cli.progress_log import ProgressLog
from hfadapt.errors import MissingDependencyError, UsageError, option
from hfadapt.options import Execution, Executor, Mode
from hfadapt.report.charts import plural

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from hfadapt.sweep.run import SweepResult


def _log_line(text: str) -> None:
    err_console.print(text, highlight=False, soft_wrap=True, markup=False)


def _resume_command() -> str:
    """This command line as typed, without --fresh: what resumes an interrupted sweep. A
    ``--db`` URL is shown without its password (hfadapt.db.urls.hint_value), and then the hint
    says where libpq takes it from; anything else that looks like a URL password is hidden."""
    from hfadapt.db.urls import PASSWORD_SOURCES, hint_value
    from hfadapt.untrusted import hide_url_credentials

    args = [a for a in sys.argv[1:] if a not in ("--fresh", "--verbose")]
    shown: list[str] = []
    left_out = False
    after_db = False
    for arg in args:
        if after_db:
            arg, hidden = hint_value(arg)
            left_out = left_out or hidden
        elif arg.startswith("--db="):
            value, hidden = hint_value(arg[len("--db=") :])
            arg, left_out = f"--db={value}", left_out or hidden
        after_db = arg == "--db"
        shown.append(hide_url_credentials(arg))
    command = shlex.join(["hfadapt", *shown])
    return f"{command} (with {PASSWORD_SOURCES})" if left_out else command


_ORDER = (
    "pass",
    "lowering_failed",
    "verification_failed",
    "unsupported_model",
    "load_failed",
    "reference_failed",
    "custom_code",
    "skipped",
    "worker_crashed",
    "worker_timeout",
)
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
        text = f"{escape(key)} {counts[key]:,}"
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
        typer.Option(
            "--executor",
            help="local (spawned processes) or ray (needs the ray extra: pip install '.[ray]').",
        ),
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
    no_adapters: Annotated[
        bool,
        typer.Option(
            "--no-adapters",
            help="Judge the stock models, without registry adapters (the baseline the report "
            "measures what adapters unblock against).",
        ),
    ] = False,
    without_adapter: WithoutAdapterOption = None,
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
    allow_env_change: Annotated[
        bool,
        typer.Option(
            "--allow-env-change",
            help="Resume the sweep even though its runs recorded another environment (package "
            "versions, the device's numeric path) than this one; the new runs record this one.",
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
    from hfadapt.judge.options import JudgeOptions
    from hfadapt.sweep.options import SweepOptions

    without = left_out(no_adapters, without_adapter)
    judging = JudgeOptions(
        mode=mode,
        execution=Execution.COMPILE if compile_ else Execution.EAGER,
        dtype=dtype,
        profile=profile,
        adapters=not no_adapters,
        without_adapters=without,
        localize=False,
        trust_remote_code=trust_remote_code,
        unsafe_no_isolation=unsafe_no_isolation,
    )
    options = SweepOptions(
        judge=judging,
        top=top,
        model_type=model_type,
        workers=workers,
        timeout=timeout,
        memory_limit=memory_limit,
        executor=executor,
        address=address,
        narrow=not full_width,
        resume=not fresh,
        allow_env_change=allow_env_change,
    )
    _check_before_work(options)
    engine = writing_engine(db)
    from hfadapt.sweep.run import run_sweep

    display = _Display(live=not as_json and err_console.is_terminal, quiet=as_json)
    with display:
        result = run_sweep(engine, options, progress=display.update)
    on_interrupt("")
    if as_json:
        from hfadapt.db.engine import describe

        typer.echo(json.dumps({**vars(result), "db": describe(engine)}, indent=2, default=str))
        return
    _summary(result, engine)


def _check_before_work(options: Any) -> None:
    """What can be refused before the database is touched, worded with the flags."""
    from hfadapt.sweep.limits import max_local_workers

    if options.executor == Executor.RAY and importlib.util.find_spec("ray") is None:
        raise MissingDependencyError(
            "--executor ray needs Ray, which is not installed: pip install '.[ray]'"
        )
    if options.executor == Executor.LOCAL and options.workers is not None:
        cap, why = max_local_workers(options.memory_limit)
        if options.workers > cap:
            raise UsageError(
                f"--workers {options.workers} is more than this machine holds: at most {cap} "
                f"({why})"
            )
    if options.judge.trust_remote_code:
        from hfadapt.isolation import require_isolation

        # worded as the library words it
        require_isolation(
            unsafe=options.judge.unsafe_no_isolation,
            what=f"the model's own code ({option('trust_remote_code')})",
        )
    if options.judge.profile is not None:
        from hfadapt.spyre.rules.profile import load_profile

        load_profile(options.judge.profile)  # an unknown profile is refused before any write


class _Display:
    """Progress is for a person at a terminal: a live bar there, plain lines at least every
    30 s otherwise (CI, nohup); both on stderr, and the bar leaves nothing behind (the tally is
    printed once, in the summary). ``quiet`` (--json): neither."""

    def __init__(self, *, live: bool, quiet: bool) -> None:
        self.bar = _Bar(
            TextColumn("[bold]sweep {task.fields[sweep]}"),
            BarColumn(bar_width=20),
            TaskProgressColumn(),
            TextColumn(
                "{task.completed:,.0f}/{task.total:,.0f} models, units {task.fields[units]}"
            ),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}"),
            console=err_console,
            transient=True,
            disable=not live,
        )
        self.log = None if quiet or live else ProgressLog(_log_line)
        self.task: Any = None
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _Display:
        self._stack.enter_context(self.bar)
        if self.log is not None:
            self._stack.enter_context(self.log)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def update(self, p: Any) -> None:
        if self.task is None:
            on_interrupt(
                f"sweep {p.sweep_id} is recorded as interrupted; resume it with: {_resume_command()}"
            )
        fields = {
            "sweep": p.sweep_id,
            "units": f"{p.units_done}/{p.units_total}",
            "rate": f"{p.models_per_minute:,.0f}/min",
            "eta": _eta(p.eta),
        }
        self.bar.counts = _counts(dict(p.counts))
        if self.log is not None:
            plain = ", ".join(f"{k} {v:,}" for k, v in p.counts.items() if v)
            self.log.update(
                f"sweep {p.sweep_id}: {p.done:,}/{p.total:,} models, units {fields['units']}, "
                f"{fields['rate']}, {fields['eta']}; {plain}"
            )
        if self.task is None:
            self.task = self.bar.add_task("sweep", total=p.total, **fields)
        self.bar.update(self.task, completed=p.done, total=p.total, **fields)


def _summary(result: SweepResult, engine: Engine) -> None:
    """What the sweep did is a summary (stderr); its data is `hfadapt report`'s."""
    from hfadapt.db.engine import describe

    resumed = (
        f" (resumed; {plural(result.already_done, 'model')} done before)" if result.resumed else ""
    )
    err_console.print(
        f"sweep {result.sweep_id}{resumed}: {plural(result.models, 'model')} in "
        f"{result.seconds:.0f} s ({result.models_per_minute:,.0f} models/min); "
        f"{plural(result.units, 'unit')} of work, {result.judged:,} judged now, dedupe factor "
        f"{result.dedupe_factor}; recorded in {escape(describe(engine))}",
        highlight=False,
        soft_wrap=True,
    )
    if result.environment_changes:
        err_console.print(
            "  [yellow]environment changed since its earlier runs (--allow-env-change):[/yellow] "
            + escape(", ".join(result.environment_changes)),
            highlight=False,
            soft_wrap=True,
        )
    snapshot = _snapshot_note(engine)
    if snapshot:
        err_console.print(f"  {snapshot}", highlight=False, soft_wrap=True)
    err_console.print(f"  {_counts(result.counts)}", highlight=False, soft_wrap=True)
    err_console.print(
        "  next: hfadapt failures; hfadapt report --html report.html", highlight=False
    )


def _snapshot_note(engine: Engine) -> str:
    """Where the sweep's model list came from, when it is the bundled snapshot."""
    from hfadapt.hub.catalog import latest_crawl
    from hfadapt.hub.snapshot import SNAPSHOT_DATE

    crawl = latest_crawl(engine)
    if crawl is None or crawl.source != "snapshot":
        return ""
    return (
        f"models: the bundled snapshot of the Hub's ranking ({SNAPSHOT_DATE}); "
        "hfadapt crawl --online ranks today's Hub"
    )


@app.command()
def sweeps(db: DbOption = None, as_json: JsonOption = False) -> None:
    """The sweeps recorded in the database, newest first."""
    from hfadapt.db.census import list_sweeps

    engine = existing_engine(db, hint="`hfadapt sweep`")
    rows = list_sweeps(engine)
    if as_json:
        typer.echo(json.dumps([r.model_dump() for r in rows], indent=2, default=str))
        return
    if not rows:
        from hfadapt.db.engine import describe

        err_console.print(
            f"no sweeps recorded in {escape(describe(engine))} yet: run hfadapt sweep",
            highlight=False,
            soft_wrap=True,
        )
        return
    table = Table("id", "status", "mode", "top", "models", "units", "seconds", "verdicts")
    for r in rows:
        table.add_row(
            str(r.id),
            escape(r.status),
            escape(r.mode),
            str(r.top or "all"),
            f"{r.models:,}",
            f"{r.units:,}",
            f"{r.seconds:.0f}",
            _counts(r.counts or {}),
        )
    console.print(table)
