"""The HTML coverage report: one self-contained file (inline CSS and SVG charts, a few lines
of inline script that only measure the charts once laid out), readable offline."""

from __future__ import annotations

from html import escape
from typing import Any

from hfadapt.report.charts import PALETTE, bars, cumulative_chart, fmt_count, plural
from hfadapt.report.coverage import FAIL, IMPROVED, LABELS, PASS, XFAIL, Report
from hfadapt.report.html_models import (
    MODELS_CSS,
    MODELS_SCRIPT,
    blockers_section,
    evidence_section,
    models_section,
)

__all__ = ["render_html"]

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

CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; padding: 0 1rem; }
h1 { margin-bottom: 0.2rem; } h2 { margin-top: 2.2rem; border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
.sub { color: #666; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 1rem; margin: 1rem 0; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.7rem 1rem; min-width: 11rem; }
.card b { display: block; font-size: 1.6rem; }
table { border-collapse: collapse; margin: 0.6rem 0; font-size: 0.92rem; max-width: 100%; }
td { overflow-wrap: anywhere; }
th, td { border-bottom: 1px solid #eee; padding: 0.25rem 0.7rem; text-align: left; vertical-align: top; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
code { font-size: 0.85rem; }
.label { display: inline-block; padding: 0.1rem 0.5rem; border-radius: 4px; color: #fff; font-weight: 600; }
svg.chart { display: block; max-width: 100%; height: auto; }
"""

# Runs after layout: records how many charts have a real size, for tests and for the curious.
SCRIPT = """
document.addEventListener("DOMContentLoaded", function () {
  var charts = document.querySelectorAll("svg.chart"), drawn = 0;
  charts.forEach(function (svg) { var r = svg.getBoundingClientRect(); if (r.width > 50 && r.height > 20) drawn++; });
  document.body.setAttribute("data-charts", String(charts.length));
  document.body.setAttribute("data-charts-drawn", String(drawn));
  // readability: tables wider than the page column, and svg text cut at the chart's edge
  setTimeout(function () {
    var wide = 0, clipped = 0, column = document.body.clientWidth;
    document.querySelectorAll("table").forEach(function (t) { if (t.getBoundingClientRect().width > column + 1) { wide++; t.setAttribute("data-overflow", "1"); } });
    document.querySelectorAll("svg.chart").forEach(function (svg) { var box = svg.getBoundingClientRect();
      svg.querySelectorAll("text").forEach(function (t) { var r = t.getBoundingClientRect();
        if (r.width && (r.left < box.left - 1 || r.right > box.right + 1)) { clipped++; t.setAttribute("data-clipped", "1"); } }); });
    document.body.setAttribute("data-tables-overflowing", String(wide));
    document.body.setAttribute("data-labels-clipped", String(clipped));
  }, 0);
});
"""


def _pct(part: float, whole: float) -> str:
    return f"{part / whole:.1%}" if whole else "n/a"


def _table(
    head: list[str], rows: list[list[Any]], numeric: set[int] | None = None, cls: str = ""
) -> str:
    numeric = numeric or set()
    out = [f'<table class="{cls}"><thead><tr>']
    out += [
        f'<th class="{"n" if i in numeric else ""}">{escape(h)}</th>' for i, h in enumerate(head)
    ]
    out.append("</tr></thead><tbody>")
    for row in rows:
        out.append("<tr>")
        for i, cell in enumerate(row):
            text = (
                cell
                if isinstance(cell, _Raw)
                else escape(f"{cell:,}" if isinstance(cell, int) else str(cell))
            )
            out.append(f'<td class="{"n" if i in numeric else ""}">{text}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)


class _Raw(str):
    """Markup already escaped."""


def _summary(r: Report) -> str:
    cards = [
        ("models", f"{r.models:,}"),
        ("pass, own weights or config (count)", f"{_pct(r.passed, r.models)}"),
        ("pass, own weights or config (downloads)", f"{_pct(r.passed_downloads, r.downloads)}"),
        ("downloads covered", fmt_count(r.passed_downloads)),
        ("beside it: architecture passes", f"{r.passed_architecture:,}"),
    ]
    if r.sweep:
        cards.append(("structural signatures judged", f"{r.sweep.get('units') or 0:,}"))
    body = "".join(
        f'<div class="card"><span>{escape(k)}</span><b>{escape(v)}</b></div>' for k, v in cards
    )
    return f'<div class="cards" id="summary">{body}</div>'


ARCHITECTURE_COLOUR = "#f9a825"  # architecture-only passes: never part of a headline
UNKNOWN_COLOUR = PALETTE[7]


def _verdicts(r: Report) -> str:
    """Models by verdict; a pass is split by what it rests on, so the bar beside the headline
    counts what the headline counts."""
    rows: list[tuple[str, int, int, str]] = []
    for v, n, d in r.verdicts:
        if v != "pass":
            rows.append((v, n, d, VERDICT_COLOURS.get(v, PALETTE[7])))
            continue
        for label, count, downloads, colour in (
            ("pass: own weights or config", r.passed, r.passed_downloads, VERDICT_COLOURS["pass"]),
            ("pass: architecture only", r.passed_architecture, r.passed_architecture_downloads,
             ARCHITECTURE_COLOUR),
            ("pass: no evidence level", r.passed_unknown, r.passed_unknown_downloads, UNKNOWN_COLOUR),
        ):  # fmt: skip
            if count:
                rows.append((label, count, downloads, colour))
    rows.sort(key=lambda t: (-t[1], t[0]))
    return bars(
        [(v, float(n), f"{plural(n, 'model')}, {_pct(d, r.downloads)} of downloads") for v, n, d, _ in rows],
        colours=[c for *_, c in rows],
        name="verdicts",
        title="models by verdict (passes by what they rest on)",
    )  # fmt: skip


def _types(r: Report, top: int = 20) -> str:
    shown = r.by_model_type[:top]
    chart = bars(
        [(t.model_type, t.passed_downloads / t.downloads if t.downloads else 0.0,
          f"{_pct(t.passed, t.models)} own, {_pct(t.passed_architecture, t.models)} arch., "
          f"of {plural(t.models, 'model')}") for t in shown],
        scale=1.0,
        colours=[PALETTE[0]],
        beside=[t.passed_architecture_downloads / t.downloads if t.downloads else 0.0 for t in shown],
        beside_colour=ARCHITECTURE_COLOUR,
        name="model-types",
        title="pass rate by downloads, per model_type: own weights or config (green), "
        "architecture only (amber, beside it)",
    )  # fmt: skip
    legend = (
        "<p class='sub'>Bars: share of the type's downloads that pass on the models' own weights "
        "or config (green), and, beside it, architecture-only passes (amber: the type lowers; "
        "these models' shapes were not checked).</p>"
    )
    rows = [
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
    return (
        chart
        + legend
        + _table(
            [
                "model_type",
                "models",
                "pass",
                "arch. pass",
                "pass rate",
                "downloads",
                "pass rate (downloads)",
            ],
            rows,
            {1, 2, 3, 4, 5, 6},
            "types",
        )
    )


def _fingerprints(r: Report) -> str:
    if not r.fingerprints:
        return "<p>No failure fingerprints: every failing run failed before lowering, or nothing failed.</p>"
    chart = bars(
        [(f"{f.fingerprint} {f.rule_id} {f.op}", float(f.downloads), f"{plural(f.count, 'model')}, {fmt_count(f.downloads)} downloads") for f in r.fingerprints],
        colours=[PALETTE[1]],
        name="fingerprints",
        title="downloads blocked per failure fingerprint",
    )  # fmt: skip
    rows = [
        [_Raw(f"<code>{escape(f.fingerprint)}</code>"), f.rule_id, f.op, f.site, f.count, fmt_count(f.downloads), ", ".join(f.models[:3])]
        for f in r.fingerprints
    ]  # fmt: skip
    return chart + _table(
        ["fingerprint", "rule", "op", "call site", "models", "downloads", "e.g."],
        rows,
        {4, 5},
        "fingerprints",
    )


def _without_effect(r: Report) -> str:
    """Adapters recorded as applied whose rule still fired in the code they rewrite."""
    return "".join(
        f'<p class="ineffective"><strong>Adapter without effect: {escape(name)}</strong> was '
        f"applied to {models:,} model(s) ({escape(fmt_count(downloads))} downloads) whose runs "
        "still met its rule in the code it rewrites; check it with <code>hfadapt adapters "
        f"verify {escape(name)}</code>.</p>"
        for name, models, downloads in r.ineffective
    )


def _adapters(r: Report) -> str:
    if not r.adapters:
        return _without_effect(r) + "<p>No passing run applied an adapter.</p>"
    rows = [
        [a.name, a.unblocked, fmt_count(a.unblocked_downloads), _pct(a.unblocked_downloads, r.downloads),
         a.applied, fmt_count(a.applied_downloads)]
        for a in r.adapters
    ]  # fmt: skip
    text = (
        "<p><b>Unblocked</b>: passing models that failed on the device (lowering or "
        "verification) in another recorded run of the same mode without the adapter, e.g. a "
        "sweep with <code>--no-adapters</code> or an earlier sweep. <b>Applied</b>: every passing "
        "model the adapter was applied to: an adapter applies wherever its target occurs, "
        "needed or not.</p>"
    )
    return (
        _without_effect(r)
        + text
        + _table(
            [
                "adapter",
                "models it unblocked",
                "their downloads",
                "share",
                "applied, passing",
                "downloads",
            ],
            rows,
            {1, 2, 3, 4, 5},
            "adapters",
        )
    )


def _agreement(r: Report) -> str:
    a = r.agreement
    grid = _table(
        ["", "hf-adapters: supported", "hf-adapters: not supported"],
        [
            ["hfadapt: pass", a.both_yes, a.only_ours],
            ["hfadapt: not pass", a.only_theirs, a.both_no],
        ],
        {1, 2},
        "agreement",
    )
    text = (
        f"<p>Agreement on {plural(a.compared, 'model')}: {a.rate:.1%} "
        f"({a.both_yes:,} both yes, {a.both_no:,} both no, {a.only_ours:,} only hfadapt passes, "
        f"{a.only_theirs:,} only hf-adapters supports; {a.unknown:,} without a reference value).</p>"
    )
    lists = ""
    for title, models in (
        ("hfadapt passes, hf-adapters does not", a.only_ours_models),
        ("hf-adapters supports, hfadapt does not pass", a.only_theirs_models),
    ):
        if models:
            items = "".join(f"<li>{escape(m)}</li>" for m in models[:10])
            lists += f"<p>{escape(title)} (most downloaded first):</p><ul>{items}</ul>"
    return text + grid + lists


def _diff(r: Report) -> str:
    d = r.diff
    if d is None:
        return ""
    chips = " ".join(
        f'<span class="label" style="background:{LABEL_COLOURS[name]}" data-label="{name}">{name} {d.counts.get(name, 0):,}</span>' for name in LABELS
    )  # fmt: skip
    rows = [
        [
            _Raw(
                f'<span class="label" style="background:{LABEL_COLOURS[c.label]}">{c.label}</span>'
            ),
            c.model_id,
            c.before,
            c.after,
            fmt_count(c.downloads),
        ]
        for c in d.changed[:200]
    ]
    table = (
        _table(
            ["label", "model", f"sweep {d.baseline}", f"sweep {d.current}", "downloads"],
            rows,
            {4},
            "diff",
        )
        if rows
        else "<p>No model changed between pass and fail.</p>"
    )
    extra = f"<p>{plural(d.only_current, 'model')} only in sweep {d.current}, {d.only_baseline:,} only in sweep {d.baseline}.</p>"
    envs = d.environment_line()
    if envs:
        extra += f'<p class="environments"><strong>{escape(envs)}</strong></p>'
    return f'<h2 id="diff">Sweep {d.current} against sweep {d.baseline}</h2><p>{chips}</p>{extra}{table}'


def _other(r: Report) -> str:
    if not r.other_failures:
        return ""
    rows = [[v, reason, n, fmt_count(d)] for v, reason, n, d in r.other_failures]
    return "<h2>Failures without a fingerprint</h2>" + _table(
        ["verdict", "reason", "models", "downloads"], rows, {2, 3}, "other"
    )


def _translated(r: Report) -> str:
    if not r.translated:
        return ""
    rows = [[fam, n, fmt_count(d), p] for fam, n, d, p in r.translated]
    return (
        "<h2 id='translated'>Remote-code models judged as their native translation</h2>"
        "<p>No repository code ran: see docs/remote-code.md.</p>"
        + _table(["family", "models", "downloads", "pass"], rows, {1, 2, 3}, "translated")
    )


def render_html(r: Report) -> str:
    """The report as one self-contained HTML page."""
    s = r.sweep or {}
    title = f"hfadapt coverage: sweep {s['id']}" if s else "hfadapt coverage"
    sub = (
        f"{s.get('mode')} mode, {s.get('execution')}, {s.get('dtype')}; profile {s.get('profile')}; "
        f"{s.get('status')}; {plural(s.get('units') or 0, 'unit')} of work; {float(s.get('seconds') or 0):.0f} s; database {r.db}"
        if s
        else f"latest run of every model in {r.db}"
    )
    structural = (
        "<p><b>Structural mode:</b> real configs where known (config evidence), else the model_type's defaults (architecture evidence: the model's own shapes were not checked); seeded random weights, layers truncated.</p>"
        if s.get("mode") == "structural"
        else ""
    )
    body = [
        f"<h1>{escape(title)}</h1><p class='sub'>{escape(sub)}</p>{structural}",
        _summary(r),
        evidence_section(r),
        "<h2>Verdicts</h2>",
        _verdicts(r),
        "<h2 id='cumulative'>Downloads covered against rank</h2>",
        cumulative_chart(r.cumulative, title="cumulative share of downloads against rank"),
        "<h2 id='types'>Pass rate by model_type</h2>",
        _types(r),
        blockers_section(r),
        "<h2 id='fingerprints'>Top failure fingerprints</h2>",
        _fingerprints(r),
        _other(r),
        _translated(r),
        "<h2 id='adapters'>Adapter impact</h2>",
        _adapters(r),
        "<h2 id='agreement'>Agreement with hf-adapters is_supported</h2>",
        _agreement(r),
        _diff(r),
        models_section(r),
    ]
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{escape(title)}</title>"
        f"<style>{CSS}{MODELS_CSS}</style><script>{SCRIPT}{MODELS_SCRIPT}</script></head><body>{''.join(body)}</body></html>"
    )
