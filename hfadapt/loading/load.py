"""Load a model for judging with its real weights and tokenizer (``from_pretrained``, from a
folder, the HF cache, or the Hub; see hfadapt.hub.resolve for finding it). Every way it can go wrong
is a typed error with one clear line; a model that needs its repository's own code is refused
unless ``trust_remote_code`` is given."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hfadapt.errors import (
    ConfigError,
    CustomCodeError,
    ModelNotFoundError,
    TokenizerError,
    WeightsError,
    option,
)
from hfadapt.hub.resolve import (
    HubOptions,
    ModelSource,
    download_if_present,
    env_offline,
    hf_cache_dir,
    hub_endpoint,
    hub_status,
    read_config,
    refuse_snapshot_custom_code,
    remote_code_reason,
    resolve,
    snapshot_index,
)
from hfadapt.hub.resolve import download as _download
from hfadapt.loading.pooling import PoolingSpec, pooling_from_folder
from hfadapt.loading.remote import (
    declared_pooling,
    load_translated,
    refuse_untranslatable,
    text_tower_model,
    text_tower_of,
    translation_of,
)
from hfadapt.loading.signature import ENCODER_ONLY
from hfadapt.loading.task_adapter_files import peft_adapter_files
from hfadapt.loading.translate import Translation, text_model_class

if TYPE_CHECKING:
    from transformers import PretrainedConfig

# Any one of these makes a folder's tokenizer loadable; tokenizer_config.json alone does not
# (AutoTokenizer then builds an empty tokenizer instead of failing).
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "spm.model",
)
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")
# Missing checkpoint keys that are expected: a pooler embedding models do not use.
_OPTIONAL_KEYS = ("pooler.",)

# Re-exported: loading is where most callers look for them.
__all__ = [
    "HubOptions",
    "LoadedModel",
    "ModelSource",
    "check_model_type",
    "env_offline",
    "hf_cache_dir",
    "hub_status",
    "load",
    "model_class",
    "quiet_transformers",
    "read_config",
    "refuse_snapshot_custom_code",
    "remote_code_reason",
    "resolve",
    "snapshot_index",
]


@dataclass
class LoadedModel:
    """A model ready to judge: fp32, eval mode, on CPU, with what is needed to probe it."""

    model_id: str
    model: Any  # torch.nn.Module
    config: Any  # transformers.PretrainedConfig
    tokenizer: Any | None
    pooling: PoolingSpec = field(default_factory=PoolingSpec)
    source: str = "folder"  # folder | cache | hub | structural:<where the config came from>
    revision: str | None = None
    path: str | None = None
    structural: bool = False
    notes: list[str] = field(default_factory=list)
    raw_config: dict[str, Any] | None = None  # config.json as read: what the signature hashes
    # A remote-code model judged as its native translation: hfadapt.loading.translate's evidence.
    translated_from: dict[str, Any] | None = None
    # Repository files an online load asked the Hub for and got 404 (a task adapter of jina v5
    # nano), each with where it was asked: hfadapt.loading.lora refuses to judge without them.
    absent_on_hub: dict[str, str] = field(default_factory=dict)

    @property
    def model_type(self) -> str | None:
        return getattr(self.config, "model_type", None)


# ---- what is it ----------------------------------------------------------------------------


def check_model_type(config: dict[str, object], where: str, *, custom: bool = False) -> str:
    """The config's model_type, which transformers must know (unless the repo brings its code)."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ConfigError(
            f"config.json of {where} has no model_type, so no architecture can be chosen"
        )
    from hfadapt.hub.configs import known_model_types
    from hfadapt.loading.native import NATIVE_TYPES

    if not custom and model_type not in known_model_types() and model_type not in NATIVE_TYPES:
        import transformers

        raise ConfigError(
            f"config.json of {where} has model_type {model_type!r}, which transformers "
            f"{transformers.__version__} does not know"
        )
    return model_type


def check_weights(folder: Path, where: str) -> list[Path]:
    """The folder's weight files, with safetensors headers read: WeightsError if none or corrupt."""
    files = sorted({p for pattern in WEIGHT_GLOBS for p in folder.glob(pattern)})
    if not files:
        raise WeightsError(
            f"no weights in {where} (expected model.safetensors or pytorch_model.bin)"
        )
    from safetensors import safe_open

    for file in files:
        if file.suffix != ".safetensors":
            continue
        try:
            with safe_open(str(file), framework="pt") as fh:
                fh.keys()
        except Exception as exc:  # SafetensorError is not importable under a stable name
            raise WeightsError(
                f"{file.name} in {where} is corrupt: {' '.join(str(exc).split())}"
            ) from exc
    return files


