"""The HTML report's evidence parts, as the values its template draws: pass counts per evidence
level (an ``architecture`` pass is never part of the headline), the verdicts that block models
before the device (custom_code, load_failed), and the per-model table: every model of the
scope, sortable by any column and filterable by verdict, model_type, evidence level and a text
match, each id linking to its Hub page. The rows travel as JSON inside the page and a few lines
of script draw the matching ones (10,000 rows as markup would make the page slow to open)."""

from __future__ import annotations

from dataclasses import asdict

from hfadapt.report.charts import fmt_count, plural
from hfadapt.report.coverage import Report

__all__ = ["SHOWN", "blockers_context", "evidence_context", "models_context"]

SHOWN = 200  # rows drawn at once; the filters narrow the rest

# The per-model table's columns: (row key, heading); rank and downloads are numbers.
COLUMNS = (
    ("rank", "rank"),
    ("model_id", "model"),
    ("model_type", "type"),
    ("verdict", "verdict"),
    ("evidence_level", "evidence"),
    ("downloads", "downloads"),
    ("bound_used", "bound used"),
    ("note", "what it means"),
)
COLS = ("rank", "id", "type", "verdict", "level", "dl", "bound", "note")


def evidence_context(r: Report) -> list[dict[str, object]]:
    """Pass counts per evidence level, downloads written short."""
    return [
        {
            "level": lv.level,
            "models": lv.models,
            "passed": lv.passed,
            "downloads": fmt_count(lv.downloads),
            "passed_downloads": fmt_count(lv.passed_downloads),
        }
        for lv in r.by_evidence
    ]


def blockers_context(r: Report) -> list[dict[str, object]]:
    """custom_code and load_failed, by downloads: blockers no fingerprint names."""
    return [
        {
            "verdict": b.verdict,
            "count": b.count,
            "downloads": fmt_count(b.downloads),
            "share": f"{b.share:.1%}",
            "examples": ", ".join(b.models[:3]),
        }
        for b in r.blockers
    ]


def models_context(r: Report) -> dict[str, object]:
    """Every model: rank, id (a Hub link), type, verdict, evidence, downloads, the share of its
    verdict's bounds used (hfadapt.judge.margin), what it means."""
    rows = [asdict(m) for m in r.model_rows]
    return {
        "count": plural(len(rows), "model"),
        "verdicts": sorted({m.verdict for m in r.model_rows}),
        "types": sorted({m.model_type for m in r.model_rows}),
        "levels": [lv.level for lv in r.by_evidence],
        "columns": COLUMNS,
        "cols": COLS,
        "numeric": ("rank", "downloads", "bound_used"),
        "rows": rows,
    }
