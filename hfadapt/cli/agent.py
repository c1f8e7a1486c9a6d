"""``hfadapt draft`` and ``hfadapt agent-eval``: the adapter-drafting agent from the command
line (``hfadapt attempts`` is in attempts.py). Thin: parse, call hfadapt.agent, render."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from hfadapt.cli._app import (
    DbOption,
    JsonOption,
    ProfileOption,
    WithoutAdapterOption,
    app,
    console,
    count_option,
    err_console,
    existing_engine,
    left_out,
    writing_engine,
)
from hfadapt.cli._files import check_output, write_output
from hfadapt.errors import UsageError
from hfadapt.options import Execution, Mode
from hfadapt.report.charts import plural

if TYPE_CHECKING:
    from hfadapt.agent.client import AgentSettings
    from hfadapt.agent.evaluate import EvalReport
    from hfadapt.agent.loop import DraftOutcome
    from hfadapt.agent.suite import SuiteCase
    from hfadapt.db.census import FailureFingerprint

BaseUrlOption = Annotated[
    str | None,
    typer.Option(
        "--base-url",
        help="OpenAI-compatible endpoint (default: $OPENAI_BASE_URL).",
        show_default=False,
    ),
]
AgentModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Model name at the endpoint (default: $HFADAPT_AGENT_MODEL).",
        show_default=False,
    ),
]
ApiKeyOption = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        help="API key (default: $OPENAI_API_KEY). Never stored or logged.",
        show_default=False,
    ),
]
AttemptsOption = Annotated[int, count_option("--max-attempts", "Drafts per failure.")]
UnsafeOption = Annotated[
    bool,
    typer.Option(
        "--unsafe-no-isolation",
        help="Run drafted code without the bubblewrap sandbox when it cannot be had (recorded).",
    ),
]


def _settings(
    base_url: str | None, model: str | None, api_key: str | None, attempts: int
) -> AgentSettings:
    from hfadapt.agent.client import AgentSettings

    return AgentSettings.from_env(
        model=model, base_url=base_url, api_key=api_key, max_attempts=attempts
    )


def _outcome_table(outcomes: list[DraftOutcome]) -> Table:
    table = Table(
        "fingerprint", "case", "outcome", "attempts", "tokens in/out", "seconds", "adapter / reason"
    )
    for o in outcomes:
        colour = "green" if o.accepted else "red"
        table.add_row(
            escape(o.case.fingerprint),
            escape(o.case.name),
            f"[{colour}]{o.outcome}[/{colour}]",
            str(len(o.attempts)),
            f"{o.tokens_in}/{o.tokens_out}",
            f"{o.seconds:.1f}",
            escape(str(o.adapter_path) if o.adapter_path else o.reason),
        )
    return table


@app.command()
def draft(
    model_ref: Annotated[
        str | None,
        typer.Argument(metavar="MODEL", help="Diagnose this model, then draft for its failures."),
    ] = None,
    fingerprint: Annotated[
        str | None,
        typer.Option(
            "--fingerprint",
            metavar="ID",
            help="Draft for one recorded failure fingerprint (a prefix will do).",
            show_default=False,
        ),
    ] = None,
    top: Annotated[
        int | None,
        count_option(
            "--top", "Draft for the K fingerprints blocking the most downloads.", show_default=False
        ),
    ] = None,
    list_only: Annotated[
        bool, typer.Option("--list", help="With --top: list the fingerprints, draft nothing.")
    ] = False,
    base_url: BaseUrlOption = None,
    agent_model: AgentModelOption = None,
    api_key: ApiKeyOption = None,
    max_attempts: AttemptsOption = 4,
    mode: Annotated[
        Mode | None,
        typer.Option(
            "--mode",
            help="full: real weights; structural: random weights (default: full for MODEL; "
            "for --top/--fingerprint, the mode each model's fingerprints were recorded in).",
            show_default=False,
        ),
    ] = None,
    compile_: Annotated[
        bool | None,
        typer.Option(
            "--compile/--eager",
            help="Diagnose and prove on the device compiled (torch.compile with the spyre "
            "backend, as `diagnose` does by default) or as eager ops (default: --compile for "
            "MODEL; for --top/--fingerprint, the execution each model's fingerprints were "
            "recorded in).",
            show_default=False,
        ),
    ] = None,
    no_adapters: Annotated[
        bool,
        typer.Option(
            "--no-adapters", help="Draft against the stock model, without registry adapters."
        ),
    ] = False,
    without_adapter: WithoutAdapterOption = None,
    profile: ProfileOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
    unsafe_no_isolation: UnsafeOption = False,
) -> None:
    """Have a coding agent draft adapters for failures; accept only proven ones (written to
    $HFADAPT_HOME/adapters). Exits 1 unless every failure drafted for was fixed."""
    from hfadapt.agent import workflows

    if sum(x is not None for x in (model_ref, fingerprint, top)) != 1:
        raise UsageError("give exactly one of MODEL, --fingerprint ID or --top K")
    without = left_out(no_adapters, without_adapter)
    if list_only and top is None:
        raise UsageError("--list lists the fingerprints --top K would draft for: pass --top K")
    if top is not None and list_only:  # read only: nothing created or written
        engine = existing_engine(db, hint="`hfadapt sweep`")
        _print_top(workflows.top_fingerprints(engine, top), as_json)
        return
    from hfadapt.isolation import require_isolation

    require_isolation(unsafe=unsafe_no_isolation)  # one line, exit 3, before any work
    # a missing MODEL and a missing endpoint: exit 2, both in one line
    settings = _ready(model_ref, base_url, agent_model, api_key, max_attempts)
    engine = writing_engine(db)
    from hfadapt.agent.options import DraftOptions
    from hfadapt.judge.options import JudgeOptions

    execution = None if compile_ is None else Execution.COMPILE if compile_ else Execution.EAGER
    judging = JudgeOptions(
        Mode.FULL,
        Execution.COMPILE,
        profile=profile,
        adapters=not no_adapters,
        without_adapters=without,
        localize=False,
    )
    targets = workflows.plan_drafts(
        engine,
        judging,
        model=model_ref,
        fingerprint=fingerprint,
        top=top,
        mode=mode,
        execution=execution,
    )
    from hfadapt.agent.client import AgentClient
    from hfadapt.agent.records import Recorder

    client = AgentClient(settings)
    client.check()  # one cheap request: a dead endpoint stops the run before any model work
    from hfadapt.adapters.registry import user_adapters_dir

    home = user_adapters_dir()
    _note(
        f"accepted drafts are written to {home} ($HFADAPT_HOME/adapters) and apply to every "
        "later model there"
    )
    outcomes = workflows.draft_targets(
        targets,
        client,
        DraftOptions(unsafe_no_isolation=unsafe_no_isolation),
        recorder=Recorder(engine, settings.secrets()),
        db=engine,
        note=_note if not as_json else _note_unless_drafting,
    )
    if as_json:
        typer.echo(json.dumps([o.to_dict() for o in outcomes], indent=2, default=str))
    elif outcomes:
        console.print(_outcome_table(outcomes))
    if outcomes:
        _note(_closing(outcomes, home))
    if not all(o.accepted for o in outcomes):  # exit 1 unless every failure drafted for was fixed
        raise typer.Exit(1)


def _ready(
    model_ref: str | None,
    base_url: str | None,
    agent_model: str | None,
    api_key: str | None,
    attempts: int,
) -> Any:
    """The agent settings, once MODEL and the endpoint are both known to be there; what is
    wrong with either is said in one message, before any work (the endpoint is asked only
    when the model is missing too: otherwise ``draft`` asks it next, before any model work)."""
    from hfadapt.cli.diagnose import check_model_ref
    from hfadapt.errors import AgentError, HfadaptError, InputError

    problems: list[HfadaptError] = []
    if model_ref is not None:
        try:
            check_model_ref(model_ref)
        except InputError as exc:
            problems.append(exc)
    settings = None
    try:
        settings = _settings(base_url, agent_model, api_key, attempts)
    except UsageError as exc:
        problems.append(exc)
    if problems and settings is not None:
        from hfadapt.agent.client import AgentClient

        try:
            AgentClient(settings).check()
        except AgentError as exc:
            problems.append(exc)
    if len(problems) == 1:
        raise problems[0]
    if problems:  # the raw texts keep their parameter markers: the flags are named
        raise UsageError("; ".join(str(p.args[0]) for p in problems))
    return settings


def _closing(outcomes: list[DraftOutcome], home: Path) -> str:
    """How many failures were fixed, where the accepted drafts are, and how to undo them."""
    fixed = [o for o in outcomes if o.accepted]
    text = f"{len(fixed)} of {plural(len(outcomes), 'failure')} fixed"
    if fixed:
        names = ", ".join(o.adapter_path.name for o in fixed if o.adapter_path)
        ids = " ".join(f"--session {o.session_id}" for o in fixed if o.session_id is not None)
        text += (
            f"; accepted drafts written to {home}: {names} (list: hfadapt adapters list {ids}; "
            f"undo: hfadapt adapters remove {ids})"
        )
    return text


def _note(text: str) -> None:
    err_console.print(escape(text), highlight=False, soft_wrap=True)


def _note_unless_drafting(text: str) -> None:
    """With --json, the per-case "drafting for ..." lines are left out (as they always were)."""
    if not text.startswith("drafting for "):
        _note(text)


def _print_top(entries: list[FailureFingerprint], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps([e.to_dict() for e in entries], indent=2, default=str))
        return
    table = Table("fingerprint", "downloads blocked", "models", "rule", "op", "where")
    for e in entries:
        v = e.violation or {}
        loc = v.get("location") or {}
        where = (
            f"{loc.get('file', '')}:{loc.get('qualname') or loc.get('function', '')}" if loc else ""
        )
        table.add_row(
            escape(e.fingerprint),
            f"{e.downloads:,}",
            str(len(e.models)),
            escape(str(v.get("rule_id", ""))),
            escape(str(v.get("op", ""))),
            escape(where),
        )
    console.print(table)


@app.command("agent-eval")
def agent_eval(
    base_url: BaseUrlOption = None,
    agent_model: AgentModelOption = None,
    api_key: ApiKeyOption = None,
    max_attempts: AttemptsOption = 3,
    case: Annotated[
        list[str] | None,
        typer.Option(
            "--case",
            metavar="NAME",
            help="Run only this case (repeatable; --list-cases shows them).",
            show_default=False,
        ),
    ] = None,
    list_cases: Annotated[
        bool, typer.Option("--list-cases", help="List the suite's cases and run nothing.")
    ] = False,
    reference: Annotated[
        bool,
        typer.Option(
            "--reference",
            help="Run each case's reference answer through the whole pipeline instead of an "
            "endpoint: accepted or the step that refused, with the numbers. Exits 1 unless all are.",
        ),
    ] = False,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", metavar="PATH", help="Also write the JSON report here.", show_default=False
        ),
    ] = None,
    profile: ProfileOption = None,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """Measure an endpoint's skill on the suite of failure cases: per case accepted, attempts,
    tokens and a score; the prompts never state a case's solution."""
    from hfadapt.agent.client import AgentSettings
    from hfadapt.agent.evaluate import run_eval
    from hfadapt.agent.records import Recorder
    from hfadapt.agent.suite import PENDING, SUITE

    check_output(output, "--output")  # before any endpoint token is spent
    if list_cases:
        if as_json:
            typer.echo(json.dumps([_case_brief(c) for c in SUITE], indent=2))
            return
        table = Table("case", "rule", "what it asks for")
        for c in SUITE:
            brief = _case_brief(c)
            table.add_row(
                escape(brief["case"]), escape(brief["rule"]), escape(brief["description"])
            )
        console.print(table)
        for c in PENDING:
            _note(f"pending: {c.name}: {c.pending}")
        return
    if reference:
        settings = AgentSettings(model=agent_model or "reference", max_attempts=max_attempts)
    else:
        settings = _settings(base_url, agent_model, api_key, max_attempts)
    engine = writing_engine(db)
    report = run_eval(
        settings,
        names=case or (),
        reference=reference,
        recorder=Recorder(engine, settings.secrets()),
        profile=profile,
    )
    data = report.to_dict()
    if output is not None:
        write_output(output, json.dumps(data, indent=2, default=str) + "\n", "--output")
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        _print_eval(report, data, reference, output)
    if reference and data["accepted"] < data["total"]:  # a reference that fails is a bug
        raise typer.Exit(1)


