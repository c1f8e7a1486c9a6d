"""A model's config.json without its weights: from the Hub (into the HF cache), else the HF
cache, else the configs bundled with hfadapt; used by structural mode and the crawler."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from hfadapt.errors import (
    ConfigError,
    HubError,
    HubResponseError,
    HubUnreachableError,
    ModelNotFoundError,
)
from hfadapt.hub.client import env_offline, hub_error, make_api, probe
from hfadapt.hub.snapshot import bundled_config

if TYPE_CHECKING:
    from huggingface_hub import HfApi


def _read(path: str, model_id: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"config.json of {model_id} is not readable JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config.json of {model_id} is not a JSON object")
    return data


def _cached(model_id: str, revision: str | None) -> str | None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        return hf_hub_download(model_id, "config.json", revision=revision, local_files_only=True)
    except EntryNotFoundError:  # LocalEntryNotFoundError: not in the cache
        return None


def fetch_config(
    model_id: str,
    *,
    api: HfApi | None = None,
    endpoint: str | None = None,
    revision: str | None = None,
    offline: bool | None = None,
    token: str | bool | None = None,
) -> dict[str, object]:
    """A model's config.json as a dict, without downloading weights.

    Online, ``hf_hub_download`` fetches it into the HF cache (a quick probe first, so a Hub that
    is down costs one refused connection, not huggingface_hub's retries). Offline
    (``offline=True`` or HF_HUB_OFFLINE), or when the Hub cannot be reached: the HF cache, then
    the configs bundled with hfadapt. Raises ModelNotFoundError for an id the Hub does not
    have, ConfigError for a repo without a readable config.json, HubUnreachableError when the
    Hub is down and no local copy exists.
    """
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    offline = env_offline() if offline is None else offline
    unreachable: HubError | None = None
    if not offline:
        api = api or make_api(endpoint, token)
        try:
            probe(api.endpoint, token=api.token)
        except HubUnreachableError as exc:
            unreachable = exc
        except HubResponseError:
            pass  # a mirror may serve files without the listing API: let the download decide
    if not offline and unreachable is None:
        assert api is not None
        try:
            return _read(api.hf_hub_download(model_id, "config.json", revision=revision), model_id)
        except GatedRepoError as exc:
            raise HubResponseError(
                f"{model_id} is gated on {api.endpoint}: accept its terms on the Hub and set HF_TOKEN"
            ) from exc
        except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
            raise ModelNotFoundError(
                f"{model_id} is not a model on {api.endpoint} ({type(exc).__name__})"
            ) from exc
        except HfHubHTTPError as exc:
            if isinstance(exc, EntryNotFoundError):
                raise ConfigError(f"{model_id} has no config.json") from exc
            raise hub_error(exc, api.endpoint, f"config.json of {model_id}") from exc
        except EntryNotFoundError as exc:  # not reachable after all, and not in the cache
            unreachable = hub_error(
                exc.__cause__ or exc, api.endpoint, f"config.json of {model_id}"
            )

    cached = _cached(model_id, revision)
    if cached is not None:
        return _read(cached, model_id)
    bundled = bundled_config(model_id)
    if bundled is not None:
        return bundled
    if unreachable is not None:
        raise HubUnreachableError(
            f"cannot get config.json of {model_id}: {unreachable.one_line()}; it is not in the HF cache nor bundled with hfadapt"
        )
    raise ConfigError(
        f"no config.json for {model_id} offline: not in the HF cache, and hfadapt does not bundle it"
    )


def known_model_types() -> dict[str, str]:
    """model_type -> config class name for every architecture this transformers knows."""
    if "transformers.models.auto.configuration_auto" in sys.modules:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    else:
        # The plain table: importing configuration_auto pulls in torch (seconds), this does not.
        try:
            from transformers.models.auto.auto_mappings import CONFIG_MAPPING_NAMES
        except ImportError:  # older transformers: only the full module has it
            from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    return dict(CONFIG_MAPPING_NAMES)
