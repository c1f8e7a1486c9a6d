"""Where a model reference points: a local folder, the HF cache, or the Hub (probed briefly
before anything downloads), and what hfadapt knows about it without loading it: its
config.json and whether it needs its repository's own code (auto_map, or the snapshot's flag)."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hfadapt import settings
from hfadapt.errors import (
    ConfigError,
    CustomCodeError,
    HubError,
    HubUnreachableError,
    ModelNotFoundError,
    did_you_mean,
    option,
)
from hfadapt.hub.client import default_endpoint as hub_endpoint
from hfadapt.hub.client import env_offline, hub_error, probe

# The Hub is probed once, briefly, before anything downloads: huggingface_hub otherwise retries
# a dead connection for ~20 s before saying so.
HUB_PROBE_TIMEOUT_S = 3.0

__all__ = [
    "HubOptions",
    "ModelSource",
    "cached_file",
    "download",
    "download_if_present",
    "env_offline",
    "has_file",
    "hf_cache_dir",
    "hub_endpoint",
    "hub_status",
    "looks_like_path",
    "read_config",
    "refuse_snapshot_custom_code",
    "remote_code_reason",
    "resolve",
    "snapshot_row",
]


@dataclass
class ModelSource:
    """Where a model reference points: a folder, the HF cache, or the Hub."""

    ref: str
    model_id: str  # the Hub id, or the folder's path
    kind: str  # folder | cache | hub
    folder: Path  # holds config.json (a local folder or a cache snapshot)
    revision: str | None = None  # the commit sha of a cache snapshot


@dataclass(frozen=True)
class HubOptions:
    """What ``from_pretrained`` users pass, with its meaning there: ``revision`` (a branch,
    tag or commit), ``token`` (a string, True for the stored login, False for none; None:
    HF_TOKEN or the stored login), ``cache_dir`` (instead of the HF cache) and
    ``local_files_only`` (never ask the Hub)."""

    revision: str | None = None
    token: str | bool | None = None
    cache_dir: str | None = None
    local_files_only: bool = False

    def cache(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else hf_cache_dir()


_NO_OPTIONS = HubOptions()


def hf_cache_dir() -> Path:
    """The HF hub cache as the environment says now (tests point it at a temporary folder)."""
    return settings.hf_hub_cache()


def hub_status() -> tuple[bool, str]:
    """(online, why not): offline when HF_HUB_OFFLINE is set or one quick request fails."""
    if env_offline():
        return False, "HF_HUB_OFFLINE is set"
    endpoint = hub_endpoint()
    try:
        probe(endpoint, timeout=HUB_PROBE_TIMEOUT_S)
    except HubError as exc:
        cause = exc.__cause__ or exc
        return False, f"{endpoint} cannot be reached ({' '.join(str(cause).split())[:120]})"
    return True, ""


# A folder holding one of these is a (perhaps broken) model; one without them and without a
# config.json is not a model at all (``diagnose /etc``).
_MODEL_FILES = frozenset({".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack"})


def looks_like_path(ref: str) -> bool:
    return ref.startswith((".", "/", "~")) or "\\" in ref or ref.count("/") > 1 or ref.endswith("/")


def resolve(ref: str | os.PathLike[str], hub: HubOptions | None = None) -> ModelSource:
    """Find ``ref``: an existing folder, else a Hub id in the HF cache, else on the Hub
    (``hub``: revision, token, cache_dir, local_files_only as from_pretrained takes them).

    Raises ModelNotFoundError (an empty reference, a missing or empty folder, a folder with
    neither config.json nor weights, not a Hub id, not cached offline, no such repo or
    revision) and ConfigError (a Hub repo without config.json).
    """
    hub = hub or _NO_OPTIONS
    text = os.fspath(ref)
    if not text.strip():
        raise ModelNotFoundError("the model reference is empty: pass a Hub id or a model folder")
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFoundError(
                f"{text} is a file; pass the model's folder (config.json, weights, tokenizer)"
            )
        if not any(path.iterdir()):
            raise ModelNotFoundError(
                f"{text} is an empty folder; expected a model in Hub layout (config.json, weights, tokenizer)"
            )
        if not (path / "config.json").exists() and not any(
            p.suffix in _MODEL_FILES for p in path.iterdir()
        ):
            raise ModelNotFoundError(
                f"{text} is not a model folder: no config.json and no weights in it"
            )
        return ModelSource(text, str(path.resolve()), "folder", path.resolve())
    if looks_like_path(text):
        raise ModelNotFoundError(f"no such folder: {text}")
    from hfadapt.hub.ids import invalid_model_id

    if invalid_model_id(text):
        raise ModelNotFoundError(f"{text} is neither a folder nor a Hub model id")

    cached = cached_file(text, "config.json", hub)
    if cached is not None:
        return ModelSource(text, text, "cache", cached.parent, cached.parent.name)
    at = f" at revision {hub.revision}" if hub.revision else ""
    if hub.local_files_only:
        raise ModelNotFoundError(
            f"{text}{at} is not in the HF cache ({hub.cache()}) and local_files_only is set: "
            f"download it first or pass a local folder{_snapshot_hint(text)}"
        )
    online, why = hub_status()
    if not online:
        raise ModelNotFoundError(
            f"{text}{at} is not in the HF cache ({hub.cache()}) and {why}: download it first, "
            f"pass a local folder, or judge it in structural mode (its config only)"
            f"{_snapshot_hint(text)}"
        )
    downloaded = download(text, "config.json", hub)
    return ModelSource(text, text, "hub", downloaded.parent, downloaded.parent.name)


def _snapshot_hint(repo_id: str) -> str:
    """ "; did you mean 'x'?" for a Hub id the bundled snapshot (the top 10,000 embedding
    models) does not hold but holds one close to."""
    from hfadapt.hub.snapshot import read_snapshot

    return did_you_mean(repo_id, (m.model_id for m in read_snapshot()))


def cached_file(repo_id: str, filename: str, hub: HubOptions | None = None) -> Path | None:
    """A file of a Hub repo from the HF cache (``hub.revision``, else the newest cached
    revision), or None. ModelNotFoundError for a string that is not a Hub id (huggingface_hub
    would raise its own validation error, which no caller expects)."""
    from huggingface_hub import try_to_load_from_cache

    from hfadapt.hub.ids import invalid_model_id

    if invalid_model_id(repo_id):
        raise ModelNotFoundError(f"{repo_id} is neither a folder nor a Hub model id")
    hub = hub or _NO_OPTIONS
    found = try_to_load_from_cache(repo_id, filename, cache_dir=hub.cache(), revision=hub.revision)
    return Path(found) if isinstance(found, str) else None


def has_file(source: ModelSource, filename: str, hub: HubOptions | None = None) -> bool:
    """Whether the model has ``filename`` (e.g. modules.json: a sentence-transformers model):
    in its folder, its cache snapshot, or (online, not local_files_only) on the Hub."""
    if (source.folder / filename).is_file():
        return True
    if source.kind != "hub":
        return False
    try:
        download(source.model_id, filename, hub)
    except ConfigError:
        return False
    return True


def _hf_download(repo_id: str, filename: str, hub: HubOptions) -> Path:
    """hf_hub_download of one file with ``hub``'s revision, cache and token, at hfadapt's
    endpoint: what ``download`` and ``download_if_present`` share; huggingface_hub's errors."""
    from huggingface_hub import hf_hub_download

    return Path(
        hf_hub_download(
            repo_id,
            filename,
            revision=hub.revision,
            cache_dir=hub.cache(),
            endpoint=hub_endpoint(),
            token=hub.token,
        )
    )


