"""The crawler: ranks the most-downloaded embedding models (the Hub through ``HfApi``, or the
bundled snapshot offline), prefilters them and stores the ranking in runs.db. (``fetch_config``,
a model's config.json without its weights, lives in hfadapt.hub.configs and is re-exported here.)

Online or offline, decided once per crawl:

* ``offline=True``; or ``HF_HUB_OFFLINE=1`` unless an endpoint was asked for: the bundled snapshot.
* ``offline=False``, an ``endpoint`` or ``api`` argument, or ``HF_ENDPOINT`` set: that Hub,
  and a Hub that cannot be reached or answers garbage is an error (you asked for it; with
  HF_HUB_OFFLINE also set, the error says so).
* otherwise (the default): the Hub at huggingface.co if a quick probe reaches it, else the
  bundled snapshot, and the result says why (``CrawlResult.fallback``).

Ids: a listing entry whose id is not a Hub model id (hfadapt.hub.ids; a mirror or a lying
endpoint could send anything) is refused, counted (``CrawlResult.refused``) and never stored.

Retries: every request of ``HfApi.list_models`` is retried by huggingface_hub on 429 and 5xx
(up to 5 times, exponential backoff capped at 8 s, honouring ``Retry-After``); a crawl that
still fails is recorded as failed and changes nothing stored.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hfadapt import settings
from hfadapt.errors import HubError, UsageError
from hfadapt.hub import catalog, prefilter
from hfadapt.hub.catalog import HubRecord
from hfadapt.hub.client import env_offline, hub_error, make_api, probe
from hfadapt.hub.config_fetch import ConfigFetch, fetch_configs
from hfadapt.hub.configs import fetch_config, known_model_types
from hfadapt.hub.ids import invalid_model_id
from hfadapt.hub.snapshot import SNAPSHOT_SOURCE, SnapshotModel, read_snapshot

if TYPE_CHECKING:
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import ExpandModelProperty_T, ModelInfo
    from sqlalchemy.engine import Engine

DEFAULT_LIMIT = 10_000
EMBEDDING_PIPELINE_TAGS = ("feature-extraction", "sentence-similarity")
EXPAND: list[ExpandModelProperty_T] = [
    "config",
    "downloads",
    "likes",
    "library_name",
    "safetensors",
    "sha",
    "tags",
    "gated",
    "pipeline_tag",
    "createdAt",
    "siblings",
]
SNAPSHOT = "snapshot"

__all__ = [
    "EMBEDDING_PIPELINE_TAGS",
    "CrawlResult",
    "crawl",
    "fetch_config",
    "known_model_types",
    "list_hub_models",
    "record_from_info",
    "record_from_snapshot",
    "snapshot_records",
]


@dataclass(slots=True)
class CrawlResult:
    """What a crawl did: counts, where it read from, how long it took, and notes for the user."""

    crawl_id: int
    source: str  # "snapshot" or the endpoint URL
    seen: int
    kept: int
    excluded: dict[str, int]
    seconds: float
    fallback: str | None = None  # why the snapshot was read instead of the Hub
    notes: list[str] = field(default_factory=list)
    configs: ConfigFetch | None = None  # online: each kept model's config.json, or why not
    refused: int = 0  # listing entries whose id is not a Hub model id: not stored


# ---- listings -> records ----------------------------------------------------------------------


def record_from_snapshot(row: SnapshotModel) -> HubRecord:
    return HubRecord(
        id=row.model_id,
        downloads=row.downloads,
        likes=row.likes,
        model_type=row.model_type,
        architectures=row.architectures,
        config_class=row.config_class,
        num_parameters=row.parameters,
        parameters_exact=row.parameters is not None and not row.parameters_from_name,
        library=row.library,
        is_gated=row.is_gated,
        is_moe=row.is_moe,  # hf-adapters judged it with the tags we do not have offline
        is_multimodal=row.is_multimodal,
        is_custom_code=row.is_custom_code,
        reference_supported=row.is_supported,
        year=row.year,
    )


def snapshot_records(limit: int | None = None) -> list[HubRecord]:
    """The bundled snapshot as records, best first, prefiltered."""
    records = [record_from_snapshot(row) for row in read_snapshot()[:limit]]
    prefilter.apply(records)
    return records


_SIZE_TOKEN = re.compile(r"^(\d+(?:\.\d+)?)([mb])$")


def _params_from_name(model_id: str) -> int | None:
    # hf-adapters' fallback: a single size token in the id ("7b", "335m").
    sizes = [m for t in re.split(r"[^a-z0-9.]+", model_id.lower()) if (m := _SIZE_TOKEN.match(t))]
    if len(sizes) != 1:
        return None
    number, unit = sizes[0].groups()
    return int(float(number) * (1_000_000_000 if unit == "b" else 1_000_000))


def _int_field(value: object, name: str, missing: Counter[str]) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        missing[name] += 1
        return 0
    return int(value)


def record_from_info(info: ModelInfo, missing: Counter[str] | None = None) -> HubRecord:
    """A record from one ``HfApi.list_models`` entry; absent fields are counted in ``missing``."""
    missing = missing if missing is not None else Counter()
    config = info.config if isinstance(info.config, dict) else None
    if config is None:
        missing["config"] += 1
    tags = [str(t) for t in info.tags] if isinstance(info.tags, list) else None
    if tags is None:
        missing["tags"] += 1
    model_type = config.get("model_type") if config else None
    model_type = model_type if isinstance(model_type, str) and model_type else None
    raw_archs = config.get("architectures") if config else None
    archs = tuple(a for a in raw_archs if isinstance(a, str)) if isinstance(raw_archs, list) else ()
    total = getattr(info.safetensors, "total", None) if info.safetensors else None
    exact = isinstance(total, int) and total > 0
    params = total if exact else _params_from_name(info.id)
    files = tuple(s.rfilename for s in info.siblings) if info.siblings is not None else None
    return HubRecord(
        id=info.id,
        downloads=_int_field(info.downloads, "downloads", missing),
        likes=_int_field(info.likes, "likes", missing),
        model_type=model_type,
        architectures=archs,
        config_class=known_model_types().get(model_type) if model_type else None,
        num_parameters=params,
        parameters_exact=exact,
        library=info.library_name if isinstance(info.library_name, str) else None,
        pipeline_tag=info.pipeline_tag,
        is_gated=bool(info.gated),
        is_multimodal=prefilter.is_multimodal(model_type, archs, tags),
        is_custom_code="custom_code" in (tags or ()) or bool(config and config.get("auto_map")),
        revision=info.sha,
        config=config,
        tags=tags,
        files=files,
        year=info.created_at.year if info.created_at else None,
    )


def list_hub_models(
    api: HfApi,
    *,
    limit: int = DEFAULT_LIMIT,
    pipeline_tags: Iterable[str] = EMBEDDING_PIPELINE_TAGS,
    missing: Counter[str] | None = None,
    refused: Counter[str] | None = None,
) -> list[HubRecord]:
    """The top ``limit`` models of all ``pipeline_tags`` merged, deduplicated, most downloads
    first. Entries whose id is not a Hub model id are left out and counted in ``refused``
    (reason -> entries)."""
    by_id: dict[str, HubRecord] = {}
    missing = missing if missing is not None else Counter()
    refused = refused if refused is not None else Counter()
    for tag in pipeline_tags:
        what = f"the {tag} listing"
        count = 0
        try:
            listing = api.list_models(
                pipeline_tag=tag, sort="downloads", limit=limit, expand=EXPAND
            )
            for info in listing:
                count += 1
                why = invalid_model_id(info.id)
                if why:
                    refused[why] += 1
                    continue
                rec = record_from_info(info, missing)
                known = by_id.get(rec.id)
                if known is None or rec.downloads > known.downloads:
                    by_id[rec.id] = rec
        except Exception as exc:
            if isinstance(exc, KeyError):
                what = f"{what} (after {count} models)"
            raise hub_error(exc, api.endpoint, what) from exc
    return sorted(by_id.values(), key=lambda r: (-r.downloads, r.id))[:limit]


# ---- the crawl --------------------------------------------------------------------------------


def _notes(ranked: list[HubRecord], missing: Counter[str], refused: Counter[str]) -> list[str]:
    notes = []
    if refused:
        total = sum(refused.values())
        why = "; ".join(f"{reason} ({n})" for reason, n in refused.most_common(3))
        notes.append(
            f"refused {total} listing entr{'y' if total == 1 else 'ies'} whose id is not a Hub "
            f"model id ({why}); not stored"
        )
    if missing:
        fields = ", ".join(f"{name}: {n}" for name, n in missing.most_common())
        notes.append(
            f"some listing entries lacked fields ({fields}); stored with defaults (0 / none)"
        )
    known = known_model_types()
    unknown = Counter(r.model_type for r in ranked if r.model_type and r.model_type not in known)
    if unknown:
        shown = ", ".join(f"{t} ({n})" for t, n in unknown.most_common(8))
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        models = sum(unknown.values())
        notes.append(
            f"{models} model{'s' if models != 1 else ''} of {len(unknown)} model_type{'s' if len(unknown) != 1 else ''} "
            f"this transformers does not know: {shown}{more}; kept: they need custom code or a newer transformers"
        )
    return notes


def crawl(
    engine: Engine | None = None,
    *,
    limit: int = DEFAULT_LIMIT,
    offline: bool | None = None,
    endpoint: str | None = None,
    api: HfApi | None = None,
    token: str | bool | None = None,
    configs: bool = True,
    config_progress: Callable[[int, int], None] | None = None,
) -> CrawlResult:
    """Rank the top ``limit`` embedding models, prefilter them and store them (see module doc).
    From the Hub, ``configs`` also fetches every kept model's config.json
    (hfadapt.hub.config_fetch), stored with the listing; ``config_progress(done, total)``."""
    from hfadapt.db.engine import get_engine

    if limit < 1:
        raise UsageError(f"limit must be at least 1 (got {limit})")
    if offline and (endpoint or api is not None):
        raise UsageError(
            "offline=True reads the bundled snapshot; it cannot be combined with endpoint or api"
        )
    started = time.perf_counter()
    engine = engine if engine is not None else get_engine()

    asked = offline is False or endpoint is not None or api is not None
    explicit = asked or settings.hub_endpoint() is not None
    use_snapshot = bool(offline) or (offline is None and not asked and env_offline())
    fallback = None
    if not use_snapshot:
        if api is None:
            api = make_api(endpoint, token)
        try:
            probe(api.endpoint, token=api.token)
        except HubError as exc:
            if explicit:
                raise
            use_snapshot, fallback = True, exc.one_line()

    missing: Counter[str] = Counter()
    refused: Counter[str] = Counter()
    fetched: ConfigFetch | None = None
    source = SNAPSHOT if use_snapshot or api is None else api.endpoint
    crawl_id = catalog.start_crawl(engine, source=source, limit=limit)
    try:
        if use_snapshot or api is None:
            ranked = snapshot_records(limit)
        else:
            ranked = list_hub_models(api, limit=limit, missing=missing, refused=refused)
            prefilter.apply(ranked)
            if configs:
                fetched = fetch_configs(
                    ranked, endpoint=api.endpoint, token=api.token, progress=config_progress
                )
        stored = catalog.save_crawl(engine, crawl_id, ranked, source=source)
    except BaseException as exc:
        message = exc.one_line() if isinstance(exc, HubError) else f"{type(exc).__name__}: {exc}"
        catalog.fail_crawl(engine, crawl_id, message)
        raise

    notes = _notes(ranked, missing, refused)
    if fetched is not None:
        notes.append(fetched.summary())
    if fallback:
        notes.insert(0, f"{fallback}; crawled the bundled snapshot ({SNAPSHOT_SOURCE}) instead")
    return CrawlResult(
        crawl_id=crawl_id,
        source=source,
        seen=stored.seen,
        kept=stored.kept,
        excluded=dict(
            Counter(r.excluded_reason for r in ranked if r.excluded_reason).most_common()
        ),
        seconds=time.perf_counter() - started,
        fallback=fallback,
        notes=notes,
        configs=fetched,
        refused=sum(refused.values()),
    )
