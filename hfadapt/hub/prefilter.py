"""Which listed models a coverage sweep skips, and why: the hf-adapters weekly scan's prefilter
(rerankers, ONNX/GGUF/MLX-only and adapter-only repos, MoE, over 60B parameters, and
feature-extraction entries that are not text embedders). A crawl stores every excluded model
with its reason; nothing is dropped silently. The reason strings are persisted: add, never rename.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hfadapt.hub.catalog import HubRecord

RERANKER = "reranker"
ONNX_GGUF_MLX = "onnx_gguf_mlx_only"
ADAPTER_ONLY = "adapter_only"
MOE = "moe"
OVER_60B = "over_60b"
NOT_TEXT_EMBEDDING = "not_text_embedding"

# In the order they are checked; a model is excluded for the first that applies.
REASONS = (RERANKER, ONNX_GGUF_MLX, ADAPTER_ONLY, MOE, OVER_60B, NOT_TEXT_EMBEDDING)

MAX_PARAMETERS = 60_000_000_000

# hf-adapters (utils/fetch_top_embedding_models.py, utils/hf_model_catalog.py) markers.
RERANKER_MARKERS = ("rerank", "cross-encoder", "cross_encoder")
NON_NATIVE_MARKERS = ("onnx", "gguf", "mlx")
MOE_MODEL_TYPES = frozenset(
    {"mixtral", "qwen2_moe", "qwen3_moe", "dbrx", "jamba", "arctic", "olmoe", "gpt_oss"}
)
MOE_MODEL_TYPE_PREFIXES = ("deepseek_v2", "deepseek_v3", "deepseek_v4")
MOE_ARCH_MARKERS = ("mixtral", "moe", "dbrx", "jamba", "arctic", "olmoe", "deepseek", "gptoss")
MULTIMODAL_MARKERS = (
    "clip",
    "vision",
    "_vl",
    "vl_",
    "vit",
    "blip",
    "audio",
    "wav2vec",
    "hubert",
    "wavlm",
    "mimi",
    "encodec",
    "whisper",
    "speecht5",
    "sew",
    "unispeech",
    "data2vec-audio",
    "videoprism",
    "video",
    "owlvit",
    "groupvit",
    "_omni",
    "omni",
)
MULTIMODAL_TAGS = frozenset({"image-feature-extraction", "multimodal", "vision", "audio"})

# Weights transformers loads itself; anything else (ONNX, GGUF, an adapter) needs another runtime.
_NATIVE_WEIGHTS = re.compile(
    r"(^|/)(pytorch_model|model)(-\d+-of-\d+)?\.(bin|safetensors)(\.index\.json)?$"
)
_NON_NATIVE_FILES = re.compile(r"\.(onnx|gguf|ort)$|(^|/)onnx/|(^|/)openvino/")


def _lower(items: Iterable[str] | None) -> set[str]:
    return {str(t).lower() for t in items or ()}


def is_reranker(model_id: str, tags: Iterable[str] | None) -> bool:
    lowered = model_id.lower()
    if any(m in lowered for m in RERANKER_MARKERS):
        return True
    return any(m in t for t in _lower(tags) for m in RERANKER_MARKERS)


def is_moe(
    model_type: str | None, architectures: Iterable[str], tags: Iterable[str] | None
) -> bool:
    if any("moe" in t for t in _lower(tags)):
        return True
    kind = (model_type or "").lower()
    if kind in MOE_MODEL_TYPES or kind.startswith(MOE_MODEL_TYPE_PREFIXES):
        return True
    arch = " ".join(architectures).lower()
    return any(m in arch for m in MOE_ARCH_MARKERS)


def is_multimodal(
    model_type: str | None, architectures: Iterable[str], tags: Iterable[str] | None
) -> bool:
    kind = (model_type or "").lower()
    arch = " ".join(architectures).lower()
    if any(m in kind or m in arch for m in MULTIMODAL_MARKERS):
        return True
    return bool(_lower(tags) & MULTIMODAL_TAGS)


def has_native_weights(files: Iterable[str]) -> bool:
    return any(_NATIVE_WEIGHTS.search(f) for f in files)


def _non_native_only(rec: HubRecord) -> bool:
    lowered = rec.id.lower()
    if any(m in lowered for m in NON_NATIVE_MARKERS):
        return True
    if (rec.library or "").lower() in NON_NATIVE_MARKERS:
        return True
    if rec.files is not None and not has_native_weights(rec.files):
        return any(_NON_NATIVE_FILES.search(f) for f in rec.files)
    return False


def _adapter_only(rec: HubRecord) -> bool:
    if (rec.library or "").lower() == "peft":
        return True
    if rec.files is None:
        return False
    names = {f.rsplit("/", 1)[-1] for f in rec.files}
    return "adapter_config.json" in names and not has_native_weights(rec.files)


def _text_embedding_signal(rec: HubRecord) -> bool:
    # Audio and vision encoders share the feature-extraction tag; a sentence-transformers
    # library or tag is what marks a text embedder. Unknown without tags: keep the model.
    if rec.tags is None or rec.library == "sentence-transformers":
        return True
    tags = _lower(rec.tags)
    return "sentence-similarity" in tags or "sentence-transformers" in tags


def exclusion_reason(rec: HubRecord) -> str | None:
    """Why the sweep should skip this model (one of REASONS), or None to keep it."""
    if is_reranker(rec.id, rec.tags):
        return RERANKER
    if _non_native_only(rec):
        return ONNX_GGUF_MLX
    if _adapter_only(rec):
        return ADAPTER_ONLY
    moe = (
        rec.is_moe
        if rec.is_moe is not None
        else is_moe(rec.model_type, rec.architectures, rec.tags)
    )
    if moe:
        return MOE
    # Only a count from the weights: a size read off the name ("...-ft-Llama-3-70B") misleads.
    if (
        rec.parameters_exact
        and rec.num_parameters is not None
        and rec.num_parameters > MAX_PARAMETERS
    ):
        return OVER_60B
    if not _text_embedding_signal(rec):
        return NOT_TEXT_EMBEDDING
    return None


def apply(records: Iterable[HubRecord]) -> None:
    """Set ``excluded_reason`` (and a judged ``is_moe``) on every record, in place."""
    for rec in records:
        if rec.is_moe is None:
            rec.is_moe = is_moe(rec.model_type, rec.architectures, rec.tags)
        rec.excluded_reason = exclusion_reason(rec)
