"""Structural mode: judge a model's *code and shapes* without its weights. The real config when
it can be had (a local folder, the HF cache, the Hub, else the configs bundled with hfadapt),
else the model_type's defaults; layers truncated, every dimension, head_dim and alignment kept,
seeded random weights, the vocabulary shrunk. Also the structural signature sweeps dedupe on."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from hfadapt import loading, locate
from hfadapt.errors import ConfigError, CustomCodeError, ModelNotFoundError
from hfadapt.loading import LoadedModel
from hfadapt.metrics import PoolingSpec, pooling_from_folder
from hfadapt.probes import SPECIAL_ID_FIELDS

STRUCTURAL_LAYERS = 2
# Embedding tables past this are shrunk: the rows do not change what lowers, only memory.
STRUCTURAL_VOCAB = 4096
STRUCTURAL_SEED = 0
# Bump when signature_fields changes meaning, so old and new hashes never collide.
SIGNATURE_VERSION = 1
ALIGNMENT = 64

__all__ = [
    "STRUCTURAL_LAYERS",
    "STRUCTURAL_VOCAB",
    "build",
    "config_from_dict",
    "find_config",
    "signature_fields",
    "structural_signature",
    "truncate_layers",
]


_WHERE = {
    "folder": "the model folder",
    "cache": "the HF cache",
    "hub": "the Hub",
    "bundled": "hfadapt's bundled real config",
    "defaults": "the model_type's defaults (transformers)",
}


# ---- the config ----------------------------------------------------------------------------


def find_config(ref: str | os.PathLike[str]) -> tuple[dict[str, Any], str, Path | None]:
    """(config dict, where it came from, folder with its files) for a folder or a Hub id.

    Order: the folder itself; the HF cache; the Hub when reachable; hfadapt's bundled real
    configs; the bundled snapshot's model_type (``where == "defaults"``).
    """
    from hfadapt import snapshot

    text = os.fspath(ref)
    path = Path(text).expanduser()
    if path.exists() or locate.looks_like_path(text):
        source = locate.resolve(text)
        return locate.read_config(source.folder, text), "folder", source.folder
    cached = locate.cached_file(text, "config.json")
    if cached is not None:
        return locate.read_config(cached.parent, text), "cache", cached.parent
    online, _ = locate.hub_status()
    if online:
        try:
            got = locate.download(text, "config.json")
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
    raise ModelNotFoundError(
        f"{text} is not a folder, not in the HF cache, not in hfadapt's snapshot, and the Hub cannot be reached"
    )


def config_from_dict(raw: dict[str, Any]) -> Any:
    """A transformers config from a config.json dict (missing fields take the type's defaults)."""
    from transformers import AutoConfig

    model_type = str(raw.get("model_type"))
    try:
        config_class = type(AutoConfig.for_model(model_type))
        return config_class.from_dict({k: v for k, v in raw.items() if k != "model_type"})
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(
            f"config of model_type {model_type!r} does not load: {' '.join(str(exc).split())[:200]}"
        ) from exc


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
    return f"layers truncated {total} -> {len(keep)} (kept {keep})"


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


def _tokenizer(
    where: str, ref: str, folder: Path | None, trust_remote_code: bool
) -> tuple[Any, str | None]:
    """The model's tokenizer when it can be had without weights, else (None, why not)."""
    from transformers import AutoTokenizer

    if where == "folder" and folder is not None and loading.has_tokenizer_files(folder):
        target, kwargs = str(folder), {}
    elif where in ("cache", "hub"):
        target = ref
        kwargs = {
            "cache_dir": str(locate.hf_cache_dir()),
            "local_files_only": where == "cache" and locate.env_offline(),
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


def build(
    ref: str | os.PathLike[str],
    *,
    layers: int = STRUCTURAL_LAYERS,
    vocab: int = STRUCTURAL_VOCAB,
    seed: int = STRUCTURAL_SEED,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """A structural stand-in for ``ref``: its real (or default) config, truncated, random weights."""
    import torch

    text = os.fspath(ref)
    locate.refuse_snapshot_custom_code(text, trust_remote_code)
    raw, where, folder = find_config(text)
    reason = locate.remote_code_reason(raw, text if where != "folder" else None)
    if reason and not trust_remote_code:
        raise CustomCodeError(
            f"{text} needs its own code: {reason}; review it, then rerun with --trust-remote-code"
        )
    loading.check_model_type(raw, text, custom=bool(reason))

    with loading.quiet_transformers():
        if reason:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(
                str(folder) if folder else text, trust_remote_code=True
            )
        else:
            config = config_from_dict(raw)
    notes = [f"structural: config from {_WHERE[where]}, seeded random weights (seed {seed})"]
    notes += [n for n in (truncate_layers(config, layers), shrink_vocab(config, vocab)) if n]

    tokenizer, why = _tokenizer(where, text, folder, trust_remote_code)
    if why:
        notes.append(why)
    with loading.quiet_transformers(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            cls = loading.model_class(config, trust_remote_code)
            if hasattr(cls, "from_config"):  # the Auto classes
                model = cls.from_config(
                    config, dtype=torch.float32, trust_remote_code=trust_remote_code
                )
            else:  # a concrete class (T5EncoderModel) builds itself
                model = cls._from_config(config, dtype=torch.float32)
        except (ValueError, TypeError, KeyError) as exc:
            raise ConfigError(
                f"no model can be built from the config of {text}: {' '.join(str(exc).split())[:200]}"
            ) from exc
    model.eval()
    pooling = pooling_from_folder(folder) if folder is not None else PoolingSpec()
    revision = folder.name if where in ("cache", "hub") and folder is not None else None
    return LoadedModel(
        model_id=text,
        model=model,
        config=config,
        tokenizer=tokenizer,
        pooling=pooling,
        source=f"structural:{where}",
        revision=revision,
        path=str(folder) if folder else None,
        structural=True,
        notes=notes,
        raw_config=raw,
    )


# ---- the signature -------------------------------------------------------------------------

# Config fields that switch code paths when present (value recorded as is).
_CODE_PATH_FIELDS = (
    "position_embedding_type",
    "relative_attention",
    "pos_att_type",
    "position_biased_input",
    "attention_bias",
    "mlp_bias",
    "use_bias",
    "norm_bias",
    "qk_layernorm",
    "use_qk_norm",
    "rotary_emb_fraction",
    "partial_rotary_factor",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "scale_embedding",
    "is_decoder",
    "causal",
)
_ACT_FIELDS = (
    "hidden_act",
    "hidden_activation",
    "activation",
    "activation_function",
    "feed_forward_proj",
    "dense_act_fn",
)
_INTERMEDIATE_FIELDS = ("intermediate_size", "hidden_dim", "ffn_dim", "d_ff", "n_inner", "mlp_dim")


def _get(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def _first(config: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        value = _get(config, name)
        if value is not None:
            return value
    return None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def _rope(config: Any) -> Any:
    params = _get(config, "rope_parameters") or _get(config, "rope_scaling")
    if isinstance(params, dict):
        # Per-layer-type dicts (gemma3, modernbert) or one dict: the rope *types* decide code.
        inner = [v for v in params.values() if isinstance(v, dict)]
        types = (
            sorted({str(d.get("rope_type", d.get("type", "default"))) for d in inner})
            if inner
            else [str(params.get("rope_type", params.get("type", "default")))]
        )
        return types
    if _get(config, "rope_theta") is not None or _get(config, "rotary_emb_base") is not None:
        return ["default"]
    return None


def signature_fields(config: Any) -> dict[str, Any]:
    """What decides lowering, as a flat dict: modeling class, activation, positions, attention
    implementation, head_dim, alignment of hidden and intermediate sizes, rope, norm type..."""
    if isinstance(config, dict) and config.get("model_type"):
        with contextlib.suppress(ConfigError):  # an unknown type: read the raw dict
            config = config_from_dict(config)
    model_type = _get(config, "model_type")
    hidden = _first(config, ("hidden_size", "d_model", "dim", "n_embd"))
    heads = _first(config, ("num_attention_heads", "num_heads", "n_heads", "n_head"))
    kv_heads = _get(config, "num_key_value_heads")
    head_dim = _first(config, ("head_dim", "d_kv", "attention_head_size"))
    if head_dim is None and isinstance(hidden, int) and isinstance(heads, int) and heads:
        head_dim = hidden // heads
    intermediate = _first(config, _INTERMEDIATE_FIELDS)
    auto_map = _get(config, "auto_map") or {}
    model_class = (
        auto_map.get("AutoModel") if isinstance(auto_map, dict) else None
    ) or _auto_model_name(model_type)
    attn = _attn_implementation(config, model_type)
    layer_types = _get(config, "layer_types")
    type_vocab = _get(config, "type_vocab_size")
    fields: dict[str, Any] = {
        "v": SIGNATURE_VERSION,
        "model_type": model_type,
        "model_class": model_class,
        "custom_code": bool(auto_map),
        "activation": _first(config, _ACT_FIELDS),
        "attn_implementation": attn,
        "head_dim": head_dim,
        "hidden_mod64": hidden % ALIGNMENT if isinstance(hidden, int) else None,
        "intermediate_mod64": intermediate % ALIGNMENT if isinstance(intermediate, int) else None,
        "gqa": bool(kv_heads and heads and kv_heads != heads),
        "rope": _rope(config),
        "norm": "rms"
        if _get(config, "rms_norm_eps") is not None
        else (
            "layer"
            if _first(config, ("layer_norm_eps", "layer_norm_epsilon", "norm_eps")) is not None
            else None
        ),
        "token_types": None if type_vocab is None else min(int(type_vocab), 2),
        "layer_types": sorted({str(t) for t in layer_types})
        if isinstance(layer_types, list)
        else None,
        "sliding_window": _get(config, "sliding_window") is not None,
    }
    known = _declared_fields(config)
    for name in _CODE_PATH_FIELDS:
        value = _get(config, name)
        # A field the config class does not declare is an extra no modeling code reads
        # (an old BERT config's position_embedding_type under transformers 5).
        if value is not None and (known is None or name in known):
            fields[name] = _jsonable(value)
    return fields


@functools.cache
def _class_fields(config_class: Any) -> frozenset[str]:
    try:
        return frozenset(vars(config_class()))
    except Exception:
        return frozenset()


def _declared_fields(config: Any) -> frozenset[str] | None:
    """The fields the config's class knows (None for a raw dict of an unknown type)."""
    if isinstance(config, dict):
        return None
    fields = _class_fields(type(config))  # type: ignore[arg-type]
    return fields or None


def _attn_implementation(config: Any, model_type: Any) -> str:
    """The attention code the model runs: the one asked for, else the class's default
    (sdpa where the class supports it, else eager); the same for a dict and a bound config."""
    asked = _get(config, "_attn_implementation") or _get(config, "attn_implementation")
    if isinstance(asked, str):
        return asked
    name = _auto_model_name(model_type)
    if name is None:
        return "default"
    import transformers

    try:
        cls = getattr(transformers, name)
    except (AttributeError, ImportError):
        return "default"
    return "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"


def _auto_model_name(model_type: Any) -> str | None:
    if not isinstance(model_type, str):
        return None
    if model_type in loading.ENCODER_ONLY:
        return loading.ENCODER_ONLY[model_type]
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    name = MODEL_MAPPING_NAMES.get(model_type)
    return name if isinstance(name, str) else None


def structural_signature(config: Any) -> str:
    """A stable 16-hex hash of ``signature_fields``: models sharing it share a lowering verdict."""
    blob = json.dumps(signature_fields(config), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