def _print_eval(
    report: EvalReport, data: dict[str, Any], reference: bool, output: Path | None
) -> None:
    console.print(_eval_table(report.rows, reference))
    who = (
        "the reference solutions (self-check, no endpoint)"
        if reference
        else f"endpoint {report.endpoint}, model {report.model}"
    )
    console.print(
        f"{escape(who)}: accepted {data['accepted']}/{data['total']} "
        f"({100 * report.acceptance_rate:.0f}%), score {data['score']:.2f}, "
        f"{plural(data['attempts'], 'attempt')}, "
        f"{data['tokens_in']} tokens in / {data['tokens_out']} out, {data['seconds']:.1f} s",
        highlight=False,
    )
    for r in report.rows:
        if r.get("pending"):
            _note(f"pending (not scored): {r['case']}: {r['pending']}")
        if r.get("solution_in_prompt"):
            _note(f"the prompt of {r['case']} states its solution: ...{r['solution_in_prompt']}...")
    if output is not None:
        err_console.print(f"JSON report: {escape(str(output))}", highlight=False, soft_wrap=True)


def _eval_table(rows: list[dict[str, Any]], reference: bool) -> Table:
    """One row per case: outcome, score, attempts, tokens, and the step that refused or the
    numbers of the accepted draft (rel error at equivalence, module and end-to-end cosines)."""
    table = Table(pad_edge=False)
    table.add_column("case", overflow="fold", ratio=2, min_width=12)
    table.add_column("outcome", overflow="fold", min_width=8)
    table.add_column("score", justify="right", no_wrap=True)
    if not reference:
        table.add_column("attempts", justify="right", no_wrap=True)
        table.add_column("tokens in/out", justify="right", no_wrap=True)
    table.add_column("seconds", justify="right", no_wrap=True)
    table.add_column("refused at / numbers", overflow="fold", ratio=3, min_width=12)
    for r in rows:
        colour = "green" if r["outcome"] == "accepted" else "red"
        if r.get("pending"):
            colour = "yellow"
        cells = [escape(r["case"]), f"[{colour}]{escape(r['outcome'])}[/{colour}]"]
        cells.append(f"{r['score']:.2f}")
        if not reference:
            cells += [str(r["attempts"]), f"{r['tokens_in']}/{r['tokens_out']}"]
        cells += [f"{r['seconds']:.1f}", escape(_verdict_text(r))]
        table.add_row(*cells)
    return table


