"""Every kept model's own config.json, fetched during an online crawl so that a sweep judges
each model on its own shapes (``config`` evidence) instead of its model type's defaults.

Files go through the HF cache (``hf_hub_download``), a few at a time (bounded concurrency),
with one retry policy: a connection error, a timeout, 429 or a 5xx is retried with backoff;
anything else is an answer. A config that cannot be had is recorded with why, one of
``REASONS``, beside the listing's summary (model_type, architectures):
``{..., "_hfadapt_config_error": reason, "detail": ...}``; ``config_error`` reads it, and a
sweep never takes such a record for the model's config."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hfadapt.hub.resolve import hf_cache_dir, remote_code_reason

__all__ = ["CONFIG_ERROR_KEY", "REASONS", "ConfigFetch", "config_error", "fetch_configs"]

CONFIG_ERROR_KEY = "_hfadapt_config_error"
GATED = "gated"
MISSING = "missing"
NOT_JSON = "not JSON"
NO_MODEL_TYPE = "no model_type"
CUSTOM_CODE = "custom code"
UNREACHABLE = "unreachable"
REASONS = (GATED, MISSING, NOT_JSON, NO_MODEL_TYPE, CUSTOM_CODE, UNREACHABLE)
WORKERS = 8
RETRIES = 2  # after the first try
BACKOFF = 0.5  # seconds, doubled per retry

# A config that needs remote code is kept (the sweep then records custom_code) and counted.
_SIZE_FIELDS = ("hidden_size", "d_model", "dim", "n_embd")


@dataclass
class ConfigFetch:
    """What fetching configs did: how many were had, and why the others were not."""

    fetched: int = 0
    custom_code: int = 0
    failed: dict[str, list[str]] = field(default_factory=dict)  # reason -> model ids
    retries: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        lost = ", ".join(f"{reason} {len(ids):,}" for reason, ids in self.failed.items())
        return (
            f"configs: {self.fetched:,} fetched ({self.custom_code:,} need custom code)"
            + (f"; not had: {lost}" if lost else "; every kept model has its own")
            + f" in {self.seconds:.1f} s"
        )


def config_error(config: Mapping[str, Any] | None) -> str | None:
    """The reason recorded in place of a config that could not be had, else None."""
    return config.get(CONFIG_ERROR_KEY) if isinstance(config, dict) else None


def _transient(exc: BaseException) -> bool:
    import requests
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, (requests.ConnectionError, requests.Timeout, ConnectionError, TimeoutError)):
        return True
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return isinstance(exc, HfHubHTTPError) and (status == 429 or (status or 0) >= 500)


def _classify(exc: BaseException) -> str:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        RepositoryNotFoundError,
    )

    if isinstance(exc, GatedRepoError):
        return GATED
    if isinstance(exc, (RepositoryNotFoundError, EntryNotFoundError)):
        return MISSING
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return GATED
    if status == 404:
        return MISSING
    return UNREACHABLE


def _one(model_id: str, endpoint: str, token: str | bool | None) -> tuple[dict[str, object], int]:
    """(config, or the error record; retries used) of one model."""
    from huggingface_hub import hf_hub_download

    retries = 0
    while True:
        try:
            path = hf_hub_download(
                model_id, "config.json", cache_dir=hf_cache_dir(), endpoint=endpoint, token=token
            )
            break
        except Exception as exc:
            if _transient(exc) and retries < RETRIES:
                time.sleep(BACKOFF * 2**retries)
                retries += 1
                continue
            detail = " ".join(str(exc).split())[:200]
            return {CONFIG_ERROR_KEY: _classify(exc), "detail": detail}, retries
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        return {CONFIG_ERROR_KEY: NOT_JSON, "detail": " ".join(str(exc).split())[:200]}, retries
    if not isinstance(data, dict):
        return {CONFIG_ERROR_KEY: NOT_JSON, "detail": "not a JSON object"}, retries
    if not isinstance(data.get("model_type"), str) or not data["model_type"]:
        return {CONFIG_ERROR_KEY: NO_MODEL_TYPE, "detail": "config.json has no model_type"}, retries
    return data, retries


def fetch_configs(
    records: list[Any],
    *,
    endpoint: str,
    token: str | bool | None = None,
    workers: int = WORKERS,
    progress: Callable[[int, int], None] | None = None,
) -> ConfigFetch:
    """Fetch the config.json of every kept record (``excluded_reason`` None) and set it as the
    record's ``config``; a config that cannot be had is recorded there with why (see module
    doc). ``progress(done, total)`` after each model."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    started = time.perf_counter()
    kept = [r for r in records if not r.excluded_reason]
    result = ConfigFetch()
    reasons: Counter[str] = Counter()
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hfadapt-config") as pool:
        futures = [(rec, pool.submit(_one, rec.id, endpoint, token)) for rec in kept]
        for done, (rec, future) in enumerate(futures, start=1):
            config, retries = future.result()
            result.retries += retries
            reason = config_error(config)
            if reason is not None and isinstance(rec.config, dict):
                config = {**rec.config, **config}  # keep what the listing said
            rec.config = config
            if reason is None:
                result.fetched += 1
                if remote_code_reason(config, None):
                    result.custom_code += 1
            else:
                reasons[reason] += 1
                result.failed.setdefault(reason, []).append(rec.id)
            if progress is not None:
                progress(done, len(kept))
    result.failed = dict(sorted(result.failed.items(), key=lambda kv: (-len(kv[1]), kv[0])))
    result.seconds = round(time.perf_counter() - started, 3)
    return result


def has_shapes(config: Mapping[str, Any] | None) -> bool:
    """Whether a crawled config is a model's own config.json (it names its sizes), not the
    listing's summary (model_type and architectures only)."""
    return (
        isinstance(config, dict)
        and config_error(config) is None
        and any(isinstance(config.get(k), int) for k in _SIZE_FIELDS)
    )