def has_tokenizer_files(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES) or any(folder.glob("*.model"))


# ---- loading -------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars or load reports on the user's terminal; loading info is recorded instead."""
    from transformers.utils import logging as tlog

    verbosity, bars = tlog.get_verbosity(), tlog.is_progress_bar_enabled()
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()
    try:
        yield
    finally:
        tlog.set_verbosity(verbosity)
        if bars:
            tlog.enable_progress_bar()


def model_class(config: PretrainedConfig, trust_remote_code: bool = False) -> Any:
    """The class an embedding run instantiates: AutoModel, or the encoder of a T5 family."""
    import transformers

    model_type = getattr(config, "model_type", "")
    # a text tower's own class where AutoModel maps none (CLIP-like text models)
    name = ENCODER_ONLY.get(model_type) or text_model_class(model_type)
    if name and not trust_remote_code:
        return getattr(transformers, name)
    return transformers.AutoModel


def _weights_error(exc: BaseException, where: str) -> WeightsError | None:
    text = " ".join(str(exc).split())
    kind = type(exc).__name__
    if kind == "SafetensorError" or "deserializ" in text:
        return WeightsError(f"weights of {where} are corrupt: {text[:200]}")
    if "size mismatch" in text.lower() or "ignore_mismatched_sizes" in text:
        return WeightsError(f"weights of {where} do not fit its config.json (tensor shapes differ)")
    if isinstance(exc, OSError) and (
        "no file named" in text or ".safetensors" in text or ".bin" in text
    ):
        return WeightsError(f"weights of {where} cannot be read: {text[:200]}")
    return None


def _load_kwargs(source: ModelSource, online: bool, hub: HubOptions) -> tuple[str, dict[str, Any]]:
    if source.kind == "folder":
        return str(source.folder), {}
    return source.model_id, {
        "cache_dir": str(hub.cache()),
        "local_files_only": not online,
        # offline: the cached snapshot found (a branch name needs the Hub to be resolved)
        "revision": (hub.revision if online else source.revision),
        "token": hub.token,
    }


def load(
    ref: str | os.PathLike[str],
    *,
    trust_remote_code: bool = False,
    hub: HubOptions | None = None,
) -> LoadedModel:
    """Load ``ref`` with its real weights and tokenizer, in fp32 on CPU, in eval mode. ``hub``:
    revision, token, cache_dir and local_files_only, as from_pretrained takes them.

    Raises ModelNotFoundError, ConfigError, WeightsError, TokenizerError (all InputError) and
    CustomCodeError when the model needs remote code that was not trusted.
    """

    hub = hub or HubOptions()
    refuse_untranslatable(ref, trust_remote_code)
    source = resolve(ref, hub)
    where = source.ref
    raw = read_config(source.folder, where)
    reason = remote_code_reason(raw, source.model_id if source.kind != "folder" else None)
    translation = None
    if reason and not trust_remote_code:
        translation = translation_of(where, raw, reason)
        raw, reason = translation.config, None
    tower = text_tower_of(raw, reason) if translation is None else None
    check_model_type(raw, where, custom=bool(reason))

    online = source.kind == "hub" or (
        source.kind == "cache"
        and not hub.local_files_only
        and not env_offline()
        and hub_status()[0]
    )
    if source.kind == "folder":
        check_weights(source.folder, where)
        if not has_tokenizer_files(source.folder):
            raise TokenizerError(
                f"no tokenizer in {where} (expected tokenizer.json, vocab.txt or a sentencepiece model)"
            )
    elif not online and not any(any(source.folder.glob(g)) for g in WEIGHT_GLOBS):
        raise ModelNotFoundError(
            f"only the config of {where} is in the HF cache, not its weights, and the Hub cannot be reached: "
            "download it first (the config alone is enough for a structural diagnosis)"
        )

    name, kwargs = _load_kwargs(source, online, hub)
    absent = _fetch_translated(source, translation, hub) if translation and online else {}
    with quiet_transformers():
        if translation is not None:
            model, config, notes = load_translated(
                check_weights(source.folder, where), translation, where, model_class
            )
        else:
            model, config, notes = _load_stock(name, kwargs, where, trust_remote_code)
        if tower is not None:  # a multimodal embedder: its text model, with its weights
            model, config, more = text_tower_model(model, tower, where)
            notes, raw = notes + more, tower.config
        tokenizer = _tokenizer(name, kwargs, where, trust_remote_code)

    model.eval()
    if online and source.kind != "folder":
        _fetch_pooling_files(source, hub)
    return LoadedModel(
        model_id=source.model_id if source.kind != "folder" else where,
        model=model,
        config=config,
        tokenizer=tokenizer,
        pooling=declared_pooling(translation) or pooling_from_folder(source.folder),
        source=source.kind,
        revision=source.revision,
        path=str(source.folder),
        notes=notes,
        raw_config=raw,
        translated_from=judged_as.evidence() if (judged_as := translation or tower) else None,
        absent_on_hub=absent,
    )


