"""An online crawl fetches every kept model's config.json (bounded concurrency, the HF cache,
one retry policy) and records, for each config it cannot have, why: gated (401), missing
(404), not JSON, no model_type; a config needing custom code is kept and counted. Against the
loopback Hub (tests/support/hub_server.py)."""

from __future__ import annotations

import json
from typing import Any

from support.hub_server import FE, FakeHub, FakeModel

from hfadapt.db.engine import get_engine, session
from hfadapt.db.tables import HubModel
from hfadapt.hub.config_fetch import CONFIG_ERROR_KEY, config_error, has_shapes
from hfadapt.hub.crawl import crawl

BERT = {
    "model_type": "bert",
    "hidden_size": 312,
    "num_attention_heads": 12,
    "intermediate_size": 600,
}


def _model(model_id: str, downloads: int, config_file: bytes | None) -> FakeModel:
    files = {"model.safetensors": b""}
    if config_file is not None:
        files["config.json"] = config_file
    return FakeModel(model_id, FE, downloads, config={"model_type": "bert"}, files=files)


def test_online_crawl_fills_configs_and_says_why_not() -> None:
    models = [
        _model("acme/ok", 900, json.dumps(BERT).encode()),
        _model("acme/flaky", 800, json.dumps(BERT).encode()),
        _model("acme/gated", 700, json.dumps(BERT).encode()),
        _model("acme/no-config", 600, None),
        _model("acme/not-json", 500, b"{'model_type': bert"),
        _model("acme/no-type", 400, json.dumps({"hidden_size": 8}).encode()),
        _model("acme/custom", 300, json.dumps({**BERT, "auto_map": {"AutoModel": "m.M"}}).encode()),
    ]
    hub = FakeHub(models).start()
    try:
        hub.script("/acme/gated/resolve/", status=401, body='{"error": "gated"}',
                   headers={"X-Error-Code": "GatedRepo"}, times=10)  # fmt: skip
        hub.script("/acme/flaky/resolve/", status=503, body="busy", times=1)  # retried once
        seen: list[tuple[int, int]] = []
        engine = get_engine()
        result = crawl(
            engine, endpoint=hub.url, limit=20, config_progress=lambda d, t: seen.append((d, t))
        )
        statuses = [r[3] for r in hub.requests if "/resolve/" in r[1]]
    finally:
        hub.stop()
    fetch = result.configs
    assert fetch is not None, result
    # the 503 was answered by a retry (huggingface_hub's backoff, or ours when it gives up)
    assert statuses.count(503) == 1 and statuses.count(401) >= 1, statuses
    got = (fetch.fetched, fetch.custom_code, fetch.failed)
    assert got == (
        3,
        1,
        {"gated": ["acme/gated"], "missing": ["acme/no-config"], "no model_type": ["acme/no-type"],
         "not JSON": ["acme/not-json"]},
    ), (got, statuses)  # fmt: skip
    assert seen[-1] == (7, 7) and len(seen) == 7, seen
    assert any(
        n.startswith("configs: 3 fetched (1 need custom code); not had:") for n in result.notes
    ), result.notes
    with session(engine, write=False) as sess:
        stored = {m.id: m.config_json for m in sess.query(HubModel).all()}
    engine.dispose()
    assert stored["acme/ok"] == BERT and has_shapes(stored["acme/ok"]), stored["acme/ok"]
    reasons = {m: config_error(c) for m, c in stored.items()}
    assert reasons == {"acme/ok": None, "acme/flaky": None, "acme/gated": "gated", "acme/no-config": "missing",
                       "acme/not-json": "not JSON", "acme/no-type": "no model_type", "acme/custom": None}, reasons  # fmt: skip
    # the listing's summary stays beside the reason; a sweep never takes it for the config
    gated = stored["acme/gated"]
    assert (gated["model_type"], gated[CONFIG_ERROR_KEY]) == ("bert", "gated") and not has_shapes(
        gated
    ), gated


def test_listing_summary_is_not_a_config() -> None:
    """The Hub listing's config field holds model_type and architectures only: no shapes."""
    summary: dict[str, Any] = {"model_type": "bert", "architectures": ["BertModel"]}
    assert not has_shapes(summary) and has_shapes(BERT)
