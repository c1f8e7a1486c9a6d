"""The crawler: the bundled snapshot offline, the real HfApi against a loopback Hub online
(pagination, dedup, prefilter, retries), bad answers as one clear line with nothing stored
lost, and config.json without weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func
from sqlalchemy.engine import Engine
from sqlmodel import select
from support.hub_server import EXPECTED_EXCLUDED, FE, SS, FakeHub, FakeModel, refused_url

import hfadapt.hub.client as hubclient
from hfadapt.db.engine import get_engine, session
from hfadapt.db.tables import Crawl, CrawlEntry, HubModel
from hfadapt.errors import ConfigError, HubResponseError, HubUnreachableError, ModelNotFoundError
from hfadapt.hub.catalog import census, current_models
from hfadapt.hub.crawl import crawl, fetch_config

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SNAPSHOT_EXCLUDED = {"onnx_gguf_mlx_only": 74, "moe": 13, "adapter_only": 6}


@pytest.fixture
def engine() -> Engine:
    return get_engine()


def _state(engine: Engine) -> dict[str, Any]:
    """Everything a failed crawl must leave as it was."""
    with session(engine, write=False) as sess:
        models = {
            m.id: (m.rank, m.downloads, m.excluded_reason) for m in sess.exec(select(HubModel))
        }
        entries = sess.exec(select(func.count()).select_from(CrawlEntry)).one()
    return {"models": models, "entries": entries}


def _crawls(engine: Engine) -> list[Crawl]:
    with session(engine, write=False) as sess:
        return list(sess.exec(select(Crawl).order_by(Crawl.id)))


# ---- offline: the bundled snapshot ----------------------------------------------------------


def test_offline_crawl_stores_the_bundled_10000_in_seconds(engine: Engine) -> None:
    result = crawl(engine, offline=True)
    assert (result.seen, result.kept, result.source) == (10_000, 9_907, "snapshot"), result
    assert result.excluded == SNAPSHOT_EXCLUDED, result.excluded
    with session(engine, write=False) as sess:
        ranks = sess.exec(select(HubModel.rank).order_by(HubModel.rank)).all()
        first = sess.exec(select(HubModel).where(HubModel.rank == 1)).one()
    assert ranks == list(range(1, 10_001)), f"ranks {ranks[:3]}..{ranks[-3:]}"
    assert (first.id, first.model_type, first.config_class, first.reference_supported) == (
        MINILM,
        "bert",
        "BertConfig",
        True,
    )
    assert any("does not know: new (239), ILKT (191)" in n for n in result.notes), result.notes


def test_census_of_the_snapshot_matches_the_csv(engine: Engine) -> None:
    crawl(engine, offline=True)
    result = census(engine)
    rows = {r.model_type: r for r in result.rows}
    assert (result.models, result.downloads) == (10_000, 418_117_860), (
        result.models,
        result.downloads,
    )
    for kind, models, share in (
        ("bert", 3198, 71.4),
        ("xlm-roberta", 1855, 9.6),
        ("mpnet", 529, 6.7),
        ("(none)", 55, 0.6),
    ):
        measured = 100 * rows[kind].share
        assert rows[kind].models == models, f"{kind}: {rows[kind].models} models, expected {models}"
        assert abs(measured - share) < 0.05, (
            f"{kind}: {measured:.2f}% of downloads, expected {share}%"
        )
    assert result.rows[0].model_type == "bert" and rows["nomic_bert"].kept == 66, rows["nomic_bert"]


def test_recrawl_updates_ranks_and_keeps_history(engine: Engine) -> None:
    crawl(engine, offline=True, limit=100)
    crawl(engine, offline=True)
    small = crawl(engine, offline=True, limit=50)
    with session(engine, write=False) as sess:
        stored = sess.exec(select(func.count()).select_from(HubModel)).one()
        ranked = sess.exec(
            select(func.count()).select_from(HubModel).where(HubModel.rank.is_not(None))
        ).one()  # type: ignore[union-attr]
        per_crawl = sess.exec(
            select(CrawlEntry.crawl_id, func.count()).group_by(CrawlEntry.crawl_id)
        ).all()
    assert stored == 10_000, f"{stored} models stored: a smaller crawl must not drop any"
    assert ranked == 50, f"{ranked} models ranked after a 50-model crawl"
    assert sorted(n for _, n in per_crawl) == [50, 100, 10_000], per_crawl
    assert [c.status for c in _crawls(engine)] == ["done"] * 3
    kept = current_models(engine)
    assert len(kept) == small.kept and max(m.rank or 0 for m in kept) <= 50, [m.rank for m in kept]


def test_hub_offline_env_reads_the_snapshot(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hubclient, "DEFAULT_ENDPOINT", refused_url())
    result = crawl(engine, limit=10)
    assert (result.source, result.seen, result.fallback) == ("snapshot", 10, None), result


def test_unreachable_default_hub_falls_back_to_the_snapshot(
    engine: Engine, online: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hubclient, "DEFAULT_ENDPOINT", refused_url())
    result = crawl(engine, limit=20)
    assert (result.source, result.seen) == ("snapshot", 20), result
    assert result.fallback and result.fallback.startswith("cannot reach http://127.0.0.1:"), (
        result.fallback
    )
    assert "crawled the bundled snapshot" in result.notes[0], result.notes


# ---- online: the real HfApi against the loopback Hub ----------------------------------------


def test_online_crawl_pages_merges_and_prefilters(
    engine: Engine, fake_hub: FakeHub, hub_api: Any
) -> None:
    result = crawl(engine, api=hub_api)
    expected_seen = len(fake_hub.models)
    assert (result.seen, result.source) == (expected_seen, fake_hub.url), result
    assert result.excluded == EXPECTED_EXCLUDED, result.excluded
    assert result.kept == expected_seen - sum(EXPECTED_EXCLUDED.values())
    for tag in (FE, SS):
        listed = sum(
            1 for m in fake_hub.models.values() if m.pipeline_tag == tag or tag in m.also_in
        )
        pages = len(fake_hub.listing_requests(tag))
        assert pages == -(-listed // fake_hub.page_size), (
            f"{tag}: {pages} pages for {listed} models"
        )
    with session(engine, write=False) as sess:
        rows = sess.exec(select(HubModel).order_by(HubModel.rank)).all()
    downloads = [r.downloads for r in rows]
    assert downloads == sorted(downloads, reverse=True), "ranking is not by downloads"
    assert sum(r.id == "acme/both-listings" for r in rows) == 1, (
        "a model in both listings was stored twice"
    )
    reasons = {r.id: r.excluded_reason for r in rows if r.excluded_reason}
    assert (
        reasons["acme/tiny-web-embedder"] == "onnx_gguf_mlx_only"
        and reasons["acme/giant-embed"] == "over_60b"
    )
    first = next(r for r in rows if r.id == "org0/embed-000")
    assert (first.model_type, first.config_class, first.num_parameters, first.library) == (
        "bert", "BertConfig", 22_000_000, "sentence-transformers"
    )  # fmt: skip
    assert (
        first.revision
        and first.tags
        # the model's own config.json, fetched beside the listing (hfadapt.hub.config_fetch)
        and first.config_json == {"model_type": "bert", "hidden_size": 384}
    )
    custom = next(r for r in rows if r.id == "acme/custom-embed")
    assert custom.is_custom_code and custom.excluded_reason is None


def test_online_limit_stops_paging_early(engine: Engine, fake_hub: FakeHub, hub_api: Any) -> None:
    result = crawl(engine, api=hub_api, limit=25)
    assert result.seen == 25, result
    top = sorted(fake_hub.models.values(), key=lambda m: -m.downloads)[:25]
    assert [m.id for m in current_models(engine, include_excluded=True)] == [m.id for m in top]
    requests = len(fake_hub.listing_requests())
    assert requests == 2, f"{requests} listing requests for 25 models (one page per tag expected)"


def test_online_then_offline_keeps_what_only_the_hub_gave(
    engine: Engine, fake_hub: FakeHub, hub_api: Any
) -> None:
    cfg = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 384}
    fake_hub.add(FakeModel(MINILM, SS, 10**9, config=cfg, files={"model.safetensors": b""}))
    crawl(engine, api=hub_api)
    crawl(engine, offline=True)
    with session(engine, write=False) as sess:
        row = sess.get(HubModel, MINILM)
    assert row is not None and (row.rank, row.source, row.downloads) == (1, "snapshot", 167_480_843)
    # its config.json is not on this Hub: the listing's summary is kept, with why
    assert row.config_json == {
        **cfg,
        "_hfadapt_config_error": "missing",
        "detail": row.config_json["detail"],
    }
    assert row.tags and row.revision, "the snapshot crawl erased Hub-only fields"


@pytest.mark.parametrize("status", [429, 503])
def test_rate_limit_or_server_error_then_success(
    engine: Engine, fake_hub: FakeHub, hub_api: Any, status: int, sleeps: list[float]
) -> None:
    fake_hub.script(
        "/api/models", status=status, headers={"Retry-After": "0"}, query_has=f"pipeline_tag={FE}"
    )
    result = crawl(engine, api=hub_api, configs=False)  # the listing's retry alone
    assert result.seen == len(fake_hub.models), result
    statuses = [r[3] for r in fake_hub.listing_requests(FE)]
    assert statuses[:2] == [status, 200], f"listing statuses {statuses}"
    assert sum(sleeps) <= 1, f"waited {sleeps} s before the retry; Retry-After said 0"


def test_endpoint_down_is_one_line_and_loses_nothing(
    engine: Engine, online: None, sleeps: list[float]
) -> None:
    crawl(engine, offline=True, limit=30)
    before = _state(engine)
    url = refused_url()
    with pytest.raises(HubUnreachableError) as exc:
        crawl(engine, endpoint=url)
    message = exc.value.one_line()
    assert message.startswith(f"cannot reach {url} (") and "offline" in message, message
    assert str(exc.value) == message, "message spans lines"
    assert sum(sleeps) == 0, f"slept {sleeps} s on a refused connection instead of failing"
    assert _state(engine) == before


@pytest.mark.parametrize(
    ("body", "query_has", "expected"),
    [
        ("<html><body>Sign in to the Wi-Fi</body></html>", None, "answered GET /api/models with something that is not JSON (starting '<html><body>Sign in"),
        ('{"id": ', "cursor=", "answered the feature-extraction listing with something that is not JSON (starting '{\"id\":')"),
        ('{"error": "moved"}', "pipeline_tag=", "gave an answer to the feature-extraction listing that is not a Hub model listing"),
    ],
)  # fmt: skip
def test_garbage_answers_are_one_line_and_lose_nothing(
    engine: Engine, fake_hub: FakeHub, hub_api: Any, body: str, query_has: str | None, expected: str
) -> None:
    crawl(engine, offline=True, limit=30)
    before = _state(engine)
    fake_hub.script("/api/models", body=body, query_has=query_has)
    with pytest.raises(HubResponseError) as exc:
        crawl(engine, api=hub_api)
    assert expected in exc.value.one_line(), exc.value.one_line()
    assert exc.value.one_line().startswith(fake_hub.url)
    assert _state(engine) == before
    crawls = _crawls(engine)
    if query_has is not None:  # failed during the listing: recorded as a failed crawl
        assert (crawls[-1].status, crawls[-1].error) == ("failed", exc.value.one_line())


def test_listing_entries_with_missing_fields_are_stored_with_defaults(
    engine: Engine, fake_hub: FakeHub, hub_api: Any
) -> None:
    cfg = {"model_type": "bert", "architectures": ["BertModel"]}
    fake_hub.add(
        FakeModel("gap/no-downloads", FE, 5_000_000, config=cfg, drop=frozenset({"downloads"})),
        FakeModel(
            "gap/no-config", FE, 5_000_001, config=cfg, drop=frozenset({"config", "safetensors"})
        ),
        FakeModel(
            "gap/no-tags-likes", SS, 5_000_002, config=cfg, drop=frozenset({"tags", "likes"})
        ),
    )
    result = crawl(engine, api=hub_api)
    note = next(n for n in result.notes if n.startswith("some listing entries lacked fields"))
    for piece in ("downloads: 1", "config: 1", "tags: 1", "likes: 1", "stored with defaults"):
        assert piece in note, note
    with session(engine, write=False) as sess:
        no_dl, no_cfg = sess.get(HubModel, "gap/no-downloads"), sess.get(HubModel, "gap/no-config")
    assert no_dl is not None and (no_dl.downloads, no_dl.model_type) == (0, "bert")
    assert no_cfg is not None and (
        no_cfg.model_type,
        (no_cfg.config_json or {}).get("_hfadapt_config_error"),
        no_cfg.excluded_reason,
    ) == (None, "missing", None), no_cfg.config_json


def test_listing_entry_without_id_is_one_line_and_loses_nothing(
    engine: Engine, fake_hub: FakeHub, hub_api: Any
) -> None:
    crawl(engine, offline=True, limit=30)
    before = _state(engine)
    fake_hub.add(FakeModel("gap/no-id", FE, 500_000, drop=frozenset({"id"})))
    with pytest.raises(HubResponseError) as exc:
        crawl(engine, api=hub_api)
    listed_before = sum(
        1 for m in fake_hub.models.values() if m.pipeline_tag == FE and m.downloads > 500_000
    )
    message = exc.value.one_line()
    assert message == (
        f"{fake_hub.url} listed a model without 'id' in the feature-extraction listing "
        f"(after {listed_before} models): not a Hub API answer"
    ), message
    assert _state(engine) == before


def test_unknown_model_type_is_kept_and_named(
    engine: Engine, fake_hub: FakeHub, hub_api: Any
) -> None:
    fake_hub.add(
        FakeModel(
            "odd/frob",
            SS,
            2_000_000,
            config={"model_type": "frobnicator", "architectures": ["FrobModel"]},
        )
    )
    result = crawl(engine, api=hub_api)
    note = next(n for n in result.notes if "does not know" in n)
    assert note.startswith("2 models of 2 model_types this transformers does not know:"), note
    assert "frobnicator (1)" in note and "kept: they need custom code" in note, note
    with session(engine, write=False) as sess:
        row = sess.get(HubModel, "odd/frob")
    assert row is not None and (
        row.rank,
        row.model_type,
        row.config_class,
        row.excluded_reason,
    ) == (1, "frobnicator", None, None)


def test_hub_errors_after_retries_are_one_line() -> None:
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    response = httpx2.Response(429, request=httpx2.Request("GET", "http://hub.test/api/models"))
    error = hubclient.hub_error(
        HfHubHTTPError("429", response=response),
        "http://hub.test",
        "the feature-extraction listing",
    )
    assert isinstance(error, HubResponseError)
    assert error.one_line() == (
        "http://hub.test kept answering 429 Too Many Requests to the feature-extraction listing after retries: "
        "wait and crawl again, or set HF_TOKEN"
    )


def test_model_info_against_the_loopback_hub(fake_hub: FakeHub, hub_api: Any) -> None:
    info = hub_api.model_info("org1/embed-001")
    assert info.sha == fake_hub.models["org1/embed-001"].sha
    assert sorted(s.rfilename for s in info.siblings) == [
        "config.json",
        "model.safetensors",
        "modules.json",
    ]


# ---- config.json without weights ------------------------------------------------------------


def test_fetch_config_downloads_only_the_config(
    fake_hub: FakeHub, hub_api: Any, isolated_state: Path
) -> None:
    config = fetch_config("org1/embed-001", api=hub_api)
    assert config == {"model_type": "xlm-roberta", "hidden_size": 384}
    fetched = {r[1].rsplit("/", 1)[-1] for r in fake_hub.requests if "/resolve/" in r[1]}
    assert fetched == {"config.json"}, f"files requested: {fetched}"
    cached = list((isolated_state / "hub").rglob("config.json"))
    assert len(cached) == 1, f"config.json in the HF cache: {cached}"
    fake_hub.stop()
    assert fetch_config("org1/embed-001", offline=True) == config  # from the cache now


def test_fetch_config_errors_are_typed(fake_hub: FakeHub, hub_api: Any) -> None:
    fake_hub.add(FakeModel("bad/json", files={"config.json": b"{not json"}))
    with pytest.raises(
        ModelNotFoundError, match=r"^nobody/none is not a model on http://127\.0\.0\.1:\d+"
    ):
        fetch_config("nobody/none", api=hub_api)
    with pytest.raises(ConfigError, match=r"^acme/embed-lora has no config.json$"):
        fetch_config("acme/embed-lora", api=hub_api)
    with pytest.raises(ConfigError, match=r"^config.json of bad/json is not readable JSON"):
        fetch_config("bad/json", api=hub_api)


def test_fetch_config_falls_back_to_the_bundled_configs(online: None) -> None:
    down = refused_url()
    bundled = fetch_config(MINILM, endpoint=down)
    assert (bundled["model_type"], bundled["hidden_size"], bundled["num_hidden_layers"]) == (
        "bert",
        384,
        6,
    )
    assert fetch_config(MINILM, offline=True) == bundled
    with pytest.raises(HubUnreachableError) as exc:
        fetch_config("x/not-bundled", endpoint=down)
    message = exc.value.one_line()
    assert message.startswith(f"cannot get config.json of x/not-bundled: cannot reach {down} ("), (
        message
    )
    assert message.endswith("it is not in the HF cache nor bundled with hfadapt"), message
    with pytest.raises(ConfigError, match=r"^no config.json for x/not-bundled offline"):
        fetch_config("x/not-bundled", offline=True)


def test_crawl_result_is_json_serialisable(engine: Engine) -> None:
    import dataclasses

    result = crawl(engine, offline=True, limit=5)
    assert json.loads(json.dumps(dataclasses.asdict(result)))["seen"] == 5


def test_portable_upsert_merges_like_the_sqlite_one(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hfadapt.hub.catalog as catalog

    # The path other databases (PostgreSQL...) take, exercised on SQLite.
    monkeypatch.setattr(catalog, "_upsert", catalog._upsert_portable)
    crawl(engine, offline=True, limit=300)
    with session(engine) as sess:
        row = sess.get(HubModel, MINILM)
        assert row is not None
        row.config_json, row.tags, row.downloads = {"hidden_size": 384}, ["from-the-hub"], 1
    crawl(engine, offline=True, limit=100)
    with session(engine, write=False) as sess:
        row = sess.get(HubModel, MINILM)
        stored = sess.exec(select(func.count()).select_from(HubModel)).one()
    assert row is not None and (row.rank, row.downloads) == (1, 167_480_843), (
        "always-columns not updated"
    )
    assert (row.config_json, row.tags) == ({"hidden_size": 384}, ["from-the-hub"]), (
        "Hub-only fields erased"
    )
    assert stored == 300, f"{stored} models stored after re-crawling 100 of 300"


def test_asked_for_endpoint_with_hub_offline_set_says_so(
    engine: Engine, fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnreachableError) as exc:
        crawl(engine, endpoint=fake_hub.url)
    assert exc.value.one_line() == (
        f"HF_HUB_OFFLINE is set, so {fake_hub.url} was not contacted: unset it, or crawl the bundled snapshot (offline)"
    )
    assert fake_hub.requests == [], f"requests made while offline: {fake_hub.requests}"


LYING_IDS = [
    "../../etc/passwd",  # three parts, and a path
    "org/x' onmouseover='alert(1)",  # quotes and spaces
    "org/\x1b]0;owned\x07name",  # an OSC escape sequence
    "org/" + "a" * 97,  # past 96 characters
    "org/name.git",
    "org--x/model",
    "org/mod\u00e8le",  # not ASCII
]


def test_ids_a_lying_endpoint_sends_are_refused_and_counted(
    engine: Engine,
    fake_hub: FakeHub,
    hub_api: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Listing entries whose id is not a Hub model id never reach runs.db (they would become
    cache paths, report links and terminal lines); the crawl says how many it refused."""
    for i, model_id in enumerate(LYING_IDS):
        fake_hub.add(FakeModel(model_id, FE, 10**9 + i))
    result = crawl(engine, api=hub_api)
    assert result.refused == len(LYING_IDS), (result.refused, result.notes)
    note = next(n for n in result.notes if n.startswith("refused "))
    assert note.startswith(f"refused {len(LYING_IDS)} listing entries whose id is not a Hub"), note
    assert "\x1b" not in note and "owned" not in note, note
    with session(engine, write=False) as sess:
        stored = set(sess.exec(select(HubModel.id)).all())
    assert stored and not stored & set(LYING_IDS), stored & set(LYING_IDS)
    assert len(stored) == len(fake_hub.models) - len(LYING_IDS), len(stored)
    from support.cli_runner import run_cli

    db = str(Path(str(engine.url.database)).with_name("cli.db"))
    code, out, err = run_cli(["crawl", "--endpoint", fake_hub.url, "--db", db], monkeypatch, capsys)
    assert code == 0 and out == "", (code, out, err)
    assert f"note: refused {len(LYING_IDS)} listing entries" in err and "\x1b" not in err, err


def test_a_download_the_hub_cannot_answer_is_unreachable_not_a_missing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """huggingface_hub turns a refused connection into LocalEntryNotFoundError, a subclass of
    EntryNotFoundError: it must not read as "the repository has no such file"."""
    import huggingface_hub.utils._http as hf_http

    from hfadapt.hub.resolve import HubOptions, download

    down = refused_url()
    monkeypatch.setenv("HF_ENDPOINT", down)
    monkeypatch.setattr(hf_http.time, "sleep", lambda _s: None)  # its retries, not waited out
    with pytest.raises(HubUnreachableError) as exc:
        download("acme/x", "model.safetensors", HubOptions(cache_dir=tmp_path))
    message = exc.value.one_line()
    assert message.startswith(f"cannot reach {down} for model.safetensors of acme/x"), message
    assert not isinstance(exc.value, ConfigError), message
