"""Shared fixtures. Every test runs with its database, HF cache and HF token store under its own
tmp_path, so nothing a test does touches the user's files or sends the user's token anywhere."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_server import FakeHub


@pytest.fixture(autouse=True)
def isolated_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HFADAPT_DB, HF_HOME and HF_HUB_CACHE under tmp_path; no HF token. Returns the HF home."""
    import huggingface_hub.constants as hf_constants

    hf_home = tmp_path / "hf_home"
    paths = {
        "HF_HOME": hf_home,
        "HF_HUB_CACHE": hf_home / "hub",
        "HF_ASSETS_CACHE": hf_home / "assets",
        "HF_XET_CACHE": hf_home / "xet",
        "HF_TOKEN_PATH": hf_home / "token",
        "HF_STORED_TOKENS_PATH": hf_home / "stored_tokens",
    }
    monkeypatch.setenv("HFADAPT_DB", str(tmp_path / "runs.db"))
    for name, path in paths.items():
        monkeypatch.setenv(name, str(path))
        # huggingface_hub read these at import time: the environment alone is not enough.
        if hasattr(hf_constants, name):
            monkeypatch.setattr(hf_constants, name, str(path))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return hf_home


@pytest.fixture
def online(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let huggingface_hub make requests (to loopback servers) even if the caller set HF_HUB_OFFLINE."""
    import huggingface_hub.constants as hf_constants

    from hfadapt.hubclient import forget_unreachable

    forget_unreachable()  # a port remembered as refused may now be a live loopback server
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def fake_hub(online: None) -> Iterator[FakeHub]:
    """A loopback Hub (tests/hub_server.py) with a few hundred generated embedding models."""
    hub = FakeHub().start()
    try:
        yield hub
    finally:
        hub.stop()


@pytest.fixture
def hub_api(fake_hub: FakeHub):  # type: ignore[no-untyped-def]
    """A real ``huggingface_hub.HfApi`` pointed at ``fake_hub``."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=fake_hub.url, token=False)


# ---- the eager spyre device (tests/test_device_*.py) -------------------------------------------


@pytest.fixture
def spyre() -> Iterator[object]:
    """The simulated ``spyre`` device module, registered (once per process). Restores the
    current device and the default profile afterwards."""
    from hfadapt.spyre import device

    device.register()
    yield device
    device.set_device(0)
    device.set_profile(None)
