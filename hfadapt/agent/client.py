"""The agent's side of an OpenAI-compatible endpoint: settings (flags or OPENAI_BASE_URL,
OPENAI_API_KEY, HFADAPT_AGENT_MODEL), the ``openai`` client, chat completions with a timeout,
the SDK's own retries (``max_retries``; backoff, Retry-After) with the retries that happened
counted, a refused connection not retried, and the limits of one draft.

The API key lives only in the client object: it is never part of a repr, an error message, a
log line or anything written to runs.db (``redact`` scrubs text that might echo it)."""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx2
import openai

from hfadapt import settings
from hfadapt.errors import EndpointError, UsageError, option
from hfadapt.untrusted import clean_text

log = logging.getLogger(__name__)

ENV_BASE_URL = settings.OPENAI_BASE_URL.name
ENV_API_KEY = settings.OPENAI_API_KEY.name
ENV_MODEL = settings.HFADAPT_AGENT_MODEL.name
# Local servers (vLLM, llama.cpp, Ollama) take any key; the openai client insists on one.
NO_KEY = "not-needed"


@dataclass
class AgentSettings:
    """Where to draft and how much a draft may cost."""

    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 120.0
    # per request, by the openai SDK (429, 408, 409, 5xx, timeouts, connection errors other
    # than a refused one), with its backoff (0.5 s doubling to 8 s, jitter) or Retry-After
    max_retries: int = 4
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
        model = model or settings.agent_model()
        if not model:
            raise UsageError(f"no agent model: pass {option('model')} or set {ENV_MODEL}")
        base_url = base_url or settings.agent_base_url()
        api_key = api_key or settings.agent_api_key()
        if not base_url and not api_key:  # never a silent default endpoint
            raise UsageError(
                f"no endpoint: pass {option('base_url')} (or set {ENV_BASE_URL}) for an OpenAI-compatible "
                f"server, or {option('api_key')} (or {ENV_API_KEY}) for api.openai.com"
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
        """Every secret value to keep out of prompts, rows and messages: the API key, and the
        ones this process knows of (credential-named variables, the Hugging Face tokens)."""
        from hfadapt.untrusted import known_secrets

        return known_secrets([self.api_key])


def public_url(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def redact(text: str, secrets: list[str]) -> str:
    """``text`` with every secret and every token-shaped string replaced by [redacted]
    (:func:`hfadapt.untrusted.redact`)."""
    from hfadapt.untrusted import redact as _redact

    return _redact(text, secrets)


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


class _CountingTransport(httpx2.BaseTransport):
    """The client's transport, wrapped: it notes, per thread, the SDK's own retry count of the
    last request sent (the ``x-stainless-retry-count`` header the SDK sets on every try) and
    how many requests went out, and turns a refused connection into an ``openai`` error, which
    the SDK raises as it is instead of retrying (nothing listens there: retrying only costs
    time)."""

    def __init__(self, inner: httpx2.BaseTransport) -> None:
        self._inner = inner
        self._local = threading.local()

    def begin(self) -> None:
        self._local.sent, self._local.retry_header = 0, None

    def retries(self) -> int:
        """Retries of the current call so far (the SDK's count; else requests sent - 1)."""
        header: int | None = getattr(self._local, "retry_header", None)
        if header is not None:
            return header
        return max(getattr(self._local, "sent", 0) - 1, 0)

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        self._local.sent = getattr(self._local, "sent", 0) + 1
        try:
            self._local.retry_header = int(request.headers.get("x-stainless-retry-count", ""))
        except ValueError:
            self._local.retry_header = None
        try:
            return self._inner.handle_request(request)
        except httpx2.ConnectError as exc:
            if _refused(exc):
                raise _Refused(request=request) from exc
            raise

    def close(self) -> None:
        self._inner.close()


class _Refused(openai.APIConnectionError):
    """A refused connection (raised by the transport so that the SDK does not retry it)."""


class AgentClient:
    """Chat completions against one endpoint. Retries are the ``openai`` SDK's own
    (``max_retries``: 429, 408, 409, 5xx, timeouts and connection errors, exponential backoff
    with jitter, ``Retry-After`` / ``retry-after-ms`` honoured); the retries that happened are
    counted and reported on the answer or the error."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self._transport = _CountingTransport(httpx2.HTTPTransport())
        self._client = openai.OpenAI(
            api_key=settings.api_key or NO_KEY,
            base_url=settings.base_url,
            timeout=settings.timeout_s,
            max_retries=settings.max_retries,
            http_client=openai.DefaultHttpxClient(transport=self._transport),
        )

    def __repr__(self) -> str:
        return f"AgentClient(model={self.settings.model!r}, endpoint={self.settings.endpoint!r})"

    def check(self, timeout_s: float = 10.0) -> None:
        """One cheap request (``GET {base}/models``, no retries) before any model work: raises
        EndpointError when nothing answers there or the key is refused. Any other answer, a
        404 from a server without that route included, means the endpoint is there."""
        s = self.settings
        url = (s.base_url or "https://api.openai.com/v1").rstrip("/") + "/models"
        headers = {"Authorization": f"Bearer {s.api_key or NO_KEY}"}
        try:
            with httpx2.Client(timeout=timeout_s) as http:
                status = http.get(url, headers=headers).status_code
        except httpx2.HTTPError as exc:
            why = "connection refused" if _refused(exc) else f"unreachable ({_cause(exc)})"
            raise self._fail(f"{why}; checked before any model work") from None
        if status in (401, 403):
            raise self._fail(
                f"the API key was refused ({status}): check {option('api_key')} / {ENV_API_KEY}"
            )

    def _fail(self, what: str, retries: int = 0) -> EndpointError:
        # ``what`` may quote the server: no control characters or escape sequences (the
        # message is printed and stored in agent_attempt.error), no secrets
        what = " ".join(clean_text(what, 1000).split())
        return EndpointError(
            redact(f"endpoint {self.settings.endpoint}: {what}", self.settings.secrets()),
            retries=retries,
        )

    def complete(self, messages: list[dict[str, str]]) -> Completion:
        """One chat completion. Raises EndpointError (with ``.retries``) once the SDK's retries
        are spent, on a 4xx it does not retry, or at once on a refused connection."""
        s = self.settings
        self._transport.begin()
        start = time.monotonic()
        try:
            raw = self._client.chat.completions.with_raw_response.create(
                model=s.model,
                messages=messages,  # type: ignore[arg-type]
                temperature=s.temperature,
                max_tokens=s.max_output_tokens,
            )
            resp = raw.parse()
        except _Refused as exc:
            raise self._fail(f"connection refused ({_cause(exc)}); not retried") from None
        except openai.APIStatusError as exc:
            retries = self._transport.retries()
            if exc.status_code == 429:
                why = "rate limited (429)"
            elif exc.status_code >= 500:
                why = f"server error ({exc.status_code})"
            else:
                why = self._client_error(exc)
            raise self._fail(_gave_up(why, retries), retries) from None
        except openai.APITimeoutError:
            retries = self._transport.retries()
            why = f"no answer within {s.timeout_s:g} s"
            raise self._fail(_gave_up(why, retries), retries) from None
        except openai.APIConnectionError as exc:
            retries = self._transport.retries()
            why = f"unreachable ({_cause(exc)})"
            raise self._fail(_gave_up(why, retries), retries) from None
        latency = time.monotonic() - start
        retries = int(raw.retries_taken)
        if retries:
            log.info("agent endpoint %s answered after %d retries", s.endpoint, retries)
        if not getattr(resp, "choices", None):
            raise self._fail("the answer holds no choices", retries)
        choice = resp.choices[0]
        text = (choice.message.content or "") if choice.message else ""
        if not isinstance(text, str):
            raise self._fail("the answer's content is not text", retries)
        text = text[:MAX_ANSWER_CHARS]
        usage = getattr(resp, "usage", None)
        prompt_chars = sum(len(m.get("content", "")) for m in messages)
        return Completion(
            text=text,
            # Estimated (4 characters a token) when the endpoint reports no usage.
            tokens_in=_count(getattr(usage, "prompt_tokens", 0)) or prompt_chars // 4,
            tokens_out=_count(getattr(usage, "completion_tokens", 0)) or len(text) // 4,
            latency_s=latency,
            model=_model_name(getattr(resp, "model", None), s.model),
            retries=retries,
            finish_reason=clean_text(choice.finish_reason or "", 40),
        )

    @staticmethod
    def _client_error(exc: openai.APIStatusError) -> str:
        if exc.status_code == 401:
            return f"the API key was refused (401): check {option('api_key')} / {ENV_API_KEY}"
        if exc.status_code == 404:
            return f"not found (404): check {option('base_url')} and {option('model')}"
        message = getattr(exc, "message", "") or str(exc)
        return f"request refused ({exc.status_code}): {' '.join(message.split())[:300]}"


# An answer longer than this is cut (a draft is a page of code; nothing needs megabytes).
MAX_ANSWER_CHARS = 64 * 1024
_MODEL_NAME = re.compile(r"^[A-Za-z0-9._:/@+\-]{1,128}$")


def _model_name(value: object, fallback: str) -> str:
    """The endpoint's model name as reported, if it is a plain name; else the configured one
    (an answer's fields are untrusted: a name becomes part of provenance and rows)."""
    return value if isinstance(value, str) and _MODEL_NAME.match(value) else fallback


def _count(value: object) -> int:
    """A token count from the answer: a non-negative int below 10^9, else 0."""
    return (
        value
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**9
        else 0
    )


def _gave_up(why: str, retries: int) -> str:
    return f"{why}; gave up after {retries + 1} tries" if retries else why


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
