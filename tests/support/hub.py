"""The Hub as tests see it: requests allowed to loopback servers, a loopback Hub with generated
models, and one serving the tiny BERT."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from support.hub_server import FakeHub, FakeModel


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let huggingface_hub make requests (to loopback servers) even if the caller set HF_HUB_OFFLINE."""
    import huggingface_hub.constants as hf_constants

    from hfadapt.hub.client import forget_unreachable

    forget_unreachable()  # a port remembered as refused may now be a live loopback server
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def fake_hub(online: None) -> Iterator[FakeHub]:
    """A loopback Hub (tests/support/hub_server.py) with a few hundred generated embedding models.

    transformers keeps one shared HfApi (``transformers.utils.hub.hf_api``) with the endpoint of
    when it was first made: left alone, a later test's tokenizer listed its files at an earlier
    test's stopped server, and waited out huggingface_hub's retries (about 45 s a test)."""
    import transformers.utils.hub as transformers_hub

    transformers_hub._hf_api = None
    hub = FakeHub().start()
    try:
        yield hub
    finally:
        hub.stop()
        transformers_hub._hf_api = None


@pytest.fixture
def hub_api(fake_hub: FakeHub):  # type: ignore[no-untyped-def]
    """A real ``huggingface_hub.HfApi`` pointed at ``fake_hub``."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=fake_hub.url, token=False)


@pytest.fixture
def hub_with_tiny_bert(
    fake_hub: FakeHub,
    tiny_model_dirs: dict[str, Path],
    minilm_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> FakeHub:
    """The loopback Hub serving the tiny BERT as acme/tiny-bert (with all-MiniLM's pooling files),
    and huggingface_hub pointed at it (its endpoint constants are read at import)."""
    import huggingface_hub.constants as hf_constants

    files = {p.name: p.read_bytes() for p in tiny_model_dirs["bert"].iterdir() if p.is_file()}
    files["modules.json"] = (minilm_path / "modules.json").read_bytes()
    files["1_Pooling/config.json"] = (minilm_path / "1_Pooling" / "config.json").read_bytes()
    fake_hub.add(FakeModel("acme/tiny-bert", files=files))
    # transformers lists additional_chat_templates/ with the tree API, which hub_server does not
    # speak: answer as the Hub does for a repo without that folder.
    fake_hub.script("/api/models/acme/tiny-bert/tree/", status=200, body="[]", times=1000)
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.setattr(hf_constants, "ENDPOINT", fake_hub.url)
    monkeypatch.setattr(
        hf_constants,
        "HUGGINGFACE_CO_URL_TEMPLATE",
        fake_hub.url + "/{repo_id}/resolve/{revision}/{filename}",
    )
    return fake_hub
