"""The structural signature: what decides whether a model lowers (modeling class, activation,
position embeddings, attention implementation, every size a device rule reads: hidden size,
heads, key/value heads, head_dim, intermediate size, the vocabulary as judged; rope, norm
type, ...) as a stable hash. Models sharing it share a verdict, so sweeps dedupe on it, and two
models of different shapes never do; the same hash comes from a config.json dict and from the
config object built from it.

The *lowering class* (``lowering_signature``) is the signature without the sizes themselves,
only their alignment modulo the stick: what a narrowed instance must keep (hfadapt.sweep.narrow).
No rule reads the position-table size (``max_position_embeddings``): probes are shorter than
any table, so it is left out."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from typing import Any

from hfadapt.errors import ConfigError
from hfadapt.loading.native import NATIVE_TYPES, register_native_classes
from hfadapt.model_config import ModelConfig

# Bump when signature_fields changes meaning, so old and new hashes never collide.
# 2: the sizes themselves (hidden, heads, kv heads, intermediate, vocabulary as judged).
SIGNATURE_VERSION = 2
ALIGNMENT = 64
# Structural runs shrink embedding tables past this many rows (hfadapt.loading.structural): a
# larger vocabulary is judged as this one, so the signature records min(vocab, this).
STRUCTURAL_VOCAB = 4096
# The signature fields that are sizes; without them (alignment kept) is the lowering class.
SHAPE_FIELDS = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_judged",
)
# Embedding models of encoder-decoder families use the encoder alone (as hfadapt.loading.load does).
ENCODER_ONLY = {"t5": "T5EncoderModel", "mt5": "MT5EncoderModel", "umt5": "UMT5EncoderModel"}

__all__ = [
    "SHAPE_FIELDS",
    "SIGNATURE_VERSION",
    "STRUCTURAL_VOCAB",
    "config_from_dict",
    "lowering_signature",
    "signature_fields",
    "structural_signature",
]


def config_from_dict(raw: dict[str, object]) -> Any:
    """A transformers config from a config.json dict (missing fields take the type's defaults)."""
    from transformers import AutoConfig

    model_type = str(raw.get("model_type"))
    if model_type in NATIVE_TYPES:  # a class hfadapt ships (hfadapt.loading.native)
        register_native_classes()
    try:
        config_class = type(AutoConfig.for_model(model_type))
        return config_class.from_dict({k: v for k, v in raw.items() if k != "model_type"})
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(
            f"config of model_type {model_type!r} does not load: {' '.join(str(exc).split())[:200]}"
        ) from exc


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


def _get(config: ModelConfig, name: str) -> Any:
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def _first(config: ModelConfig, names: tuple[str, ...]) -> Any:
    for name in names:
        value = _get(config, name)
        if value is not None:
            return value
    return None


def _jsonable(value: object) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def _rope(config: ModelConfig) -> Any:
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


def signature_fields(config: ModelConfig) -> dict[str, object]:
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
    vocab = _get(config, "vocab_size")
    fields: dict[str, Any] = {
        "v": SIGNATURE_VERSION,
        "model_type": model_type,
        "hidden_size": hidden if isinstance(hidden, int) else None,
        "num_attention_heads": heads if isinstance(heads, int) else None,
        "num_key_value_heads": kv_heads if isinstance(kv_heads, int) else None,
        "intermediate_size": intermediate if isinstance(intermediate, int) else None,
        "vocab_judged": min(vocab, STRUCTURAL_VOCAB) if isinstance(vocab, int) else None,
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
    # transformers reads is_causal=False off any decoder config (masking_utils): a decoder made
    # bidirectional never shares a verdict with its causal twin (recorded only when False, so
    # every other signature stays as it was)
    if _get(config, "is_causal") is False:
        fields["is_causal"] = False
    return fields


@functools.cache
def _class_fields(config_class: Any) -> frozenset[str]:
    try:
        return frozenset(vars(config_class()))
    except Exception:
        return frozenset()


def _declared_fields(config: ModelConfig) -> frozenset[str] | None:
    """The fields the config's class knows (None for a raw dict of an unknown type)."""
    if isinstance(config, dict):
        return None
    fields = _class_fields(type(config))  # type: ignore[arg-type]
    return fields or None


def _attn_implementation(config: ModelConfig, model_type: object) -> str:
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


def _auto_model_name(model_type: object) -> str | None:
    if not isinstance(model_type, str):
        return None
    if model_type in ENCODER_ONLY:
        return ENCODER_ONLY[model_type]
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    name = MODEL_MAPPING_NAMES.get(model_type)
    return name if isinstance(name, str) else None


def _hash(fields: dict[str, object]) -> str:
    blob = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def structural_signature(config: ModelConfig) -> str:
    """A stable 16-hex hash of ``signature_fields``: models sharing it share a verdict."""
    return _hash(signature_fields(config))


def lowering_signature(config: ModelConfig) -> str:
    """A stable 16-hex hash of the signature without its sizes (their alignment is kept): two
    configs of one lowering class lower alike, so either may stand in for the other."""
    fields = {k: v for k, v in signature_fields(config).items() if k not in SHAPE_FIELDS}
    return _hash(fields)
