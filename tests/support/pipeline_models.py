"""Tiny sentence-transformers folders with heads after the transformer, built locally (no Hub):
a Dense head (EmbeddingGemma / distiluse shape: Pooling, Dense, Normalize), a SPLADE-like
SparseEncoder (MLMTransformer + SpladePooling) and a PyLate-like ColBERT (Transformer + token
Dense, MaxSim). A 256-token WordPiece vocabulary keeps SPLADE's vocabulary logits small."""

from __future__ import annotations

import json
from pathlib import Path

import torch

HIDDEN = 64
VOCAB = 256
_TINY = {
    "hidden_size": HIDDEN,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": 512,
    "initializer_range": 0.2,
}
_ST = "sentence_transformers.models."


def _vocab() -> list[str]:
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = [chr(c) for c in range(33, 127)]
    words = special + chars + [f"##{c}" for c in chars]
    return words + [f"[unused{i}]" for i in range(VOCAB - len(words))]


def _write(folder: Path, name: str, data: object) -> None:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _base(folder: Path, masked_lm: bool = False) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, BertTokenizer

    from hfadapt.loading.load import quiet_transformers

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(_vocab()) + "\n")
    BertTokenizer(str(folder / "vocab.txt")).save_pretrained(folder)
    with quiet_transformers():
        config = AutoConfig.for_model("bert", **_TINY)
        torch.manual_seed(0)
        model = (AutoModelForMaskedLM if masked_lm else AutoModel).from_config(config)
        model.save_pretrained(folder)
    return model


def _dense(folder: Path, name: str, cfg: dict[str, object], seed: int) -> None:
    from safetensors.torch import save_file

    _write(folder, f"{name}/config.json", cfg)
    gen = torch.Generator().manual_seed(seed)
    fan_in, fan_out = int(cfg["in_features"]), int(cfg["out_features"])  # type: ignore[call-overload]
    state = {"linear.weight": torch.randn(fan_out, fan_in, generator=gen) / fan_in**0.5}
    if cfg.get("bias"):
        state["linear.bias"] = torch.randn(fan_out, generator=gen) * 0.05
    save_file(state, str(folder / name / "model.safetensors"))


def dense_head_folder(folder: Path) -> Path:
    """Transformer, mean Pooling, Dense 64 -> 128 (tanh), Dense 128 -> 64, Normalize."""
    _base(folder)
    _write(folder, "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": f"{_ST}Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": f"{_ST}Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": f"{_ST}Dense"},
        {"idx": 3, "name": "3", "path": "3_Dense", "type": f"{_ST}Dense"},
        {"idx": 4, "name": "4", "path": "4_Normalize", "type": f"{_ST}Normalize"},
    ])  # fmt: skip
    _write(
        folder,
        "1_Pooling/config.json",
        {"word_embedding_dimension": HIDDEN, "pooling_mode_mean_tokens": True},
    )
    tanh = "torch.nn.modules.activation.Tanh"
    _dense(
        folder,
        "2_Dense",
        {"in_features": HIDDEN, "out_features": 128, "bias": True, "activation_function": tanh},
        1,
    )
    ident = "torch.nn.modules.linear.Identity"
    _dense(
        folder,
        "3_Dense",
        {"in_features": 128, "out_features": HIDDEN, "bias": False, "activation_function": ident},
        2,
    )
    return folder


def splade_folder(folder: Path) -> Path:
    """A BertForMaskedLM with SparseEncoder's MLMTransformer + SpladePooling (max, relu)."""
    _base(folder, masked_lm=True)
    sparse = "sentence_transformers.sparse_encoder.models."
    _write(folder, "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": f"{sparse}MLMTransformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": f"{sparse}SpladePooling"},
    ])  # fmt: skip
    _write(
        folder,
        "1_SpladePooling/config.json",
        {
            "pooling_strategy": "max",
            "activation_function": "relu",
            "word_embedding_dimension": VOCAB,
        },
    )
    # what SparseEncoder.save writes: without it SparseEncoder loads the folder as a
    # SentenceTransformer to convert, and appends a SparseAutoEncoder of its own
    _write(folder, "config_sentence_transformers.json", {"model_type": "SparseEncoder"})
    return folder


def colbert_folder(folder: Path) -> Path:
    """PyLate's layout: Transformer, then a token Dense 64 -> 64 without bias; MaxSim scoring."""
    _base(folder)
    _write(folder, "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": f"{_ST}Transformer"},
        {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
    ])  # fmt: skip
    ident = "torch.nn.modules.linear.Identity"
    _dense(
        folder,
        "1_Dense",
        {
            "in_features": HIDDEN,
            "out_features": HIDDEN,
            "bias": False,
            "activation_function": ident,
        },
        3,
    )
    _write(folder, "config_sentence_transformers.json", {"similarity_fn_name": "MaxSim"})
    return folder
