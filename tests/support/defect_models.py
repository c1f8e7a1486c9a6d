"""What the device-defect tests share: a tiny BERT folder with attention at the scale of trained
weights (judged ``without_adapters=`` the fix, a model shows the defect; with the full registry
it passes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TINY_BERT: dict[str, Any] = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "hidden_size": 128,
    "num_attention_heads": 2,  # head_dim 64: stock SDPA, no head-dim padding adapter
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "vocab_size": 96,
    # weights at the scale of trained attention (the default 0.02 makes attention a rounding
    # error next to the residual stream, so no corruption of its input would show)
    "initializer_range": 0.2,
}


def tiny_bert_folder(folder: Path, **fields: Any) -> Path:
    """A model folder holding TINY_BERT's config.json, ``fields`` changed."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**TINY_BERT, **fields}))
    return folder
