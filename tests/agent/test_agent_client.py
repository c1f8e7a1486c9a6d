"""The endpoint client: settings from flags and environment, the openai SDK's retries on
429/5xx (Retry-After honoured) with the retries that happened counted, clear errors on 4xx and a dead endpoint, and the key kept out of every message."""

from __future__ import annotations

import time

import openai
import openai._base_client
import pytest
from support.openai_server import (
    ScriptedOpenAI,
    busy,
    dead_url,
    openai_server_fixture,  # noqa: F401
)

from hfadapt.agent.client import AgentClient, AgentSettings, public_url, redact
from hfadapt.errors import EndpointError, UsageError

KEY = "sk-client-test-9876"
MSG = [{"role": "user", "content": "hi"}]


def make(url: str, **kw: object) -> AgentClient:
    options: dict = {"max_retries": 2, "timeout_s": 5.0, **kw}
    return AgentClient(AgentSettings(model="m", base_url=url, api_key=KEY, **options))


class _SdkSleeps:
    """Stands in for the ``time`` module inside the openai SDK only: its retry sleeps are
    recorded (and skipped), everything else is the real clock."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


@pytest.fixture(name="sdk_sleeps")
def sdk_sleeps_fixture(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    fake = _SdkSleeps()
    monkeypatch.setattr(openai._base_client, "time", fake)
    return fake.sleeps


def retry_counts(server: ScriptedOpenAI) -> list[str]:
    """The SDK's own retry count on each request the server received."""
    return [r["headers"].get("x-stainless-retry-count", "?") for r in server.requests]


def test_settings_flags_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env:1/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    monkeypatch.setenv("HFADAPT_AGENT_MODEL", "env-model")
    s = AgentSettings.from_env()
    assert (s.base_url, s.api_key, s.model) == ("http://env:1/v1", "env-key", "env-model")
    s = AgentSettings.from_env(
        model="flag", base_url="http://flag:2/v1", api_key="flag-key", max_attempts=7
    )
    assert (s.base_url, s.api_key, s.model, s.max_attempts) == (
        "http://flag:2/v1",
        "flag-key",
        "flag",
        7,
    )
    monkeypatch.delenv("HFADAPT_AGENT_MODEL")
    with pytest.raises(UsageError, match="`model`"):
        AgentSettings.from_env()
    # No key and no base URL: refused in one line, never a silent default endpoint.
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(UsageError) as err:
        AgentSettings.from_env(model="m")
    assert "no endpoint: pass `base_url`" in err.value.one_line() and err.value.exit_code == 2
    # the CLI names the flag
    assert "no endpoint: pass --base-url" in err.value.one_line(flags=True)


def test_public_url_and_redact() -> None:
    assert public_url("https://user:pw@host:8443/v1?api_key=x") == "https://host:8443/v1"
    assert redact(f"key {KEY} again {KEY}", [KEY]) == "key [redacted] again [redacted]"


def test_answer_tokens_and_latency(openai_server: ScriptedOpenAI) -> None:
    openai_server.script = ["hello"]
    c = make(openai_server.url).complete(MSG)
    assert (c.text, c.tokens_in, c.tokens_out, c.retries, c.model) == (
        "hello",
        1200,
        300,
        0,
        "scripted-model",
    )
    assert c.latency_s >= 0
    assert openai_server.requests[0]["json"]["model"] == "m"


def test_429_then_success_records_one_retry(openai_server: ScriptedOpenAI) -> None:
    openai_server.script = [busy(429, "slow"), "ok"]
    c = make(openai_server.url).complete(MSG)
    assert (c.text, c.retries) == ("ok", 1), (c.text, c.retries)
    # The retry was the SDK's (its retry counter went 0, 1), not a loop of ours.
    assert retry_counts(openai_server) == ["0", "1"], retry_counts(openai_server)


@pytest.mark.parametrize(("max_retries", "status"), [(0, 503), (1, 502), (3, 503), (2, 429)])
def test_errors_give_up_after_max_retries_with_the_count(
    openai_server: ScriptedOpenAI, max_retries: int, status: int
) -> None:
    openai_server.script = [busy(status, "down")] * 6
    with pytest.raises(EndpointError) as exc:
        make(openai_server.url, max_retries=max_retries).complete(MSG)
    sent = len(openai_server.requests)
    assert sent == max_retries + 1, f"{sent} requests for max_retries={max_retries}"
    assert exc.value.retries == max_retries, (exc.value.retries, max_retries)
    assert retry_counts(openai_server) == [str(i) for i in range(max_retries + 1)]
    message = str(exc.value)
    assert f"({status})" in message, message
    assert (f"gave up after {sent} tries" in message) == (max_retries > 0), message


def test_sdk_backoff_honours_retry_after(
    openai_server: ScriptedOpenAI, sdk_sleeps: list[float]
) -> None:
    openai_server.script = [
        {"status": 429, "headers": {"retry-after": "2"}, "body": {"error": {"message": "slow"}}},
        {"status": 503, "headers": {"retry-after-ms": "250"}, "body": {"error": {}}},
        {"status": 500, "body": {"error": {"message": "no hint"}}},
        "ok",
    ]
    c = make(openai_server.url, max_retries=3).complete(MSG)
    assert (c.text, c.retries) == ("ok", 3), (c.text, c.retries)
    assert sdk_sleeps[:2] == [2.0, 0.25], sdk_sleeps  # Retry-After, then retry-after-ms
    # No hint: the SDK's exponential backoff (0.5 s * 2**2 less up to 25 % jitter).
    assert len(sdk_sleeps) == 3 and 0 < sdk_sleeps[2] <= 8.0, sdk_sleeps


def test_client_errors_are_not_retried_and_never_show_the_key(
    openai_server: ScriptedOpenAI,
) -> None:
    openai_server.script = [{"status": 401, "body": {"error": {"message": f"bad key {KEY}"}}}]
    with pytest.raises(EndpointError) as exc:
        make(openai_server.url).complete(MSG)
    assert "API key was refused (401)" in str(exc.value) and KEY not in str(exc.value)
    assert len(openai_server.requests) == 1 and exc.value.retries == 0
    openai_server.script = [
        {"status": 400, "body": {"error": {"message": f"context too long for {KEY}"}}}
    ]
    with pytest.raises(EndpointError) as exc:
        make(openai_server.url).complete(MSG)
    assert "refused (400)" in str(exc.value) and KEY not in str(exc.value), str(exc.value)
    assert len(openai_server.requests) == 2 and exc.value.retries == 0


def test_dead_endpoint_is_not_retried(sdk_sleeps: list[float]) -> None:
    url = dead_url()
    with pytest.raises(EndpointError, match=r"connection refused .*not retried") as exc:
        make(url, max_retries=4).complete(MSG)
    assert exc.value.retries == 0 and sdk_sleeps == [], (exc.value.retries, sdk_sleeps)


def test_slow_endpoint_times_out(openai_server: ScriptedOpenAI, sdk_sleeps: list[float]) -> None:
    openai_server.script = [{"delay": 2, "content": "late"}] * 2
    with pytest.raises(
        EndpointError, match=r"no answer within 0\.3 s; gave up after 2 tries"
    ) as exc:
        make(openai_server.url, timeout_s=0.3, max_retries=1).complete(MSG)
    assert exc.value.retries == 1 and len(sdk_sleeps) == 1, (exc.value.retries, sdk_sleeps)
