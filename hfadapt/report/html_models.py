"""The HTML report's evidence parts: pass counts per evidence level (an ``architecture`` pass
is never part of the headline), the verdicts that block models before the device
(custom_code, load_failed), and the per-model table: every model of the scope, sortable by
any column and filterable by verdict, model_type, evidence level and a text match, each id
linking to its Hub page. The rows travel as JSON inside the page and a few lines of script
draw the matching ones (10,000 rows as markup would make the page slow to open)."""

from __future__ import annotations

import json
from dataclasses import asdict
from html import escape

from hfadapt.report.charts import fmt_count, plural
from hfadapt.report.coverage import Report

__all__ = ["MODELS_CSS", "MODELS_SCRIPT", "blockers_section", "evidence_section", "models_section"]

SHOWN = 200  # rows drawn at once; the filters narrow the rest

MODELS_CSS = """
.filters { display: flex; flex-wrap: wrap; gap: 0.6rem; align-items: center; margin: 0.6rem 0; }
.filters select, .filters input { font: inherit; padding: 0.15rem 0.3rem; }
table.models { table-layout: fixed; width: 100%; }
table.models th { cursor: pointer; user-select: none; white-space: nowrap; }
table.models td { overflow-wrap: anywhere; }
table.models col.rank { width: 4.5rem; } table.models col.id { width: 30%; }
table.models col.type { width: 8rem; } table.models col.verdict { width: 10rem; }
table.models col.level { width: 7rem; } table.models col.dl { width: 7rem; }
.evidence-architecture { color: #8a5a00; } .evidence-unknown { color: #777; }
"""

# Sort and filter the rows in the page; the data is the JSON in #model-rows. Every row is built
# with DOM calls (createElement, textContent, setAttribute): no markup is ever assembled from
# strings, so a model id or reason from the Hub is text wherever it lands, and a link goes only
# to an https Hub page.
MODELS_SCRIPT = """
document.addEventListener("DOMContentLoaded", function () {
  var data = document.getElementById("model-rows"); if (!data) return;
  var rows = JSON.parse(data.textContent), body = document.querySelector("table.models tbody");
  var state = {key: "rank", dir: 1}, shown = SHOWN;
  var f = {verdict: document.getElementById("f-verdict"), type: document.getElementById("f-type"),
           level: document.getElementById("f-level"), text: document.getElementById("f-text")};
  function text(v) { return v === null || v === undefined ? "" : String(v); }
  function cmp(a, b) { var x = a[state.key], y = b[state.key];
    if (x === null || x === "") return 1; if (y === null || y === "") return -1;
    return (x < y ? -1 : x > y ? 1 : 0) * state.dir; }
  function cell(tr, value, cls) { var td = document.createElement("td");
    if (cls) td.className = cls; td.textContent = text(value); tr.appendChild(td); return td; }
  function row(r) {
    var tr = document.createElement("tr");
    cell(tr, r.rank, "n");
    var id = cell(tr, "", ""), url = text(r.hub_url);
    if (url.indexOf("https://huggingface.co/") === 0) {
      var a = document.createElement("a"); a.setAttribute("href", url); a.textContent = text(r.model_id);
      id.appendChild(a);
    } else { id.textContent = text(r.model_id); }
    cell(tr, r.model_type, ""); cell(tr, r.verdict, "");
    cell(tr, r.evidence_level, "evidence-" + text(r.evidence_level).replace(/[^a-z]/g, ""));
    cell(tr, typeof r.downloads === "number" ? r.downloads.toLocaleString("en") : "", "n");
    cell(tr, r.note, "");
    return tr;
  }
  function draw() {
    var t = f.text.value.toLowerCase(), hit = rows.filter(function (r) {
      return (!f.verdict.value || r.verdict === f.verdict.value) && (!f.type.value || r.model_type === f.type.value)
        && (!f.level.value || r.evidence_level === f.level.value) && (!t || text(r.model_id).toLowerCase().indexOf(t) >= 0); });
    hit.sort(cmp);
    while (body.firstChild) body.removeChild(body.firstChild);
    hit.slice(0, shown).forEach(function (r) { body.appendChild(row(r)); });
    document.getElementById("models-count").textContent = "showing " + Math.min(shown, hit.length).toLocaleString("en") +
      " of " + hit.length.toLocaleString("en") + " matching models (" + rows.length.toLocaleString("en") + " in all)";
    document.body.setAttribute("data-models-shown", String(Math.min(shown, hit.length)));
  }
  document.querySelectorAll("table.models th[data-key]").forEach(function (th) {
    th.addEventListener("click", function () { var k = th.getAttribute("data-key");
      state.dir = state.key === k ? -state.dir : 1; state.key = k; draw(); }); });
  [f.verdict, f.type, f.level].forEach(function (s) { s.addEventListener("change", draw); });
  f.text.addEventListener("input", draw);
  draw();
});
""".replace("SHOWN", str(SHOWN))


