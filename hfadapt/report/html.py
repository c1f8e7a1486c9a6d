"""The HTML coverage report: one self-contained file (inline CSS and SVG charts, a few lines
of inline script that only measure the charts once laid out), readable offline. Rendered with
Jinja2 from ``templates/`` with autoescaping on: every model id, reason, label and adapter name
is text wherever it lands; this module only gathers the values."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from hfadapt.report.charts import (
    PALETTE,
    BarChart,
    bars,
    cumulative_chart,
    fmt_count,
    plural,
)
from hfadapt.report.coverage import FAIL, IMPROVED, LABELS, PASS, TYPE_COLUMNS, XFAIL, Report
from hfadapt.report.html_models import (
    SHOWN,
    blockers_context,
    evidence_context,
    models_context,
)

__all__ = ["render_html"]

TEMPLATES = Path(__file__).parent / "templates"

VERDICT_COLOURS = {
    "pass": PALETTE[0],
    "lowering_failed": PALETTE[1],
    "verification_failed": PALETTE[2],
    "unsupported_model": PALETTE[3],
    "load_failed": PALETTE[6],
    "reference_failed": PALETTE[5],
    "custom_code": PALETTE[4],
    "skipped": PALETTE[7],
    "worker_crashed": "#ad1457",
    "worker_timeout": "#f9a825",
}
LABEL_COLOURS = {PASS: PALETTE[0], XFAIL: PALETTE[7], FAIL: PALETTE[1], IMPROVED: PALETTE[4]}
ARCHITECTURE_COLOUR = "#f9a825"  # architecture-only passes: never part of a headline
UNKNOWN_COLOUR = PALETTE[7]


@dataclass(frozen=True)
class Code:
    """A table cell shown as code."""

    text: str


@dataclass(frozen=True)
class Chip:
    """A table cell shown as a coloured label."""

    text: str
    colour: str


@cache
def _env() -> Environment:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,  # every template: the page, its charts, its CSS and script
        undefined=StrictUndefined,  # a value the template names but was not given: an error
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["thousands"] = lambda value: f"{value:,}"
    env.tests["code"] = lambda value: isinstance(value, Code)
    env.tests["chip"] = lambda value: isinstance(value, Chip)
    return env


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "n/a"


def _table(head: list[str], rows: list[list[object]], numeric: set[int]) -> dict[str, Any]:
    return {"head": head, "rows": rows, "numeric": numeric}


def _cards(r: Report) -> list[tuple[str, str]]:
    cards = [
        ("models", f"{r.models:,}"),
        ("pass, own weights or config (count)", f"{_pct(r.passed, r.models)}"),
        ("pass, own weights or config (downloads)", f"{_pct(r.passed_downloads, r.downloads)}"),
        ("downloads covered", fmt_count(r.passed_downloads)),
        ("beside it: architecture passes", f"{r.passed_architecture:,}"),
    ]
    if r.sweep:
        cards.append(("structural signatures judged", f"{r.sweep.get('units') or 0:,}"))
    return cards


def _verdicts(r: Report) -> BarChart:
    """Models by verdict; a pass is split by what it rests on, so the bar beside the headline
    counts what the headline counts."""
    rows: list[tuple[str, int, int, str]] = []
    for v, n, d in r.verdicts:
        if v != "pass":
            rows.append((v, n, d, VERDICT_COLOURS.get(v, PALETTE[7])))
            continue
        for label, count, downloads, colour in (
            ("pass: own weights or config", r.passed, r.passed_downloads, VERDICT_COLOURS["pass"]),
            (
                "pass: architecture only",
                r.passed_architecture,
                r.passed_architecture_downloads,
                ARCHITECTURE_COLOUR,
            ),
            (
                "pass: no evidence level",
                r.passed_unknown,
                r.passed_unknown_downloads,
                UNKNOWN_COLOUR,
            ),
        ):
            if count:
                rows.append((label, count, downloads, colour))
    rows.sort(key=lambda t: (-t[1], t[0]))
    return bars(
        [
            (v, float(n), f"{plural(n, 'model')}, {_pct(d, r.downloads)} of downloads")
            for v, n, d, _ in rows
        ],
        colours=[c for *_, c in rows],
        name="verdicts",
        title="models by verdict (passes by what they rest on)",
    )


def _types(r: Report, top: int = 20) -> dict[str, object]:
    shown = r.by_model_type[:top]
    chart = bars(
        [
            (
                t.model_type,
                t.passed_downloads / t.downloads if t.downloads else 0.0,
                f"{_pct(t.passed, t.models)} own, {_pct(t.passed_architecture, t.models)} arch., "
                f"of {plural(t.models, 'model')}",
            )
            for t in shown
        ],
        scale=1.0,
        colours=[PALETTE[0]],
        beside=[
            t.passed_architecture_downloads / t.downloads if t.downloads else 0.0 for t in shown
        ],
        beside_colour=ARCHITECTURE_COLOUR,
        name="model-types",
        title="pass rate by downloads, per model_type: own weights or config (green), "
        "architecture only (amber, beside it)",
    )
    rows: list[list[Any]] = [
        [
            t.model_type,
            t.models,
            t.passed,
            t.passed_architecture,
            _pct(t.passed, t.models),
            fmt_count(t.downloads),
            _pct(t.passed_downloads, t.downloads),
        ]
        for t in r.by_model_type[:40]
    ]
    rest = r.by_model_type[40:]
    if rest:
        n, p, pa, d, pd = (
            sum(getattr(t, a) for t in rest)
            for a in ("models", "passed", "passed_architecture", "downloads", "passed_downloads")
        )
        rows.append([f"{len(rest)} other types", n, p, pa, _pct(p, n), fmt_count(d), _pct(pd, d)])
    return {"chart": chart, **_table(list(TYPE_COLUMNS), rows, {1, 2, 3, 4, 5, 6})}


def _fingerprints(r: Report) -> dict[str, object] | None:
    if not r.fingerprints:
        return None
    chart = bars(
        [
            (
                f"{f.fingerprint} {f.rule_id} {f.op}",
                float(f.downloads),
                f"{plural(f.count, 'model')}, {fmt_count(f.downloads)} downloads",
            )
            for f in r.fingerprints
        ],
        colours=[PALETTE[1]],
        name="fingerprints",
        title="downloads blocked per failure fingerprint",
    )
    rows: list[list[Any]] = [
        [
            Code(f.fingerprint),
            f.rule_id,
            f.op,
            f.site,
            f.count,
            fmt_count(f.downloads),
            ", ".join(f.models[:3]),
        ]
        for f in r.fingerprints
    ]
    head = ["fingerprint", "rule", "op", "call site", "models", "downloads", "e.g."]
    return {"chart": chart, **_table(head, rows, {4, 5})}


def _adapters(r: Report) -> dict[str, object] | None:
    if not r.adapters:
        return None
    rows: list[list[Any]] = [
        [
            a.name,
            a.unblocked,
            fmt_count(a.unblocked_downloads),
            _pct(a.unblocked_downloads, r.downloads),
            a.applied,
            fmt_count(a.applied_downloads),
        ]
        for a in r.adapters
    ]
    head = [
        "adapter",
        "models it unblocked",
        "their downloads",
        "share",
        "applied, passing",
        "downloads",
    ]
    return _table(head, rows, {1, 2, 3, 4, 5})


def _agreement(r: Report) -> dict[str, object]:
    a = r.agreement
    text = (
        f"Agreement on {plural(a.compared, 'model')}: {a.rate:.1%} "
        f"({a.both_yes:,} both yes, {a.both_no:,} both no, {a.only_ours:,} only hfadapt passes, "
        f"{a.only_theirs:,} only hf-adapters supports; {a.unknown:,} without a reference value)."
    )
    lists = [
        (heading, models[:10])
        for heading, models in (
            ("hfadapt passes, hf-adapters does not", a.only_ours_models),
            ("hf-adapters supports, hfadapt does not pass", a.only_theirs_models),
        )
        if models
    ]
    rows: list[list[Any]] = [
        ["hfadapt: pass", a.both_yes, a.only_ours],
        ["hfadapt: not pass", a.only_theirs, a.both_no],
    ]
    head = ["", "hf-adapters: supported", "hf-adapters: not supported"]
    return {"text": text, "lists": lists, **_table(head, rows, {1, 2})}


def _diff(r: Report) -> dict[str, object] | None:
    d = r.diff
    if d is None:
        return None
    chips = [
        {"text": name, "colour": LABEL_COLOURS[name], "count": d.counts.get(name, 0)}
        for name in LABELS
    ]
    rows: list[list[Any]] = [
        [
            Chip(c.label, LABEL_COLOURS[c.label]),
            c.model_id,
            c.before,
            c.after,
            fmt_count(c.downloads),
        ]
        for c in d.changed[:200]
    ]
    head = ["label", "model", f"sweep {d.baseline}", f"sweep {d.current}", "downloads"]
    return {
        "current": d.current,
        "baseline": d.baseline,
        "chips": chips,
        "only_current": plural(d.only_current, "model"),
        "only_baseline": d.only_baseline,
        "environments": d.environment_line(),
        **_table(head, rows, {4}),
    }


def _other(r: Report) -> dict[str, object] | None:
    if not r.other_failures:
        return None
    rows: list[list[Any]] = [[v, reason, n, fmt_count(d)] for v, reason, n, d in r.other_failures]
    return _table(["verdict", "reason", "models", "downloads"], rows, {2, 3})


def _translated(r: Report) -> dict[str, object] | None:
    if not r.translated:
        return None
    rows: list[list[Any]] = [[fam, n, fmt_count(d), p] for fam, n, d, p in r.translated]
    return _table(["family", "models", "downloads", "pass"], rows, {1, 2, 3})


def _heading(r: Report) -> tuple[str, str]:
    s = r.sweep or {}
    if not s:
        return "hfadapt coverage", f"latest run of every model in {r.db}"
    title = f"hfadapt coverage: sweep {s['id']}"
    sub = (
        f"{s.get('mode')} mode, {s.get('execution')}, {s.get('dtype')}; profile {s.get('profile')}; "
        f"{s.get('status')}; {plural(s.get('units') or 0, 'unit')} of work; "
        f"{float(s.get('seconds') or 0):.0f} s; database {r.db}"
    )
    return title, sub


def render_html(r: Report) -> str:
    """The report as one self-contained HTML page."""
    title, sub = _heading(r)
    values = {
        "r": r,
        "title": title,
        "sub": sub,
        "shown": SHOWN,
        "structural": (r.sweep or {}).get("mode") == "structural",
        "cards": _cards(r),
        "evidence": evidence_context(r),
        "architecture_downloads": fmt_count(r.passed_architecture_downloads),
        "verdict_chart": _verdicts(r),
        "cumulative": cumulative_chart(
            r.cumulative, title="cumulative share of downloads against rank"
        ),
        "types": _types(r),
        "blockers": blockers_context(r),
        "fingerprints": _fingerprints(r),
        "other": _other(r),
        "translated": _translated(r),
        "ineffective": [(name, n, fmt_count(d)) for name, n, d in r.ineffective],
        "adapters": _adapters(r),
        "agreement": _agreement(r),
        "diff": _diff(r),
        "models": models_context(r),
    }
    return _env().get_template("report.html.j2").render(values)
