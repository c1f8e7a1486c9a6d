"""How hfadapt talks to a Hub endpoint: which endpoint and whether to go online at all, a quick
reachability probe without retries, and the one-line HubError for whatever huggingface_hub raised."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from hfadapt import settings
from hfadapt.errors import HubError, HubResponseError, HubUnreachableError

if TYPE_CHECKING:
    from huggingface_hub import HfApi

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 5.0
# An endpoint that failed a probe is not tried again for this long: a structural sweep asks for
# thousands of configs, and a black-holed network would otherwise cost a timeout each.
UNREACHABLE_MEMO_S = 60.0
_unreachable: dict[str, tuple[float, HubError]] = {}
# Exception class names (httpx, httpx2, requests, builtins) that mean "no answer at all".
_NETWORK_ERRORS = {
    "ConnectError",
    "TimeoutException",
    "NetworkError",
    "ConnectionError",
    "Timeout",
    "TransportError",
}


def env_offline() -> bool:
    """True when HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) asks for no network."""
    return settings.hub_offline()


def default_endpoint() -> str:
    """``$HF_ENDPOINT`` (a mirror), else huggingface.co."""
    return settings.hub_endpoint() or DEFAULT_ENDPOINT


def make_api(endpoint: str | None = None, token: str | bool | None = None) -> HfApi:
    """An ``HfApi`` for ``endpoint`` (default ``default_endpoint()``); token None means HF_TOKEN or the login."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=(endpoint or default_endpoint()).rstrip("/"), token=token)


def hub_error(exc: BaseException, endpoint: str, what: str) -> HubError:
    """The one-line HubError for an exception huggingface_hub (or the answer's parsing) raised."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    if isinstance(exc, HubError):
        return exc
    if isinstance(exc, OfflineModeIsEnabled):
        return HubUnreachableError(
            f"HF_HUB_OFFLINE is set, so {endpoint} was not contacted: unset it, or crawl the bundled snapshot (offline)"
        )
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status == 429:
            return HubResponseError(
                f"{endpoint} kept answering 429 Too Many Requests to {what} after retries: wait and crawl again, or set HF_TOKEN"
            )
        if status in (401, 403):
            return HubResponseError(f"{endpoint} refused {what} (HTTP {status}): check HF_TOKEN")
        return HubResponseError(
            f"{endpoint} answered HTTP {status} to {what}: {exc.server_message or 'no message'}"
        )
    if {cls.__name__ for cls in type(exc).__mro__} & _NETWORK_ERRORS:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        return HubUnreachableError(
            f"cannot reach {endpoint} ({reason}): check the endpoint and network, or crawl the bundled snapshot (offline)"
        )
    if isinstance(exc, json.JSONDecodeError):
        start = " ".join(exc.doc[:60].split())
        return HubResponseError(
            f"{endpoint} answered {what} with something that is not JSON (starting {start!r}): is it a Hugging Face Hub API?"
        )
    if isinstance(exc, KeyError):
        return HubResponseError(
            f"{endpoint} listed a model without {exc} in {what}: not a Hub API answer"
        )
    return HubResponseError(
        f"{endpoint} gave an answer to {what} that is not a Hub model listing ({type(exc).__name__}: {exc})"
    )


def probe(
    endpoint: str, *, token: str | bool | None = None, timeout: float = PROBE_TIMEOUT_S
) -> None:
    """One listing request with a timeout and no retries: raise a HubError unless ``endpoint``
    speaks the Hub API. A 429 or 5xx counts as reachable: the real requests retry those.
    A failure is remembered for UNREACHABLE_MEMO_S seconds and raised again without a request."""
    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers

    if env_offline():  # checked here too: huggingface_hub reads it only once, at import
        raise HubUnreachableError(
            f"HF_HUB_OFFLINE is set, so {endpoint} was not contacted: unset it, or crawl the bundled snapshot (offline)"
        )
    remembered = _unreachable.get(endpoint)
    if remembered is not None and time.monotonic() - remembered[0] < UNREACHABLE_MEMO_S:
        raise remembered[1]
    what = "GET /api/models"
    try:
        response = get_session().get(
            f"{endpoint}/api/models",
            params={"limit": 1},
            headers=build_hf_headers(token=token),
            timeout=timeout,
        )
        if response.status_code == 429 or response.status_code >= 500:
            return
        if response.status_code >= 400:
            raise HubResponseError(
                f"{endpoint} answered HTTP {response.status_code} to {what}: is it a Hub API endpoint?"
            )
        if not isinstance(response.json(), list):
            raise HubResponseError(
                f"{endpoint} answered {what} with JSON that is not a model list: is it a Hub API endpoint?"
            )
    except Exception as exc:
        error = hub_error(exc, endpoint, what)
        if isinstance(error, HubUnreachableError):
            _unreachable[endpoint] = (time.monotonic(), error)
        if error is exc:
            raise
        raise error from exc
    _unreachable.pop(endpoint, None)


def forget_unreachable() -> None:
    """Forget which endpoints failed a probe (tests; or after the network came back)."""
    _unreachable.clear()
