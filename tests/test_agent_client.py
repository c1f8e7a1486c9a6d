"""The endpoint client: settings from flags and environment, retries on 429/5xx with
Retry-After, clear errors on 4xx and a dead endpoint, and the key kept out of every message."""

from __future__ import annotations

import pytest
from openai_server import (
    ScriptedOpenAI,
    dead_url,
    openai_server_fixture,  # noqa: F401
)

from hfadapt.agent.client import AgentClient, AgentSettings, public_url, redact
from hfadapt.errors import EndpointError, UsageError

KEY = "sk-client-test-9876"
MSG = [{"role": "user", "content": "hi"}]


def make(url: str, sleeps: list[float], **kw: object) -> AgentClient:
    options: dict = {"backoff_s": 0.5, "max_retries": 2, "timeout_s": 5.0, **kw}
    settings = AgentSettings(model="m", base_url=url, api_key=KEY, **options)
    return AgentClient(settings, sleep=sleeps.append)


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
    with pytest.raises(UsageError, match="--model"):
        AgentSettings.from_env()
    # No key and no base URL: refused in one line, never a silent default endpoint.
    monkeypatch.delenv("OPENAI_BASE_URL")
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(UsageError) as err:
        AgentSettings.from_env(model="m")
    assert "no endpoint: pass --base-url" in err.value.one_line() and err.value.exit_code == 2


def test_public_url_and_redact() -> None:
    assert public_url("https://user:pw@host:8443/v1?api_key=x") == "https://host:8443/v1"
    assert redact(f"key {KEY} again {KEY}", [KEY]) == "key [redacted] again [redacted]"


def test_answer_tokens_and_latency(openai_server: ScriptedOpenAI) -> None:
    openai_server.script = ["hello"]
    c = make(openai_server.url, []).complete(MSG)
    assert (c.text, c.tokens_in, c.tokens_out, c.retries, c.model) == (
        "hello",
        1200,
        300,
        0,
        "scripted-model",
    )
    assert 0 <= c.latency_s < 5
    assert openai_server.requests[0]["json"]["model"] == "m"


def test_429_and_503_are_retried_with_backoff_and_retry_after(
    openai_server: ScriptedOpenAI,
) -> None:
    openai_server.script = [
        {"status": 429, "headers": {"retry-after": "2"}, "body": {"error": {"message": "slow"}}},
        {"status": 503, "body": {"error": {"message": "busy"}}},
        "ok",
    ]
    sleeps: list[float] = []
    c = make(openai_server.url, sleeps).complete(MSG)
    assert c.text == "ok" and c.retries == 2
    assert sleeps == [2.0, 1.0], sleeps  # Retry-After, then 0.5 * 2**1


def test_retries_run_out_into_a_clear_error(openai_server: ScriptedOpenAI) -> None:
    openai_server.script = [{"status": 500, "body": {"error": {"message": "down"}}}] * 3
    with pytest.raises(EndpointError, match=r"server error \(500\); gave up after 3 tries"):
        make(openai_server.url, []).complete(MSG)


def test_client_errors_are_not_retried_and_never_show_the_key(
    openai_server: ScriptedOpenAI,
) -> None:
    openai_server.script = [{"status": 401, "body": {"error": {"message": f"bad key {KEY}"}}}]
    with pytest.raises(EndpointError) as exc:
        make(openai_server.url, []).complete(MSG)
    assert "API key was refused (401)" in str(exc.value) and KEY not in str(exc.value)
    assert len(openai_server.requests) == 1
    openai_server.script = [
        {"status": 400, "body": {"error": {"message": f"context too long for {KEY}"}}}
    ]
    with pytest.raises(EndpointError) as exc:
        make(openai_server.url, []).complete(MSG)
    assert "refused (400)" in str(exc.value) and KEY not in str(exc.value), str(exc.value)


def test_dead_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    url = dead_url()
    sleeps: list[float] = []
    with pytest.raises(EndpointError, match=r"connection refused .*not retried"):
        make(url, sleeps).complete(MSG)
    assert sleeps == [], f"a refused connection was retried after {sleeps}"


def test_slow_endpoint_times_out(openai_server: ScriptedOpenAI) -> None:
    openai_server.script = [{"delay": 2, "content": "late"}] * 2
    client = make(openai_server.url, [], timeout_s=0.3)
    client.settings.max_retries = 1
    with pytest.raises(EndpointError, match=r"no answer within 0\.3 s"):
        client.complete(MSG)
