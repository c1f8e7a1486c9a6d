"""Structural mode: judge a model's *code and shapes* without its weights. The real config when
it can be had (a local folder, the HF cache, the Hub, else the configs bundled with hfadapt),
else the model_type's defaults; layers truncated, every dimension, head_dim and alignment kept,
seeded random weights, the vocabulary shrunk. (The structural signature sweeps dedupe on is in
hfadapt.loading.signature, re-exported here.)"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hfadapt.errors import ConfigError, ModelNotFoundError
from hfadapt.hub import resolve as locate
from hfadapt.loading import load as loading
from hfadapt.loading import remote, sizing
from hfadapt.loading.attention_logits import seeded_row
from hfadapt.loading.load import LoadedModel
from hfadapt.loading.pooling import PoolingSpec, pooling_from_folder
from hfadapt.loading.probes import SPECIAL_ID_FIELDS, random_probe_vocab

# The signature lives in hfadapt.loading.signature; re-exported here, where sweeps look for it.
# Embedding tables past STRUCTURAL_VOCAB are shrunk: the rows do not change what lowers, only
# memory (the signature records the vocabulary as judged, so the constant lives there).
from hfadapt.loading.signature import (
    ALIGNMENT,
    SIGNATURE_VERSION,
    STRUCTURAL_VOCAB,
    config_from_dict,
    lowering_signature,
    signature_fields,
    structural_signature,
)

# What a stand-in's weights are drawn at: all-MiniLM-L6-v2's statistics, its last layer's
# outliers only from its own width on (docs/design.md, structural stand-ins)
from hfadapt.loading.trained_scale import (
    FINAL_OUTLIERS_FROM_WIDTH,
    draw_trained_scale,
    stand_in_scale,
)

STRUCTURAL_LAYERS = 2
STRUCTURAL_SEED = 0

__all__ = [
    "ALIGNMENT",
    "SIGNATURE_VERSION",
    "STRUCTURAL_LAYERS",
    "STRUCTURAL_VOCAB",
    "build",
    "config_from_dict",
    "find_config",
    "lowering_signature",
    "shrink_config",
    "signature_fields",
    "structural_signature",
    "sub_configs",
    "truncate_layers",
]


_WHERE = {
    "folder": "the model folder",
    "cache": "the HF cache",
    "hub": "the Hub",
    "bundled": "hfadapt's bundled real config",
    "defaults": "the model_type's defaults (transformers)",
    "given": "the config it was handed",
}
GIVEN = "structural:given"  # the source of a config handed over without one


# ---- the config ----------------------------------------------------------------------------


def find_config(
    ref: str | os.PathLike[str], hub: locate.HubOptions | None = None
) -> tuple[dict[str, Any], str, Path | None]:
    """(config dict, where it came from, folder with its files) for a folder or a Hub id.

    Order: the folder itself; the HF cache; the Hub when reachable; hfadapt's bundled real
    configs; the bundled snapshot's model_type (``where == "defaults"``).
    """
    from hfadapt.hub import snapshot

    text = os.fspath(ref)
    path = Path(text).expanduser()
    if path.exists() or locate.looks_like_path(text):
        source = locate.resolve(text)
        return locate.read_config(source.folder, text), "folder", source.folder
    cached = locate.cached_file(text, "config.json", hub)
    if cached is not None:
        return locate.read_config(cached.parent, text), "cache", cached.parent
    online = not (hub and hub.local_files_only) and locate.hub_status()[0]
    if online:
        try:
            got = locate.download(text, "config.json", hub)
            return locate.read_config(got.parent, text), "hub", got.parent
        except ModelNotFoundError:
            pass  # the snapshot may still know it
    bundled = snapshot.bundled_config_dir(text)
    if bundled is not None:
        return locate.read_config(bundled, text), "bundled", bundled
    row = locate.snapshot_row(text)
    if row is not None and row.model_type:
        raw: dict[str, Any] = {"model_type": row.model_type}
        if row.architectures:
            raw["architectures"] = list(row.architectures)
        return raw, "defaults", None
    if row is not None:
        raise ConfigError(
            f"{text} has no model_type in the bundled snapshot (no usable config on the Hub)"
        )
    at = f" at revision {hub.revision}" if hub and hub.revision else ""
    why = (
        "only local files may be used"
        if hub and hub.local_files_only
        else "the Hub cannot be reached"
    )
    raise ModelNotFoundError(
        f"{text}{at} is not a folder, not in the HF cache, not in hfadapt's snapshot, and {why}"
    )


def _representative_layers(config: Any, total: int, layers: int) -> list[int]:
    """Which layers to keep: the first of each distinct layer type (sliding/full attention...)
    so every code path stays, then the earliest others, up to ``layers``."""
    kinds = getattr(config, "layer_types", None)
    keep: list[int] = []
    if isinstance(kinds, list) and len(kinds) == total:
        seen: set[str] = set()
        for i, kind in enumerate(kinds):
            if str(kind) not in seen and len(keep) < layers:
                seen.add(str(kind))
                keep.append(i)
    for i in range(total):
        if len(keep) >= layers:
            break
        if i not in keep:
            keep.append(i)
    return sorted(keep)


_DECODER_LAYERS = ("decoder_layers", "num_decoder_layers")


def truncate_layers(config: Any, layers: int = STRUCTURAL_LAYERS) -> str | None:
    """Keep ``layers`` layers (per-layer lists cut to match); a note, or None if nothing changed."""
    total = getattr(config, "num_hidden_layers", None)
    if not isinstance(total, int) or total <= layers:
        return None
    keep = _representative_layers(config, total, layers)
    for key, value in list(vars(config).items()):
        if isinstance(value, list) and len(value) == total and not key.startswith("_"):
            setattr(config, key, [value[i] for i in keep])
    config.num_hidden_layers = len(keep)
    note = f"layers truncated {total} -> {len(keep)} (kept {keep})"
    # encoder-decoder configs alias num_hidden_layers to the encoder's count (BART's
    # attribute_map): their decoder would keep every layer
    for key in _DECODER_LAYERS:
        count = getattr(config, key, None)
        if isinstance(count, int) and not isinstance(count, bool) and count > layers:
            setattr(config, key, layers)
            note += f"; {key} {count} -> {layers}"
    return note


def shrink_vocab(config: Any, vocab: int = STRUCTURAL_VOCAB) -> str | None:
    """Shrink the embedding table to ``vocab`` rows. Special ids past it (Qwen's sit at the end
    of a 151k vocabulary) are renumbered to the lowest free ids: with random weights an id is
    only a row index, and the code paths they drive (padding_idx, position ids) stay the same."""
    size = getattr(config, "vocab_size", None)
    if not isinstance(size, int) or size <= vocab:
        return None
    small = {i for i in _special_values(config) if i < vocab}
    fresh = (i for i in range(vocab) if i not in small)
    renumbered = {
        old: next(fresh) for old in sorted({i for i in _special_values(config) if i >= vocab})
    }
    for name in SPECIAL_ID_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value in renumbered:
            setattr(config, name, renumbered[value])
        elif isinstance(value, list):
            setattr(
                config, name, [renumbered.get(v, v) if isinstance(v, int) else v for v in value]
            )
    config.vocab_size = vocab
    moved = f"; special ids renumbered {renumbered}" if renumbered else ""
    return f"vocab shrunk {size} -> {vocab}{moved}"


def sub_configs(config: Any) -> list[tuple[str, Any]]:
    """The nested configs of a composite model (``text_config``, ``vision_config``,
    ``audio_config``, T5Gemma's ``encoder``/``decoder``...), by attribute name."""
    names = getattr(type(config), "sub_configs", None) or {}
    out = []
    for name in names:
        value = getattr(config, name, None)
        if value is not None and hasattr(value, "to_dict") and value is not config:
            out.append((name, value))
    return out


def shrink_config(
    config: Any, layers: int = STRUCTURAL_LAYERS, vocab: int = STRUCTURAL_VOCAB
) -> list[str]:
    """Truncate the layers and shrink the vocabulary of ``config`` and of every nested config
    of a composite model (a vision tower's ``depth``, an audio encoder's ``encoder_layers``:
    the configs alias them to ``num_hidden_layers``), every width kept. Notes of what changed."""
    notes = [n for n in (truncate_layers(config, layers), shrink_vocab(config, vocab)) if n]
    for name, sub in sub_configs(config):
        notes += [f"{name}: {n}" for n in shrink_config(sub, layers, vocab)]
    return notes


def _special_values(config: Any) -> list[int]:
    out: list[int] = []
    for name in SPECIAL_ID_FIELDS:
        value = getattr(config, name, None)
        out.extend(
            v
            for v in (value if isinstance(value, list) else [value])
            if isinstance(v, int) and v >= 0
        )
    return out


# ---- the model -----------------------------------------------------------------------------


def start_ids(config: Any, tokenizer: Any = None) -> list[int]:
    """The ids of the start and delimiter tokens ([CLS]/BOS, [SEP]/EOS) the stand-in's inputs
    carry: the tokenizer's, else the config's (the rows a massive activation sits on)."""
    found: list[int] = []
    for name in ("cls_token_id", "bos_token_id", "sep_token_id", "eos_token_id"):
        for source in (tokenizer, config):
            value = getattr(source, name, None) if source is not None else None
            values = value if isinstance(value, list) else [value]
            found += [v for v in values if isinstance(v, int) and v >= 0 and v not in found]
    return found


def _tokenizer(
    where: str,
    ref: str,
    folder: Path | None,
    trust_remote_code: bool,
    hub: locate.HubOptions | None = None,
) -> tuple[Any, str | None]:
    """The model's tokenizer when it can be had without weights, else (None, why not)."""
    from transformers import AutoTokenizer

    hub = hub or locate.HubOptions()
    if where == "folder" and folder is not None and loading.has_tokenizer_files(folder):
        target, kwargs = str(folder), {}
    elif where in ("cache", "hub"):
        target = ref
        offline = where == "cache" and (hub.local_files_only or locate.env_offline())
        kwargs = {
            "cache_dir": str(hub.cache()),
            "local_files_only": offline,
            # offline: the snapshot the config came from; a branch name needs the Hub
            "revision": folder.name if offline and folder is not None else hub.revision,
            "token": hub.token,
        }
    else:
        return None, f"no tokenizer for a config from {where}: random probe ids"
    try:
        with loading.quiet_transformers():
            return AutoTokenizer.from_pretrained(
                target, trust_remote_code=trust_remote_code, **kwargs
            ), None
    except Exception as exc:
        return None, f"tokenizer unavailable ({type(exc).__name__}): random probe ids"


@dataclass(frozen=True)
class _FoundConfig:
    raw: dict[str, Any]
    where: str  # a key of _WHERE
    folder: Path | None
    reason: str | None  # why the model needs its own code (None: it does not, or translated)
    translation: Any = None  # the native translation judged instead of remote code


def _config(
    text: str,
    trust_remote_code: bool,
    hub: locate.HubOptions | None,
    given: dict[str, Any] | None,
) -> _FoundConfig:
    """The config to build from: ``given`` (in memory), or found for ``text``; a remote-code
    config is replaced by its native translation unless the model's code may run."""
    row = None
    if given is not None:
        raw, where, folder = dict(given), "given", None
    else:
        remote.refuse_untranslatable(text, trust_remote_code)
        row = remote.snapshot_custom_row(text)
        try:
            raw, where, folder = find_config(text, hub)
        except ConfigError:
            if trust_remote_code or row is None:
                raise
            raw, where, folder = {}, "defaults", None  # no model_type: the row's class decides
    named = text if where not in ("folder", "given") else None
    reason = locate.remote_code_reason(raw, named)
    translation = None
    if reason and not trust_remote_code:
        translation = remote.translation_of(text, raw, reason, row if where == "defaults" else None)
        raw, reason = translation.config, None
    tower = remote.text_tower_of(raw, reason) if translation is None else None
    if tower is not None:  # a multimodal embedder: its text model is what embeds text
        raw, translation = tower.config, tower
    loading.check_model_type(raw, text, custom=bool(reason))
    return _FoundConfig(raw, where, folder, reason, translation)


def _instantiate(config: Any, text: str, seed: int, trust_remote_code: bool, meta: bool) -> Any:
    """The model of ``config`` with seeded random weights (``meta``: without any weights)."""
    import torch

    placement = torch.device("meta") if meta else contextlib.nullcontext()
    with loading.quiet_transformers(), torch.random.fork_rng(devices=[]), placement:
        torch.manual_seed(seed)
        try:
            cls = loading.model_class(config, trust_remote_code)
            if hasattr(cls, "from_config"):  # the Auto classes
                return cls.from_config(
                    config, dtype=torch.float32, trust_remote_code=trust_remote_code
                )
            return cls._from_config(config, dtype=torch.float32)  # a concrete class (T5Encoder)
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(
                f"no model can be built from the config of {text}: {' '.join(str(exc).split())[:200]}"
            ) from exc


def _at_trained_scale(model: Any, built: Any, seed: int, tokenizer: Any) -> str:
    """Draw the stand-in's weights at trained scale (the initializer's weights hide device
    faults a trained model shows); the note that says so."""
    table = getattr(built, "vocab_size", None)
    vocab = table if isinstance(table, int) else None
    starts = start_ids(built, tokenizer)
    row = seeded_row(vocab or STRUCTURAL_VOCAB, starts, seed)
    hidden = getattr(built, "hidden_size", None)
    width = hidden if isinstance(hidden, int) else None
    scale = stand_in_scale(width)
    drawn = draw_trained_scale(model, seed, scale, vocab, starts, sharpen_on=row)
    sharpened = "attention not sharpened" if drawn.sharpened is None else drawn.sharpened.describe()
    if scale.final_outlier_share > 0:
        last = "its last layer's outlier channels drawn"
    elif width is None:
        last = "its last layer's outliers not drawn (no hidden_size in its config)"
    else:
        last = (
            f"its last layer's outliers not drawn (width {width}, under the "
            f"{FINAL_OUTLIERS_FROM_WIDTH} they were measured at)"
        )
    return (
        "weights drawn at trained scale (statistics of all-MiniLM-L6-v2: "
        f"linear gain {scale.linear_gain:.2f}/sqrt(fan_in), norm scale "
        f"{scale.norm_gain_mean:.2f}; {last}); {sharpened}"
    )


def build(
    ref: str | os.PathLike[str],
    *,
    layers: int = STRUCTURAL_LAYERS,
    vocab: int = STRUCTURAL_VOCAB,
    seed: int = STRUCTURAL_SEED,
    trust_remote_code: bool = False,
    hub: locate.HubOptions | None = None,
    config: dict[str, Any] | None = None,
    config_source: str | None = None,
) -> LoadedModel:
    """A structural stand-in for ``ref``: its real (or default) config, truncated, random weights
    (``hub``: revision, token, cache_dir, local_files_only for finding the config).

    ``config``: the model's config.json as a dict, used instead of finding one (no tokenizer:
    random probe ids); ``config_source`` names where it came from, a source label of
    :mod:`hfadapt.judge.evidence` such as ``structural:crawl`` (default ``structural:given``)."""
    text = os.fspath(ref)
    found = _config(text, trust_remote_code, hub, config)
    with loading.quiet_transformers():
        if found.reason:
            from transformers import AutoConfig

            where = str(found.folder) if found.folder else text
            built = AutoConfig.from_pretrained(where, trust_remote_code=True)
        else:
            built = config_from_dict(found.raw)
    source = (config_source or GIVEN) if found.where == "given" else f"structural:{found.where}"
    origin = f"{_WHERE[found.where]} ({source})" if found.where == "given" else _WHERE[found.where]
    notes = [f"structural: config from {origin}, seeded random weights (seed {seed})"]
    if found.translation is not None:
        notes.append(remote.translation_note(found.translation))
    notes += shrink_config(built, layers, vocab)

    tokenizer, why = _tokenizer(found.where, text, found.folder, trust_remote_code, hub)
    if why:
        notes.append(why)
    # No tokenizer and no vocabulary of its own (a composite vision + text config): no probe can
    # be made, so the judge stops at its probes. The modules are built without their weights
    # (meta tensors): seeding a 4096-wide tower cost a sweep seconds for nothing.
    meta = tokenizer is None and not random_probe_vocab(built)
    if meta:
        notes.append("no probe inputs can be made: modules built without weights (meta tensors)")
    else:  # estimated before any weight exists; narrowed (or skipped) to fit the budget
        notes += sizing.fit(
            built,
            lambda c: _instantiate(c, text, seed, trust_remote_code, True),
            truncate_layers,
            small_member=found.where == "defaults",
            tokenized=tokenizer is not None,
        )
    model = _instantiate(built, text, seed, trust_remote_code, meta)
    if not meta:
        notes.append(_at_trained_scale(model, built, seed, tokenizer))
    model.eval()
    folder = found.folder
    pooling = remote.declared_pooling(found.translation) or (
        pooling_from_folder(folder) if folder is not None else PoolingSpec()
    )
    revision = folder.name if found.where in ("cache", "hub") and folder is not None else None
    return LoadedModel(
        model_id=text,
        model=model,
        config=built,
        tokenizer=tokenizer,
        pooling=pooling,
        source=source,
        revision=revision,
        path=str(folder) if folder else None,
        structural=True,
        notes=notes,
        raw_config=found.raw,
        translated_from=found.translation.evidence() if found.translation is not None else None,
    )
