"""The agent's side of an OpenAI-compatible endpoint: settings (flags or OPENAI_BASE_URL,
OPENAI_API_KEY, HFADAPT_AGENT_MODEL), the ``openai`` client, chat completions with a timeout,
retries with backoff on 429 and 5xx (honouring Retry-After), and the limits of one draft.

The API key lives only in the client object: it is never part of a repr, an error message, a
log line or anything written to runs.db (``redact`` scrubs text that might echo it)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import openai

from hfadapt.errors import EndpointError, UsageError

log = logging.getLogger(__name__)

ENV_BASE_URL = "OPENAI_BASE_URL"
ENV_API_KEY = "OPENAI_API_KEY"
ENV_MODEL = "HFADAPT_AGENT_MODEL"
# Local servers (vLLM, llama.cpp, Ollama) take any key; the openai client insists on one.
NO_KEY = "not-needed"


@dataclass
class AgentSettings:
    """Where to draft and how much a draft may cost."""

    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 120.0
    max_retries: int = 4  # per request, on 429 / 5xx / connection errors
    backoff_s: float = 1.0  # first wait; doubles per retry
    backoff_max_s: float = 30.0
    max_attempts: int = 4  # drafts per failure
    max_tokens: int = 100_000  # prompt + completion tokens per failure
    max_seconds: float = 1800.0  # wall time per failure
    max_output_tokens: int = 4096  # per answer
    temperature: float = 0.2

    @classmethod
    def from_env(
        cls,
        *,
        model: str | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        **limits: Any,
    ) -> AgentSettings:
        """Flags win over the environment; a model name is required (endpoints differ)."""
        model = model or os.environ.get(ENV_MODEL)
        if not model:
            raise UsageError(f"no agent model: pass --model or set {ENV_MODEL}")
        base_url = base_url or os.environ.get(ENV_BASE_URL) or None
        api_key = api_key or os.environ.get(ENV_API_KEY) or None
        if not base_url and not api_key:  # never a silent default endpoint
            raise UsageError(
                f"no endpoint: pass --base-url (or set {ENV_BASE_URL}) for an OpenAI-compatible "
                f"server, or --api-key (or {ENV_API_KEY}) for api.openai.com"
            )
        return cls(
            model=model,
            base_url=base_url,
            api_key=api_key,
            **{k: v for k, v in limits.items() if v is not None},
        )

    @property
    def endpoint(self) -> str:
        """The base URL without credentials or query (safe to print and store)."""
        return public_url(self.base_url or "https://api.openai.com/v1")

    def secrets(self) -> list[str]:
        return [self.api_key] if self.api_key else []


def public_url(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def redact(text: str, secrets: list[str]) -> str:
    """``text`` with every secret (of 4+ characters) replaced by [redacted]."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "[redacted]")
    return text


@dataclass
class Completion:
    """One answer and what it cost."""

    text: str
    tokens_in: int
    tokens_out: int
    latency_s: float
    model: str
    retries: int = 0
    finish_reason: str = ""


def _retry_after(exc: openai.APIStatusError) -> float | None:
    try:
        value = exc.response.headers.get("retry-after")
        return float(value) if value is not None else None
    except (AttributeError, TypeError, ValueError):
        return None


class AgentClient:
    """Chat completions against one endpoint, with the retry policy above."""

    def __init__(
        self,
        settings: AgentSettings,
        client: openai.OpenAI | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self._sleep = sleep
        # Retries are ours (to count them and keep them bounded), so the SDK's are off.
        self._client = client or openai.OpenAI(
            api_key=settings.api_key or NO_KEY,
            base_url=settings.base_url,
            timeout=settings.timeout_s,
            max_retries=0,
        )

    def __repr__(self) -> str:
        return f"AgentClient(model={self.settings.model!r}, endpoint={self.settings.endpoint!r})"

    def _fail(self, what: str) -> EndpointError:
        return EndpointError(
            redact(f"endpoint {self.settings.endpoint}: {what}", self.settings.secrets())
        )

    def complete(self, messages: list[dict[str, str]]) -> Completion:
        """One chat completion. Raises EndpointError once retries are spent or on a 4xx."""
        s = self.settings
        retries = 0
        while True:
            start = time.monotonic()
            try:
                resp = self._client.chat.completions.create(
                    model=s.model,
                    messages=messages,  # type: ignore[arg-type]
                    temperature=s.temperature,
                    max_tokens=s.max_output_tokens,
                )
                break
            except openai.RateLimitError as exc:
                wait, why = _retry_after(exc), "rate limited (429)"
            except openai.APIStatusError as exc:
                if exc.status_code < 500:
                    raise self._fail(self._client_error(exc)) from None
                wait, why = _retry_after(exc), f"server error ({exc.status_code})"
            except openai.APITimeoutError:
                wait, why = None, f"no answer within {s.timeout_s:g} s"
            except openai.APIConnectionError as exc:
                if _refused(exc):  # nothing listens there: retrying only costs time
                    raise self._fail(f"connection refused ({_cause(exc)}); not retried") from None
                wait, why = None, f"unreachable ({_cause(exc)})"
            if retries >= s.max_retries:
                raise self._fail(f"{why}; gave up after {retries + 1} tries")
            delay = min(wait if wait is not None else s.backoff_s * 2**retries, s.backoff_max_s)
            log.info("agent endpoint %s: %s; retry in %.1f s", s.endpoint, why, delay)
            retries += 1
            self._sleep(delay)
        latency = time.monotonic() - start
        if not getattr(resp, "choices", None):
            raise self._fail("the answer holds no choices")
        choice = resp.choices[0]
        text = (choice.message.content or "") if choice.message else ""
        usage = getattr(resp, "usage", None)
        prompt_chars = sum(len(m.get("content", "")) for m in messages)
        return Completion(
            text=text,
            # Estimated (4 characters a token) when the endpoint reports no usage.
            tokens_in=int(getattr(usage, "prompt_tokens", 0) or prompt_chars // 4),
            tokens_out=int(getattr(usage, "completion_tokens", 0) or len(text) // 4),
            latency_s=latency,
            model=str(getattr(resp, "model", "") or s.model),
            retries=retries,
            finish_reason=str(choice.finish_reason or ""),
        )

    @staticmethod
    def _client_error(exc: openai.APIStatusError) -> str:
        if exc.status_code == 401:
            return "the API key was refused (401): check --api-key / OPENAI_API_KEY"
        if exc.status_code == 404:
            return "not found (404): check --base-url and --model"
        message = getattr(exc, "message", "") or str(exc)
        return f"request refused ({exc.status_code}): {' '.join(message.split())[:300]}"


def _refused(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # the cause chain: APIConnectionError <- httpx.ConnectError <- OSError
        if seen is None:
            return False
        if isinstance(seen, ConnectionRefusedError) or "Connection refused" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _cause(exc: BaseException) -> str:
    inner = exc.__cause__ or exc.__context__
    text = str(inner or exc) or type(exc).__name__
    return " ".join(text.split())[:200]