def _verdict_text(row: dict[str, Any]) -> str:
    """The step that refused (with the reason), or the accepted draft's numbers."""
    if row["outcome"] != "accepted":
        where = f"{row['refused_at']}: " if row.get("refused_at") else ""
        return where + str(row.get("reason") or "")
    n = row.get("numbers") or {}
    parts = [
        f"rel err {n['equivalence_max_rel_err']:.2g}"
        if n.get("equivalence_max_rel_err") is not None
        else "",
        f"module cos {n['module_min_cosine']:.4f}"
        if n.get("module_min_cosine") is not None
        else "",
        f"device cos {n['device_min_token_cosine']:.4f} (without {n['baseline_min_token_cosine']:.4f})"
        if n.get("device_min_token_cosine") is not None
        and n.get("baseline_min_token_cosine") is not None
        else "",
    ]
    steps = row["steps"][-1] if row.get("steps") else {}
    return "; ".join([_steps_text(steps), *(p for p in parts if p)])


def _steps_text(steps: dict[str, str]) -> str:
    """A last attempt's steps in a few words: "all 5 steps pass", or the ones that did not."""
    if not steps:
        return ""
    bad = [f"{step}: {status}" for step, status in steps.items() if status != "pass"]
    return ", ".join(bad) if bad else f"all {len(steps)} steps pass"


def _case_brief(case: SuiteCase) -> dict[str, str]:
    return {"case": case.name, "rule": case.rule_id, "description": case.description}