def evidence_section(r: Report) -> str:
    """Pass counts per evidence level, and what each level means."""
    rows = "".join(
        f"<tr><td class='evidence-{escape(lv.level)}'>{escape(lv.level)}</td><td class='n'>{lv.models:,}</td>"
        f"<td class='n'>{lv.passed:,}</td><td class='n'>{fmt_count(lv.downloads)}</td>"
        f"<td class='n'>{fmt_count(lv.passed_downloads)}</td></tr>"
        for lv in r.by_evidence
    )
    table = (
        "<table class='evidence'><thead><tr><th>evidence</th><th class='n'>models</th><th class='n'>pass</th>"
        f"<th class='n'>downloads</th><th class='n'>pass downloads</th></tr></thead><tbody>{rows}</tbody></table>"
    )
    text = (
        "<p><b>weights</b>: the model's own weights ran. <b>config</b>: its own config.json "
        "(seeded weights, layers truncated). <b>architecture</b>: only its model_type's defaults, "
        "so an architecture pass means the type lowers; <i>this model's shapes were not checked</i>. "
        f"The headline counts weights and config passes only ({r.passed:,}); architecture passes "
        f"({r.passed_architecture:,}, {fmt_count(r.passed_architecture_downloads)} downloads) are beside it"
        + (
            f", as are {r.passed_unknown:,} passes with no level recorded"
            if r.passed_unknown
            else ""
        )
        + ".</p>"
    )
    return "<h2 id='evidence'>What the verdicts rest on</h2>" + text + table


def blockers_section(r: Report) -> str:
    """custom_code and load_failed, by downloads: blockers no fingerprint names."""
    if not r.blockers:
        return ""
    rows = "".join(
        f"<tr><td>{escape(b.verdict)}</td><td class='n'>{b.count:,}</td><td class='n'>{fmt_count(b.downloads)}</td>"
        f"<td class='n'>{b.share:.1%}</td><td>{escape(', '.join(b.models[:3]))}</td></tr>"
        for b in r.blockers
    )
    return (
        "<h2 id='blockers'>Blocked before the device</h2><table class='blockers'><thead><tr><th>verdict</th>"
        "<th class='n'>models</th><th class='n'>downloads</th><th class='n'>share</th><th>e.g.</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _options(values: list[str], label: str) -> str:
    opts = "".join(f"<option value='{escape(v)}'>{escape(v)}</option>" for v in values)
    return f"<option value=''>every {escape(label)}</option>{opts}"


def models_section(r: Report) -> str:
    """Every model: rank, id (a Hub link), type, verdict, evidence, downloads, what it means."""
    rows = [asdict(m) for m in r.model_rows]
    verdicts = sorted({m.verdict for m in r.model_rows})
    types = sorted({m.model_type for m in r.model_rows})
    levels = [lv.level for lv in r.by_evidence]
    # No "<", ">" or "&" in the script element at all (JSON escapes them inside strings): no
    # "</script>" or "<!--" in the data can end or bend it.
    payload = (
        json.dumps(rows, separators=(",", ":"))
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )
    filters = (
        "<div class='filters'>"
        f"<select id='f-verdict' aria-label='verdict'>{_options(verdicts, 'verdict')}</select>"
        f"<select id='f-type' aria-label='model_type'>{_options(types, 'model_type')}</select>"
        f"<select id='f-level' aria-label='evidence'>{_options(levels, 'evidence level')}</select>"
        "<input id='f-text' type='search' placeholder='model id contains' aria-label='model id'>"
        "<span id='models-count'></span></div>"
    )
    head = "".join(
        f"<th data-key='{k}' class='{'n' if k in ('rank', 'downloads') else ''}'>{t}</th>"
        for k, t in (("rank", "rank"), ("model_id", "model"), ("model_type", "type"),
                     ("verdict", "verdict"), ("evidence_level", "evidence"),
                     ("downloads", "downloads"), ("note", "what it means"))
    )  # fmt: skip
    cols = "".join(
        f"<col class='{c}'>" for c in ("rank", "id", "type", "verdict", "level", "dl", "note")
    )
    return (
        f"<h2 id='models'>Every model ({plural(len(rows), 'model')})</h2>{filters}"
        f"<table class='models'><colgroup>{cols}</colgroup><thead><tr>{head}</tr></thead><tbody></tbody></table>"
        f"<script type='application/json' id='model-rows'>{payload}</script>"
    )
