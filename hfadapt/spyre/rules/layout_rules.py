"""Config-level device rules (the profile's ``layout`` section): the alignment that decides
whether a model can run on Spyre at all, and the head_dim an adapter must zero-pad. Works on a
``transformers`` config object or a plain ``config.json`` dict, before any weights are loaded."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from hfadapt.errors import SpyreUnsupportedModelError
from hfadapt.model_config import ModelConfig
from hfadapt.spyre.rules.lowering_report import SourceLocation, Violation
from hfadapt.spyre.rules.profile import Profile, load_profile

# Role -> config field names, most specific first. The first field a config really holds names
# the value in messages, so a DistilBERT user reads "dim=312", not "hidden_size=312".
FIELDS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "d_model", "dim", "n_embd"),
    "intermediate_size": (
        "intermediate_size",
        "d_ff",
        "hidden_dim",  # distilbert
        "n_inner",  # nomic_bert (custom code), gpt2-style
        "ffn_dim",
        "encoder_ffn_dim",
    ),
    "num_attention_heads": (
        "num_attention_heads",
        "n_heads",
        "n_head",
        "num_heads",
        "encoder_attention_heads",
    ),
    "head_dim": ("head_dim", "d_kv", "attention_head_size"),
}

# Families whose attention applies rotary position embeddings even when the config names no
# rope field (older configs). Otherwise a rope_* field or a "rotary" position type decides.
ROPE_MODEL_TYPES = frozenset(
    {
        "modernbert",
        "qwen2",
        "qwen3",
        "qwen3_vl_text",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "llama",
        "mistral",
        "nomic_bert",
        "gte",
        "new",  # Alibaba-NLP/new-impl (gte-*-v1.5)
        "eurobert",
        "jina_embeddings_v3",
        "roformer",
    }
)


def _as_dict(config: ModelConfig) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    return dict(vars(config))


def _field(config: ModelConfig, data: Mapping[str, object], role: str) -> tuple[str, Any] | None:
    """(field name, value) of the first field of this role the config holds."""
    for name in FIELDS[role]:
        if data.get(name) is not None:
            return name, data[name]
    # attribute_map aliases (T5Config.hidden_size -> d_model) are not in to_dict()
    for name in FIELDS[role]:
        value = getattr(config, name, None) if not isinstance(config, Mapping) else None
        if isinstance(value, int):
            return name, value
    return None


def uses_rope(config: ModelConfig) -> bool:
    """Whether the model applies rotary position embeddings (head_dim then pads to 128)."""
    data = _as_dict(config)
    if str(data.get("position_embedding_type", "")).lower() in ("rotary", "rope"):
        return True
    if data.get("rope_parameters") or data.get("rope_theta") or data.get("rope_scaling"):
        return True
    if float(data.get("rotary_emb_fraction") or 0) > 0:
        return True
    return str(data.get("model_type", "")) in ROPE_MODEL_TYPES


def head_dim(config: ModelConfig) -> int | None:
    """The attention head size: config.head_dim (or T5's d_kv) when given and positive, else
    hidden_size / num_attention_heads; None when the config says neither. The one definition:
    the adapters' API (``hfadapt.adapters.api.head_dim``) and the stand-ins' attention measure
    (``hfadapt.loading.attention_logits.head_dim``) read this."""
    data = _as_dict(config)
    explicit = _field(config, data, "head_dim")
    if explicit is not None and isinstance(explicit[1], int) and explicit[1] > 0:
        return explicit[1]
    hidden = _field(config, data, "hidden_size")
    heads = _field(config, data, "num_attention_heads")
    if hidden is None or heads is None or not isinstance(heads[1], int) or heads[1] <= 0:
        return None
    return int(hidden[1]) // heads[1]


def _location(config: ModelConfig, field: str, value: object) -> SourceLocation | None:
    """The config class's source file: the call site of a model-level fingerprint, so each
    architecture gets its own fingerprint."""
    if isinstance(config, Mapping):
        return None
    cls = type(config)
    try:
        file = inspect.getsourcefile(cls) or ""
        line = inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        return None
    return SourceLocation(file=file, line=line, function=cls.__name__, code=f"{field}={value}")


def _model_violation(
    rule_id: str,
    message: str,
    config: ModelConfig,
    field: str,
    value: object,
    inferred: bool = False,
) -> Violation:
    return Violation(
        rule_id=rule_id,
        op="model",
        message=message,
        kind="model",
        location=_location(config, field, value),
        inferred=inferred,
    )


def alignment_violations(config: ModelConfig, profile: Profile | None = None) -> list[Violation]:
    """hidden_size / intermediate_size off the stick boundary: the model cannot run at all."""
    p = profile or load_profile()
    spec = p.layout["model_alignment"]
    multiple = int(spec["value"])
    data = _as_dict(config)
    found = []
    for role in spec.get("fields", ("hidden_size", "intermediate_size")):
        hit = _field(config, data, role)
        if hit is None or not isinstance(hit[1], int):
            continue
        name, value = hit
        if value % multiple:
            text = spec["text"].format(field=name, value=value, multiple=multiple)
            found.append(_model_violation(spec["rule"], text, config, name, value))
    return found


def head_dim_violation(config: ModelConfig, profile: Profile | None = None) -> Violation | None:
    """head_dim below or off a stick boundary (128 with RoPE): an adapter zero-pads Q, K, V."""
    p = profile or load_profile()
    spec = p.layout["head_dim"]
    size = head_dim(config)
    if size is None:
        return None
    rope = uses_rope(config)
    multiple = int(spec.get("value_rope", 128) if rope else spec["value"])
    if size % multiple == 0:
        return None
    padded = -(-size // multiple) * multiple
    text = spec["text"].format(head_dim=size, multiple=multiple, padded=padded)
    if rope:
        text += " (RoPE)"
    return _model_violation(spec["rule"], text, config, "head_dim", size)


def attention_head_dim_violation(
    config: ModelConfig, violations: list[Violation], profile: Profile | None = None
) -> Violation | None:
    """The config-level head_dim diagnosis (with its adapter fix) when a graph shows the
    symptom: a matmul whose reduction dimension is the head_dim (Q @ K^T) off the stick
    boundary. Once an adapter pads Q, K and V, the symptom and this entry both go away."""
    p = profile or load_profile()
    hd = head_dim_violation(config, p)
    size = head_dim(config)
    if hd is None or size is None:
        return None
    matmul_rule = p.layout["matmul_k_multiple"]["rule"]
    for v in violations:
        if v.rule_id == matmul_rule and v.shapes and v.shapes[0] and v.shapes[0][-1] == size:
            return hd
    return None


def check_model(config: ModelConfig, profile: Profile | None = None) -> list[Violation]:
    """Every config-level violation of the model: alignment first, then head_dim."""
    found = alignment_violations(config, profile)
    hd = head_dim_violation(config, profile)
    if hd is not None:
        found.append(hd)
    return found


def ensure_supported(config: ModelConfig, profile: Profile | None = None) -> None:
    """Raise SpyreUnsupportedModelError when the model cannot be lowered at all (before any
    compile): its hidden or intermediate size is not a multiple of the stick size."""
    p = profile or load_profile()
    found = alignment_violations(config, p)
    if found:
        what = "; ".join(v.message for v in found)
        raise SpyreUnsupportedModelError(
            p.message("unsupported_model", what=what), rule_id=found[0].rule_id
        )
