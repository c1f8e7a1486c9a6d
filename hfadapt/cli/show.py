"""``hfadapt show MODEL``: one model's latest recorded run at a glance (verdict, evidence
level, where its config came from, adapters, violations with source lines, metrics, the
environment it ran in, next step), read from runs.db without judging it again. Thin:
``hfadapt.report.card`` builds it."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape

from hfadapt.cli._app import DbOption, JsonOption, app, console, existing_engine
from hfadapt.judge.environment import summary


def _say(label: str, text: object, style: str | None = None) -> None:
    console.print(
        f"  [bold]{label}:[/bold] {escape(str(text))}", highlight=False, soft_wrap=True, style=style
    )


@app.command()
def show(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL",
            help="Hub id of the model, e.g. BAAI/bge-small-en-v1.5.",
            show_default=False,
        ),
    ],
    db: DbOption = None,
    as_json: JsonOption = False,
) -> None:
    """One model's latest verdict and what it rests on, from the database (no re-run)."""
    from hfadapt.report.card import model_card

    engine = existing_engine(db, hint="`hfadapt sweep` or `hfadapt diagnose MODEL`")
    card = model_card(engine, model)
    if as_json:
        typer.echo(json.dumps(card, indent=2, default=str))
        return
    console.print(
        f"[bold]{escape(card['model_id'])}[/bold]: [bold]{escape(card['verdict'])}[/bold] "
        f"({escape(card['evidence_level'])} evidence)",
        highlight=False,
        soft_wrap=True,
    )
    if card["pass_means"]:
        _say("means", card["pass_means"])
    _say("config", card["config_from"])
    where = (
        f"rank {card['rank']}, {card['downloads']:,} downloads" if card["rank"] else "not crawled"
    )
    page = f"; {card['hub_url']}" if card["hub_url"] else "; a local folder, not on the Hub"
    _say("model", f"{card['model_type'] or '?'}; {where}{page}")
    run = f"run {card['run_id']}" + (f" of sweep {card['sweep_id']}" if card["sweep_id"] else "")
    _say(
        "run", f"{run}; {card['mode']}, {card['dtype']}, {card['execution']}; {card['finished_at']}"
    )
    if card["shared_with"]:
        rep = card["shared_with"]
        at = f" (run {card['representative_run']})" if card["representative_run"] else ""
        _say("judged as", f"its signature {card['signature']} was judged on {rep}{at}")
    if card["reason"]:
        _say("reason", card["reason"])
    _say("adapters", ", ".join(card["adapters"]) or "none applied")
    for broken in card["adapters_ineffective"]:
        _say(
            "no effect",
            f"{broken.get('adapter')}: its rule {broken.get('rule')} still fires at "
            f"{broken.get('where')}",
        )
    if card["metrics"]:
        _say("metrics", ", ".join(f"{k} {v:.4g}" for k, v in card["metrics"].items()))
    _say("margin", card["margin"]["text"] if card["margin"] else "-")
    if card["violations"]:
        console.print(f"  [bold]violations ({len(card['violations'])}):[/bold]", highlight=False)
        for v in card["violations"]:
            line = f"[{v['rule_id']}] {v['op']}: {v['message']}"
            console.print(f"    {escape(line)}", highlight=False, soft_wrap=True)
            if v["site"]:
                code = f"  `{v['code']}`" if v["code"] else ""
                console.print(
                    f"      at {escape(v['site'])}{escape(code)}",
                    highlight=False,
                    soft_wrap=True,
                    style="dim",
                )
    if card["fallbacks"]:
        _say("cpu fallbacks", ", ".join(f"{op} x{n}" for op, n in card["fallbacks"].items()))
    _say("rested on", summary(card["versions"]))
    _say("next", card["next_step"])