def download(repo_id: str, filename: str, hub: HubOptions | None = None) -> Path:
    """One file of a Hub repo into the HF cache; ModelNotFoundError / ConfigError when it cannot."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hub = hub or _NO_OPTIONS
    try:
        return _hf_download(repo_id, filename, hub)
    except GatedRepoError as exc:
        raise ModelNotFoundError(
            f"{repo_id} is gated: accept its terms on the Hub and pass a token (HF_TOKEN)"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise ModelNotFoundError(
            f"{repo_id} is not a model on {hub_endpoint()}{_snapshot_hint(repo_id)}"
        ) from exc
    except RevisionNotFoundError as exc:
        raise ModelNotFoundError(
            f"{repo_id} has no revision {hub.revision!r} on {hub_endpoint()}"
        ) from exc
    except LocalEntryNotFoundError as exc:  # a subclass of EntryNotFoundError: the Hub not asked
        raise HubUnreachableError(
            f"cannot reach {hub_endpoint()} for {filename} of {repo_id}, and the HF cache has no "
            "copy: check the network (or HF_HUB_OFFLINE with a filled cache)"
        ) from exc
    except EntryNotFoundError as exc:
        raise ConfigError(f"{repo_id} has no {filename} on {hub_endpoint()}") from exc
    except OSError as exc:  # connection dropped after the probe
        raise ModelNotFoundError(
            f"cannot download {filename} of {repo_id}: {' '.join(str(exc).split())[:200]}"
        ) from exc


def download_if_present(repo_id: str, filename: str, hub: HubOptions) -> Path | None:
    """``download`` for a file a repository may lack: None when the Hub answers that it has no
    such file. Any other failure is a HubUnreachableError (no answer) or HubResponseError (an
    HTTP error), never a "no such file"."""
    from huggingface_hub.errors import LocalEntryNotFoundError, RemoteEntryNotFoundError

    try:
        return _hf_download(repo_id, filename, hub)
    except RemoteEntryNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        # no answer: huggingface_hub reports it as "not in the local cache", the cause inside
        cause = exc.__cause__ if isinstance(exc, LocalEntryNotFoundError) else None
        raise hub_error(cause or exc, hub_endpoint(), f"{filename} of {repo_id}") from exc


def read_config(folder: Path, where: str | None = None) -> dict[str, Any]:
    """config.json as a dict; ConfigError when it is missing, unreadable or not an object."""
    where = where or str(folder)
    file = folder / "config.json"
    if not file.is_file():
        raise ConfigError(f"no config.json in {where}")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"config.json of {where} is not readable JSON ({' '.join(str(exc).split())})"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config.json of {where} is not a JSON object")
    return data


@functools.cache
def snapshot_index() -> dict[str, object]:
    from hfadapt.hub import snapshot

    try:
        return {row.model_id: row for row in snapshot.read_snapshot()}
    except Exception:  # a broken bundled file must not stop a diagnosis
        return {}


def snapshot_row(model_id: str) -> Any | None:
    """The bundled snapshot's record of a Hub id, or None."""
    return snapshot_index().get(model_id)


