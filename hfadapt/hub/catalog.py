"""The crawled Hub listing in runs.db: one record type for a listed model, the bulk write of a
crawl, and the queries over the current ranking (top models, census by model_type)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, case, func, null, update
from sqlalchemy import select as sa_select
from sqlalchemy.engine import Connection, Engine
from sqlmodel import col, select

from hfadapt.db.engine import session
from hfadapt.db.tables import Crawl, CrawlEntry, HubModel, utcnow


@dataclass(slots=True)
class HubRecord:
    """One model as a listing (the Hub, or the bundled snapshot) describes it."""

    id: str
    downloads: int = 0
    likes: int = 0
    model_type: str | None = None
    architectures: tuple[str, ...] = ()
    config_class: str | None = None
    num_parameters: int | None = None
    parameters_exact: bool = False  # counted from the weights, not read off the repo name
    library: str | None = None
    pipeline_tag: str | None = None
    is_gated: bool = False
    is_moe: bool | None = None  # None: judged by the prefilter from type, architectures and tags
    is_multimodal: bool = False
    is_custom_code: bool = False
    revision: str | None = None
    config: dict[str, Any] | None = None
    tags: list[str] | None = None
    files: tuple[str, ...] | None = None  # repo files when the listing included them
    reference_supported: bool | None = None
    year: int | None = None
    excluded_reason: str | None = None


@dataclass(slots=True)
class CensusRow:
    model_type: str  # "(none)" for models without a usable config
    models: int
    kept: int
    downloads: int
    share: float  # of all downloads in the current ranking, 0..1


@dataclass(slots=True)
class Census:
    rows: list[CensusRow]
    models: int
    kept: int
    downloads: int
    crawl: Crawl | None = None


# Columns a crawl always overwrites; the others keep their stored value when a listing lacks
# them (the snapshot has no config or tags: re-crawling it must not erase what the Hub gave).
_ALWAYS = (
    "rank",
    "downloads",
    "likes",
    "excluded_reason",
    "is_gated",
    "is_moe",
    "is_multimodal",
    "is_custom_code",
    "source",
    "last_crawl_id",
    "crawled_at",
)
_JSON_COLUMNS = ("config_json", "tags")


def _row(rec: HubRecord, rank: int, source: str, crawl_id: int, now: object) -> dict[str, object]:
    return {
        "id": rec.id,
        "rank": rank,
        "downloads": rec.downloads,
        "likes": rec.likes,
        "model_type": rec.model_type,
        "architectures": ",".join(rec.architectures) or None,
        "config_class": rec.config_class,
        "num_parameters": rec.num_parameters,
        "library": rec.library,
        "pipeline_tag": rec.pipeline_tag,
        "is_gated": rec.is_gated,
        "is_moe": bool(rec.is_moe),
        "is_multimodal": rec.is_multimodal,
        "is_custom_code": rec.is_custom_code,
        "revision": rec.revision,
        "config_json": rec.config,
        "tags": rec.tags,
        "excluded_reason": rec.excluded_reason,
        "reference_supported": rec.reference_supported,
        "year": rec.year,
        "source": source,
        "last_crawl_id": crawl_id,
        "crawled_at": now,
    }


def _upsert(conn: Connection, table: Table, rows: list[dict[str, object]]) -> None:
    if conn.dialect.name != "sqlite":
        _upsert_portable(conn, table, rows)
        return
    from sqlalchemy.dialects.sqlite import insert

    stmt = insert(table)
    new = stmt.excluded
    values: dict[str, Any] = {}
    for column in table.columns:
        if column.name == "id":
            continue
        if column.name in _ALWAYS:
            values[column.name] = new[column.name]
        elif column.name in _JSON_COLUMNS:
            # JSON None is stored as the text 'null', which is not SQL NULL: treat both as missing.
            values[column.name] = func.coalesce(func.nullif(new[column.name], "null"), column)
        else:
            values[column.name] = func.coalesce(new[column.name], column)
    conn.execute(stmt.on_conflict_do_update(index_elements=["id"], set_=values), rows)


def _upsert_portable(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """The same merge for any database: read the stored rows, merge in Python, replace them."""
    chunk = 500
    for start in range(0, len(rows), chunk):
        part = rows[start : start + chunk]
        ids = [r["id"] for r in part]
        found = conn.execute(table.select().where(table.c.id.in_(ids))).mappings()
        stored: dict[str, dict[str, Any]] = {r["id"]: dict(r) for r in found}
        merged = []
        for row in part:
            old = stored.get(row["id"], {})
            merged.append(
                {k: v if k in _ALWAYS or v is not None else old.get(k) for k, v in row.items()}
            )
        conn.execute(table.delete().where(table.c.id.in_(ids)))
        conn.execute(table.insert(), merged)


def start_crawl(engine: Engine, *, source: str, limit: int | None) -> int:
    """Record a crawl as running (so a failed one leaves a trace) and return its id."""
    with session(engine) as sess:
        crawl = Crawl(source=source, limit=limit)
        sess.add(crawl)
        sess.flush()
        assert crawl.id is not None
        return crawl.id


def fail_crawl(engine: Engine, crawl_id: int, error: str) -> None:
    with session(engine) as sess:
        crawl = sess.get(Crawl, crawl_id)
        if crawl is not None:
            crawl.status, crawl.error, crawl.finished_at = "failed", error, utcnow()


def save_crawl(engine: Engine, crawl_id: int, ranked: list[HubRecord], *, source: str) -> Crawl:
    """Store a finished crawl in one transaction: upsert every model at its rank, one crawl_entry
    each, clear the rank of models this crawl did not see, mark the crawl done."""
    now = utcnow()
    rows = [_row(rec, rank, source, crawl_id, now) for rank, rec in enumerate(ranked, start=1)]
    entries = [
        {
            "crawl_id": crawl_id,
            "model_id": r["id"],
            "rank": r["rank"],
            "downloads": r["downloads"],
            "excluded_reason": r["excluded_reason"],
        }
        for r in rows
    ]
    hub: Table = HubModel.__table__  # type: ignore[attr-defined]
    crawls: Table = Crawl.__table__  # type: ignore[attr-defined]
    with engine.begin() as conn:
        if rows:
            _upsert(conn, hub, rows)
            conn.execute(CrawlEntry.__table__.insert(), entries)  # type: ignore[attr-defined]
        conn.execute(
            update(hub)
            .where((hub.c.last_crawl_id != crawl_id) | (hub.c.last_crawl_id.is_(None)))
            .values(rank=null())
        )
        excluded = sum(1 for r in rows if r["excluded_reason"])
        conn.execute(
            update(crawls)
            .where(crawls.c.id == crawl_id)
            .values(
                status="done",
                finished_at=utcnow(),
                seen=len(rows),
                kept=len(rows) - excluded,
                excluded=excluded,
            )
        )
    with session(engine, write=False) as sess:
        crawl = sess.get(Crawl, crawl_id)
        assert crawl is not None
        return crawl


def latest_crawl(engine: Engine) -> Crawl | None:
    """The newest finished crawl (the one the current ranking comes from), or None."""
    with session(engine, write=False) as sess:
        stmt = select(Crawl).where(Crawl.status == "done").order_by(col(Crawl.id).desc()).limit(1)
        return sess.exec(stmt).first()


def current_models(
    engine: Engine,
    *,
    top: int | None = None,
    model_type: str | None = None,
    library: str | None = None,
    include_excluded: bool = False,
) -> list[HubModel]:
    """Models of the current ranking, best first; excluded ones only when asked."""
    stmt = select(HubModel).where(col(HubModel.rank).is_not(None))
    if not include_excluded:
        stmt = stmt.where(col(HubModel.excluded_reason).is_(None))
    if model_type is not None:
        stmt = stmt.where(HubModel.model_type == model_type)
    if library is not None:
        stmt = stmt.where(HubModel.library == library)
    stmt = stmt.order_by(col(HubModel.rank))
    if top is not None:
        stmt = stmt.limit(top)
    with session(engine, write=False) as sess:
        return list(sess.exec(stmt).all())


def census(engine: Engine, top: int | None = None) -> Census:
    """Models and share of downloads per model_type over the current ranking (excluded ones
    included, with how many were kept), most downloads first; ``top``: only the first rows
    (the totals still count every model_type)."""
    hub: Table = HubModel.__table__  # type: ignore[attr-defined]
    kept_expr = func.sum(case((hub.c.excluded_reason.is_(None), 1), else_=0))
    stmt = (
        sa_select(
            hub.c.model_type, func.count(), kept_expr, func.coalesce(func.sum(hub.c.downloads), 0)
        )
        .where(hub.c.rank.is_not(None))
        .group_by(hub.c.model_type)
    )
    with session(engine, write=False) as sess:
        grouped = [(t, int(n), int(k or 0), int(d)) for t, n, k, d in sess.execute(stmt)]
    total_downloads = sum(d for *_, d in grouped)
    rows = [
        CensusRow(
            model_type=t if t else "(none)",
            models=n,
            kept=k,
            downloads=d,
            share=d / total_downloads if total_downloads else 0.0,
        )
        for t, n, k, d in grouped
    ]
    rows.sort(key=lambda r: (-r.downloads, -r.models, r.model_type))
    return Census(
        rows=rows[:top] if top is not None else rows,
        models=sum(r.models for r in rows),
        kept=sum(r.kept for r in rows),
        downloads=total_downloads,
        crawl=latest_crawl(engine),
    )
