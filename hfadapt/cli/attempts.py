"""``hfadapt attempts``: the agent's recorded attempts, listed or one in full (prompt,
response, each validation step). Read-only: a missing database is refused, not created."""

from __future__ import annotations

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
)
from hfadapt.errors import NotFoundError


@app.command()
def attempts(
    attempt_id: Annotated[
        int | None,
        typer.Argument(
            metavar="ID",
            min=1,
            help="Show this attempt in full (default: list them).",
            show_default=False,
        ),
    ] = None,
    limit: Annotated[int, count_option("--limit", "How many attempts to list.")] = 30,
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """List the agent's attempts, or show one: prompt, response, each validation step."""
    from hfadapt.agent import records

    engine = existing_engine(db, hint="`hfadapt draft`")
    if attempt_id is None:
        _list(records.list_attempts(engine, limit), as_json)
        return
    attempt, sess = records.get_attempt(engine, attempt_id)
    if attempt is None:
        raise NotFoundError(f"no attempt {attempt_id}; see hfadapt attempts")
    if as_json:
        data = attempt.model_dump()
        data["session"] = sess.model_dump() if sess else None
        typer.echo(json.dumps(data, indent=2, default=str))
        return
    _show(attempt, sess)


def _list(rows: list[Any], as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps([_brief(a) for a in rows], indent=2, default=str))
        return
    if not rows:
        err_console.print(
            "no agent attempts recorded yet: run hfadapt draft MODEL", highlight=False
        )
        return
    table = Table(
        "id",
        "session",
        "#",
        "when",
        "fingerprint",
        "endpoint model",
        "tokens in/out",
        "latency s",
        "result",
    )
    for a in rows:
        table.add_row(
            str(a.id),
            str(a.session_id),
            str(a.number),
            str(a.created_at)[:19],
            escape(a.fingerprint),
            escape(a.endpoint_model),
            f"{a.tokens_in}/{a.tokens_out}",
            f"{a.latency_s:.2f}",
            escape(_brief(a)["result"]),
        )
    console.print(table)


def _show(attempt: Any, sess: Any) -> None:
    """One attempt in full: what was asked, each step, the feedback and the draft."""
    b = _brief(attempt)
    # A failed request's tries are in its error ("gave up after 5 tries"), so the retries
    # column (recorded for answered and failed requests alike) is shown for an answer only.
    retries = "" if attempt.error else f"; retried {attempt.retries} time(s) before the answer"
    case = sess.case if sess is not None and isinstance(sess.case, dict) else {}
    judged = f"; judged {case['execution']}" if case.get("execution") else ""
    console.print(
        escape(
            f"attempt {attempt.id} (#{attempt.number} of session {attempt.session_id}, {sess.outcome if sess else '?'}) "
            f"for {attempt.fingerprint}: {b['result']}\nendpoint {attempt.endpoint} model {attempt.endpoint_model}; "
            f"tokens {attempt.tokens_in} in / {attempt.tokens_out} out; latency {attempt.latency_s:.2f} s{retries}{judged}"
        ),
        highlight=False,
    )
    if attempt.error:
        console.print(f"[red]error:[/red] {escape(attempt.error)}", highlight=False)
    table = Table("step", "verdict", "seconds", "summary")
    steps = (
        [s for s in attempt.steps if isinstance(s, dict)] if isinstance(attempt.steps, list) else []
    )
    for s in steps:
        table.add_row(
            escape(str(s.get("step", "?"))),
            escape(str(s.get("status", "?"))),
            f"{s.get('seconds', 0):.2f}" if isinstance(s.get("seconds"), int | float) else "",
            escape(str(s.get("summary", ""))),
        )
    if steps:
        console.print(table)
    if attempt.feedback:
        console.print(
            "[bold]feedback sent back[/bold]\n" + attempt.feedback, highlight=False, markup=False
        )
    if attempt.code:
        console.print("[bold]draft[/bold]")
        console.print(attempt.code, highlight=False, markup=False)


def _brief(a: Any) -> dict[str, Any]:
    if a.accepted:
        result = "accepted"
    elif a.error:
        result = "endpoint error"
    else:
        result = f"failed at {a.failed_step}" if a.failed_step else "not accepted"
    return {
        "id": a.id,
        "session_id": a.session_id,
        "number": a.number,
        "fingerprint": a.fingerprint,
        "endpoint_model": a.endpoint_model,
        "tokens_in": a.tokens_in,
        "tokens_out": a.tokens_out,
        "latency_s": a.latency_s,
        "steps": {
            str(s.get("step")): str(s.get("status"))
            for s in (a.steps if isinstance(a.steps, list) else [])
            if isinstance(s, dict)
        },
        "result": result,
    }
