"""One row per model: what a sweep (or the latest runs) says of each model, with the evidence
level its verdict rests on. The JSON report, ``hfadapt report --csv`` and the HTML per-model
table carry these rows; ``by_evidence`` counts passes per level, so an ``architecture`` pass
(the model type's defaults: this model's shapes were not checked) is never read as a pass of
the model itself. ``latest_run`` is what ``hfadapt show`` prints. No torch on this path."""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass, fields
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.engine import Engine
from sqlmodel import col

from hfadapt.db.census import ModelRun
from hfadapt.db.engine import session
from hfadapt.db.tables import HubModel, Run
from hfadapt.judge.evidence import LEVELS, UNKNOWN, level_label, pass_note
from hfadapt.report.charts import shorten
from hfadapt.report.next_steps import plain_next_step

__all__ = [
    "HUB_URL",
    "LevelRow",
    "ModelRow",
    "by_evidence",
    "hub_url",
    "judged_model_ids",
    "latest_run",
    "latest_verdicts",
    "model_rows",
    "rows_csv",
]

HUB_URL = "https://huggingface.co/"


def hub_url(model_id: str) -> str:
    """The model's Hub page; the id percent-encoded (an id stored before crawls validated them
    may hold anything). Empty for what is not a Hub id: a run of a local folder is recorded
    under the folder's path, which has no Hub page."""
    from hfadapt.hub.resolve import looks_like_path

    if looks_like_path(model_id):
        return ""
    return HUB_URL + quote(model_id, safe="/")


@dataclass
class LevelRow:
    """Runs at one evidence level: how many, how many pass, and their downloads."""

    level: str
    models: int = 0
    passed: int = 0
    downloads: int = 0
    passed_downloads: int = 0


@dataclass
class ModelRow:
    """One model's verdict in a report's scope (the CSV columns, in this order)."""

    rank: int | None
    model_id: str
    model_type: str
    verdict: str
    evidence_level: str
    downloads: int
    note: str  # what a pass means at this level, or what to do about the failure
    hub_url: str
    run_id: int | None
    # the largest share of a verdict bound its numbers used (hfadapt.judge.margin): 0 exact,
    # 1 at a bound; None (empty in the CSV, a dash in the HTML) when no margin was recorded
    bound_used: float | None = None


def by_evidence(runs: list[ModelRun]) -> list[LevelRow]:
    """Counts per evidence level, strongest first, ``unknown`` last (only when present)."""
    rows = {level: LevelRow(level) for level in LEVELS}
    for r in runs:
        row = rows.setdefault(level_label(r.evidence_level), LevelRow(UNKNOWN))
        row.models += 1
        row.downloads += r.downloads
        if r.passed:
            row.passed += 1
            row.passed_downloads += r.downloads
    return [row for row in rows.values() if row.level in LEVELS or row.models]


def _what_to_do(r: ModelRun) -> str:
    """A failing run's next step, in plain words (``hfadapt show`` prints the same)."""
    step = plain_next_step(
        r.model_id,
        r.verdict,
        r.evidence_level,
        recorded=r.next_step,
        fingerprints=r.fingerprints,
        no_adapters=r.no_adapters,
    )
    return shorten(step, 240)


def model_rows(runs: list[ModelRun]) -> list[ModelRow]:
    """Every model of the scope, best rank first (unranked last, by downloads)."""
    ordered = sorted(runs, key=lambda r: (r.rank is None, r.rank or 0, -r.downloads, r.model_id))
    return [
        ModelRow(
            rank=r.rank,
            model_id=r.model_id,
            model_type=r.model_type,
            verdict=r.verdict,
            evidence_level=level_label(r.evidence_level),
            downloads=r.downloads,
            note=pass_note(r.evidence_level) if r.passed else _what_to_do(r),
            hub_url=hub_url(r.model_id),
            run_id=r.run_id,
            bound_used=r.bound_used,
        )
        for r in ordered
    ]


def rows_csv(rows: list[ModelRow]) -> str:
    """The rows as CSV text with a header line (what ``hfadapt report --csv`` writes)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([f.name for f in fields(ModelRow)])
    for row in rows:
        writer.writerow(["" if v is None else v for v in asdict(row).values()])
    return out.getvalue()


def latest_run(engine: Engine, model_id: str) -> tuple[Run | None, HubModel | None]:
    """The newest run of ``model_id`` (by id) and its crawled listing, either may be None.
    The id is matched exactly, then case-insensitively (Hub ids are case-insensitive)."""
    with session(engine, write=False) as sess:
        for exact in (True, False):
            cond = col(Run.model_id) == model_id if exact else col(Run.model_id).ilike(model_id)
            stmt = select(Run).where(cond).order_by(col(Run.id).desc()).limit(1)
            run = sess.execute(stmt).scalar_one_or_none()
            if run is not None:
                break
        found = run.model_id if run is not None else model_id
        hub = sess.get(HubModel, found)
        for obj in (run, hub):
            if obj is not None:
                sess.expunge(obj)
        return run, hub


def judged_model_ids(engine: Engine) -> list[str]:
    """Every model id the database holds a run of: what ``hfadapt show`` can show."""
    with session(engine, write=False) as sess:
        return list(sess.execute(select(col(Run.model_id)).distinct()).scalars())


def latest_verdicts(engine: Engine, model_ids: list[str]) -> dict[str, tuple[str, str]]:
    """model id -> (verdict, evidence level) of its newest run, for the ids that have one."""
    out: dict[str, tuple[str, str]] = {}
    if not model_ids:
        return out
    stmt = (
        select(col(Run.model_id), col(Run.verdict), col(Run.evidence_level))
        .where(col(Run.model_id).in_(model_ids))
        .order_by(col(Run.id))
    )
    with session(engine, write=False) as sess:
        for model_id, verdict, level in sess.execute(stmt):
            out[model_id] = (verdict, level_label(level))
    return out
