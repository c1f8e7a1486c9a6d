"""Small inputs for adapter proofs: a one-layer model of a family with stick-aligned shapes and
a padded 64-token batch (row 1 padded from token 40, row 2 from token 5), in float64."""

from __future__ import annotations

from typing import Any

import torch


def tiny_model(
    model_type: str, seed: int, **overrides: object
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """(model, input_ids, attention_mask); ``overrides`` go into the config."""
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(seed)
    fields: dict[str, Any] = {
        "hidden_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 256,
        "vocab_size": 96,
        "hidden_act": "relu",
        "max_position_embeddings": 130,
        "attn_implementation": "sdpa",
    }
    cfg = AutoConfig.for_model(model_type, **{**fields, **overrides})
    model = AutoModel.from_config(cfg).double().eval()
    ids = torch.randint(3, 96, (3, 64))
    mask = torch.ones(3, 64, dtype=torch.long)
    mask[1, 40:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = cfg.pad_token_id or 0
    return model, ids, mask


class ExpFeatures(torch.nn.Module):
    """A feature map ``exp(x W^T + b)`` with an unaligned number of features (100 by default:
    more than one 64-element stick, not a whole number of them). No bundled family calls exp
    on such an extent; this is the module the ``exp-stick-pad`` adapter is shown and proven
    on (defect.exp_unaligned, torch-spyre#3799)."""

    def __init__(self, hidden: int = 64, features: int = 100) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(hidden, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.proj(x))


def bert_at_trained_scale(
    seed: int,
) -> tuple[torch.nn.Module, tuple[object, ...], dict[str, object]]:
    """An adapter example: a tiny BERT whose weights have the scale of trained attention
    (initializer 0.2; the default 0.02 leaves attention a rounding error next to the residual
    stream, where no corruption of its input would show), with its inputs."""
    model, ids, mask = tiny_model("bert", seed, initializer_range=0.2)
    return (
        model,
        (),
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)},
    )
