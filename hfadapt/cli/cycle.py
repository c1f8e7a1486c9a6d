"""``hfadapt cycle``: one pass of the whole job for a scheduler (crawl, sweep, compare with the
last completed cycle, draft for new failure fingerprints with ``--draft``, report); exit 4 when
models that passed then fail now. Thin: parse, call ``hfadapt.service.cycle.run_cycle``,
render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from hfadapt.cli._app import (
    REGRESSIONS_FOUND,
    DbOption,
    JsonOption,
    ProfileOption,
    WithoutAdapterOption,
    app,
    count_option,
    err_console,
    finite_seconds,
    left_out,
    writing_engine,
)
from hfadapt.cli._console import clean, on_interrupt, plan_exit
from hfadapt.cli._files import check_output, write_output
from hfadapt.cli.agent import AgentModelOption, ApiKeyOption, BaseUrlOption, UnsafeOption
from hfadapt.errors import HubUnreachableError, UsageError
from hfadapt.options import Executor, Mode
from hfadapt.report.charts import plural

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from hfadapt.service.cycle import CycleResult

REASON_CHARS = 200  # of a regression's reason on stdout (--json holds it whole)


@app.command()
def cycle(
    top: Annotated[
        int | None,
        count_option(
            "--top",
            "Sweep only the N best-ranked models (default: every crawled one).",
            show_default=False,
        ),
    ] = None,
    offline: Annotated[
        bool,
        typer.Option(
            "--offline/--online",
            help="--offline: rank the bundled snapshot. --online (default): the Hub, or fail (exit 3).",
        ),
    ] = False,
    endpoint: Annotated[
        str | None,
        typer.Option(
            "--endpoint", metavar="URL", help="Hub API URL (a mirror).", show_default=False
        ),
    ] = None,
    limit: Annotated[int, count_option("--limit", "How many models the crawl ranks.")] = 10_000,
    mode: Annotated[
        Mode, typer.Option("--mode", help="structural or full (as hfadapt sweep).")
    ] = Mode.STRUCTURAL,
    workers: Annotated[
        int | None,
        count_option(
            "--workers", "Parallel worker processes (as hfadapt sweep).", show_default=False
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
            "--address", metavar="HOST:PORT", help="Ray cluster address.", show_default=False
        ),
    ] = None,
    without_adapter: WithoutAdapterOption = None,
    profile: ProfileOption = None,
    fresh: Annotated[
        bool,
        typer.Option("--fresh", help="Start a new cycle instead of resuming an unfinished one."),
    ] = False,
    allow_env_change: Annotated[
        bool,
        typer.Option("--allow-env-change", help="Resume a sweep recorded in another environment."),
    ] = False,
    html: Annotated[
        Path | None,
        typer.Option(
            "--html",
            metavar="PATH",
            help="Write the HTML report (against the last cycle) here.",
            show_default=False,
        ),
    ] = None,
    webhook: Annotated[
        str | None,
        typer.Option(
            "--webhook",
            metavar="URL",
            help="When something regressed, POST a JSON summary here (a chat or alerting "
            "webhook); a failure to deliver is a warning. Only its host is ever printed.",
            show_default=False,
        ),
    ] = None,
    draft: Annotated[
        bool,
        typer.Option(
            "--draft",
            help="Draft adapters for the failure fingerprints new since the "
            "last completed cycle, within the budget (needs an endpoint, as hfadapt draft).",
        ),
    ] = False,
    draft_attempts: Annotated[
        int | None,
        typer.Option(
            "--draft-attempts",
            metavar="N",
            show_default=False,
            help="With --draft: drafts asked of the endpoint in the whole cycle, 1-1000 "
            "(default 8; at most 4 per fingerprint).",
        ),
    ] = None,
    draft_tokens: Annotated[
        int | None,
        typer.Option(
            "--draft-tokens",
            metavar="N",
            show_default=False,
            help="With --draft: prompt + completion tokens in the whole cycle, "
            "1,000-100,000,000 (default 200,000).",
        ),
    ] = None,
    base_url: BaseUrlOption = None,
    agent_model: AgentModelOption = None,
    api_key: ApiKeyOption = None,
    unsafe_no_isolation: UnsafeOption = False,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """One pass of the whole job, for a scheduler: crawl, sweep, compare with the last completed
    cycle, draft for new failure fingerprints (--draft), report. Exit 4 when a model that passed
    then fails now (the regressions are printed); an interrupted cycle resumes; a second cycle on
    the same database is refused (exit 2)."""
    from hfadapt.judge.options import JudgeOptions
    from hfadapt.service.cycle import CycleOptions, run_cycle
    from hfadapt.sweep.options import SweepOptions

    if offline and endpoint:
        raise UsageError(
            "--offline ranks the bundled snapshot; it cannot be combined with --endpoint"
        )
    check_output(html, "--html")
    drafting = _drafting(
        draft, draft_attempts, draft_tokens, base_url, agent_model, api_key, unsafe_no_isolation
    )
    if webhook is not None:
        from hfadapt.service.webhook import check_webhook

        check_webhook(webhook)
    judging = JudgeOptions(
        mode=mode,
        profile=profile,
        without_adapters=left_out(False, without_adapter),
        localize=False,
    )
    sweep = SweepOptions(
        judge=judging,
        top=top,
        workers=workers,
        timeout=timeout,
        executor=executor,
        address=address,
        resume=not fresh,
        allow_env_change=allow_env_change,
    )
    from hfadapt.cli.sweep import _check_before_work, _Display, _resume_command

    _check_before_work(sweep)
    engine = writing_engine(db)
    display = _Display(live=not as_json and err_console.is_terminal, quiet=as_json)
    hint: list[str] = []

    def claimed(cycle_id: int, resumed: bool) -> None:
        hint.append(
            f"cycle {cycle_id} is recorded as interrupted; resume it with: {_resume_command()}"
        )
        on_interrupt(hint[0])
        if resumed and not as_json:
            err_console.print(f"resuming cycle {cycle_id}", highlight=False)

    def progress(p: object) -> None:
        display.update(p)
        on_interrupt(hint[0])  # the cycle's command resumes the sweep too

    options = CycleOptions(
        sweep=sweep, offline=offline, endpoint=endpoint, limit=limit, drafting=drafting
    )
    if drafting is not None and not as_json:
        _note(f"accepted drafts are written to {drafting.home()} and apply to every later model")
    try:
        with display:
            result = run_cycle(
                engine,
                options,
                progress=progress,
                started_cycle=claimed,
                note=(lambda _: None) if as_json else _note,
            )
    except HubUnreachableError as exc:  # the library names no flag; the CLI names its own
        raise HubUnreachableError(f"{exc.one_line(flags=True)} with --offline") from exc
    on_interrupt("")
    _conclude(engine, result, html=html, webhook=webhook, as_json=as_json)


def _conclude(
    engine: Engine, result: CycleResult, *, html: Path | None, webhook: str | None, as_json: bool
) -> None:
    """What a finished cycle leaves: the HTML report, the webhook told of regressions, the
    summary (or its JSON) and the exit code (4 when something regressed)."""
    _report(engine, result, html)
    code = REGRESSIONS_FOUND if result.regressions else 0
    plan_exit(code)
    if code and webhook is not None:
        _notify(webhook, result, engine)
    if as_json:
        typer.echo(json.dumps(_json(result, engine), indent=2, default=str))
    else:
        _print(result)
    if code:
        raise typer.Exit(code)


def _drafting(
    draft: bool,
    attempts: int | None,
    tokens: int | None,
    base_url: str | None,
    agent_model: str | None,
    api_key: str | None,
    unsafe: bool,
) -> Any:
    """The cycle's drafting (hfadapt.service.drafting.CycleDrafting), or None without --draft;
    every value checked here, before any work: the budgets' bounds, bubblewrap (exit 3 unless
    --unsafe-no-isolation), the endpoint's settings as ``hfadapt draft`` takes them (flags,
    then $OPENAI_BASE_URL, $OPENAI_API_KEY, $HFADAPT_AGENT_MODEL; never a default endpoint)."""
    given = {
        "--draft-attempts": attempts is not None,
        "--draft-tokens": tokens is not None,
        "--base-url": base_url is not None,
        "--model": agent_model is not None,
        "--api-key": api_key is not None,
        "--unsafe-no-isolation": unsafe,
    }
    if not draft:
        stray = [flag for flag, set_ in given.items() if set_]
        if stray:
            raise UsageError(f"{', '.join(stray)} only go with --draft (drafting in the cycle)")
        return None
    from hfadapt.agent.client import AgentSettings
    from hfadapt.isolation import require_isolation
    from hfadapt.service.drafting import (
        DEFAULT_ATTEMPTS,
        DEFAULT_TOKENS,
        CycleDrafting,
        DraftBudget,
    )

    budget = DraftBudget(
        DEFAULT_ATTEMPTS if attempts is None else attempts,
        DEFAULT_TOKENS if tokens is None else tokens,
    )
    require_isolation(unsafe=unsafe)
    settings = AgentSettings.from_env(model=agent_model, base_url=base_url, api_key=api_key)
    return CycleDrafting(settings=settings, budget=budget, unsafe_no_isolation=unsafe)


def _note(text: str) -> None:
    err_console.print(escape(text), highlight=False, soft_wrap=True)


def _notify(webhook: str, result: CycleResult, engine: Engine) -> None:
    """The regressions to the webhook; a failure is one line on stderr, nothing more."""
    from hfadapt.db.engine import describe
    from hfadapt.service.webhook import post_summary, regression_summary

    warning = post_summary(webhook, regression_summary(result, describe(engine)))
    if warning is not None:
        err_console.print(escape(warning), highlight=False, soft_wrap=True)


def _report(engine: Engine, result: CycleResult, html: Path | None) -> None:
    if html is None:
        return
    from hfadapt.report.coverage import build_report
    from hfadapt.report.html import render_html

    against = result.comparison.baseline_sweep if result.comparison else None
    rep = build_report(engine, sweep_id=result.sweep.sweep_id, against=against)
    write_output(html, render_html(rep), "--html")
    err_console.print(f"wrote {escape(str(html))}", highlight=False, soft_wrap=True)


def _json(result: CycleResult, engine: Engine) -> dict[str, object]:
    from hfadapt.db.engine import describe

    comp = result.comparison
    return {
        "cycle": result.cycle_id,
        "resumed": result.resumed,
        "crawl": result.crawl_id,
        "crawled": result.crawled,
        "sweep": result.sweep.sweep_id,
        "baseline_cycle": result.baseline_cycle,
        "regressions_found": result.regressions,
        "counts": result.sweep.counts,
        "comparison": comp.to_dict() if comp else None,
        "drafting": result.drafting.to_dict() if result.drafting else None,
        "seconds": {
            "total": round(result.seconds, 3),
            "crawl": round(result.crawl_seconds, 3),
            "sweep": round(result.sweep_seconds, 3),
            "compare": round(result.compare_seconds, 3),
            "draft": round(result.draft_seconds, 3),
        },
        "db": describe(engine),
    }


def _print(result: CycleResult) -> None:
    """The regressions on stdout, one a line; the rest of the comparison on stderr."""
    comp = result.comparison
    swept = result.sweep
    err_console.print(
        f"cycle {result.cycle_id}{' (resumed)' if result.resumed else ''}: sweep {swept.sweep_id}, "
        f"{plural(swept.models, 'model')} in {result.seconds:.0f} s "
        f"(crawl {result.crawl_seconds:.1f} s, sweep {result.sweep_seconds:.0f} s, "
        f"compare {result.compare_seconds:.2f} s)",
        highlight=False,
        soft_wrap=True,
    )
    if comp is None:
        err_console.print(
            "  first cycle on this database: nothing to compare with", highlight=False
        )
        _print_drafting(result.drafting)
        return
    for r in comp.regressions:  # plain lines (rich would turn the tabs into spaces)
        reason = " ".join(r.reason.split())
        if len(reason) > REASON_CHARS:
            reason = reason[: REASON_CHARS - 3] + "..."
        typer.echo(clean(f"{r.model_id}\t{r.before} -> {r.after}\t{reason}"))
    counts = ", ".join(f"{k} {v:,}" for k, v in comp.counts.items())
    lines = [
        f"  against cycle {result.baseline_cycle} (sweep {comp.baseline_sweep}): {counts}",
        f"  regressions {len(comp.regressions)}, new passes {len(comp.new_passes)}, new to the "
        f"ranking {len(comp.new_models)} (failing {len(comp.new_failures)}), out of the ranking "
        f"{comp.dropped}, new failure fingerprints {len(comp.new_fingerprints)}",
    ]
    if comp.environment_line:
        lines.append(f"  {comp.environment_line}")
    for line in lines:
        err_console.print(escape(line), highlight=False, soft_wrap=True)
    _print_drafting(result.drafting)


def _print_drafting(drafted: Any) -> None:
    """The drafting's totals on stderr, and where each accepted draft went."""
    if drafted is None:
        return
    if not drafted.rows:
        _note(f"  drafting: {drafted.note or 'no new failure fingerprint'}")
        return
    n, budget = drafted.summary(), drafted.budget
    _note(
        f"  drafting: {plural(n['new_fingerprints'], 'new fingerprint')}: drafted {n['drafted']} "
        f"(accepted {n['accepted']}, refused {n['refused']}), not reproduced "
        f"{n['not_reproduced']}, errors {n['errors']}, skipped for budget {n['skipped_budget']}"
        f"{', skipped (endpoint) ' + str(n['skipped_endpoint']) if n['skipped_endpoint'] else ''}; "
        f"{n['attempts']} of {budget.attempts} attempts, {n['tokens']:,} of {budget.tokens:,} tokens"
    )
    for row in drafted.rows:
        if row.outcome == "accepted":
            _note(f"  accepted: {row.fingerprint} ({row.model_id}) -> {row.adapter_path}")
    if drafted.note:
        _note(f"  {drafted.note}")