def remote_code_reason(config: dict[str, Any] | None, model_id: str | None = None) -> str | None:
    """Why this model needs its repository's own code, or None when transformers' code runs it."""
    auto_map = (config or {}).get("auto_map")
    if auto_map:
        classes = auto_map.values() if isinstance(auto_map, dict) else auto_map
        names = ", ".join(
            sorted({str(c[0] if isinstance(c, list) else c).split("--")[-1] for c in classes})
        )
        return f"config.json maps its classes to code in the repository (auto_map: {names})"
    row = snapshot_row(model_id) if model_id else None
    if row is not None and row.is_custom_code:
        return "the Hub marks it custom_code (bundled snapshot)"
    return None


def refuse_snapshot_custom_code(ref: str | os.PathLike[str], trust_remote_code: bool) -> None:
    """A Hub id the bundled snapshot marks custom_code is refused before any network or cache
    lookup: the verdict does not depend on whether its files can be had."""
    text = os.fspath(ref)
    if trust_remote_code or Path(text).expanduser().exists():
        return
    row = snapshot_row(text)
    if row is not None and row.is_custom_code:
        raise CustomCodeError(
            f"{text} needs its own code: the Hub marks it custom_code (bundled snapshot); "
            f"review it, then rerun with {option('trust_remote_code')}"
        )