def _tokenizer(name: str, kwargs: dict[str, object], where: str, trust_remote_code: bool) -> Any:
    """The model's tokenizer (TokenizerError, or CustomCodeError when it needs its own code)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code, **kwargs)
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise CustomCodeError(
                f"the tokenizer of {where} needs its own code; rerun with {option('trust_remote_code')}"
            ) from exc
        raise TokenizerError(
            f"the tokenizer of {where} does not load: {' '.join(str(exc).split())[:200]}"
        ) from exc
    except Exception as exc:
        raise TokenizerError(
            f"the tokenizer of {where} does not load: {' '.join(str(exc).split())[:200]}"
        ) from exc


def _load_stock(
    name: str, kwargs: dict[str, object], where: str, trust_remote_code: bool
) -> tuple[Any, Any, list[str]]:
    """(model, config, notes) with transformers' from_pretrained: the stock (or trusted) class."""
    import torch
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(
            f"config.json of {where} does not load: {' '.join(str(exc).split())[:200]}"
        ) from exc
    try:
        model, info = model_class(config, trust_remote_code).from_pretrained(
            name,
            config=config,
            dtype=torch.float32,
            output_loading_info=True,
            trust_remote_code=trust_remote_code,
            # transformers 5.25+ kernelizes every model it loads (hub kernels swapped into
            # layer forwards) unless told not to: the judged code is the stock code the card
            # runs, and loading must not need the ``kernels`` package
            use_kernels=False,
            **kwargs,
        )
    except Exception as exc:
        mapped = _weights_error(exc, where)
        if mapped is None:
            raise
        raise mapped from exc
    missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith(_OPTIONAL_KEYS))
    if missing:
        raise WeightsError(
            f"weights of {where} lack {len(missing)} tensor(s) the model needs, e.g. {missing[0]}"
        )
    unexpected = info.get("unexpected_keys")
    return (
        model,
        config,
        ([f"unexpected checkpoint keys ignored: {len(unexpected)}"] if unexpected else []),
    )


def _fetch_translated(
    source: ModelSource, translation: Translation, hub: HubOptions
) -> dict[str, str]:
    """Online, the files a translated model is loaded from besides config.json, into the
    snapshot its config came from (that commit, with ``hub``'s token and cache): the weights
    when the snapshot has none, and every task's PEFT adapter files when the family keeps them
    beside the weights (jina v5 nano: ``adapters/<task>/``). Returns the adapter files the Hub
    answered 404 for, each with where it was asked; raises for any other failure."""
    pinned = dataclasses.replace(hub, revision=source.revision or hub.revision)
    if not any(any(source.folder.glob(g)) for g in WEIGHT_GLOBS):
        _download(source.model_id, "model.safetensors", pinned)
    absent: dict[str, str] = {}
    for filename in peft_adapter_files(translation.evidence()):
        if (source.folder / filename).is_file():
            continue
        if download_if_present(source.model_id, filename, pinned) is None:
            absent[filename] = f"404 at {hub_endpoint()}, revision {pinned.revision}"
    return absent


def _fetch_pooling_files(source: ModelSource, hub: HubOptions) -> None:
    """Best effort: the sentence-transformers files that say how the model pools, and those of
    the heads after its transformer (hfadapt.loading.heads: their configs and weights)."""
    from hfadapt.loading.pipeline import head_files

    for filename in ("modules.json", "1_Pooling/config.json"):
        with contextlib.suppress(Exception):
            _download(source.model_id, filename, hub)
    for filename in head_files(source.folder):
        with contextlib.suppress(Exception):
            _download(source.model_id, filename, hub)
