"""Tiny models shaped like popular checkpoints (widths on sticks, two layers), and their
inputs: a padded batch of two."""

from __future__ import annotations

import torch

SEQ = 64  # sequence lengths are padded to a multiple of 64, as on the card

TINY = {
    "bert": {"hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512},
    "xlm-roberta": {"hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512},
    "mpnet": {"hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512},
    "distilbert": {"dim": 128, "n_heads": 2, "hidden_dim": 512, "n_layers": 2},
    "modernbert": {
        "hidden_size": 128,
        "num_attention_heads": 2,
        "intermediate_size": 192,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "cls_token_id": 1,
        "sep_token_id": 2,
    },
    "qwen3": {
        "hidden_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "intermediate_size": 768,
    },
    "gemma3_text": {
        "hidden_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "intermediate_size": 384,
        "use_bidirectional_attention": True,
    },
}


def tiny_inputs(vocab: int) -> dict[str, torch.Tensor]:
    """Two random sequences of SEQ tokens, the second half padded."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (2, SEQ), generator=g)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, SEQ // 2 :] = 0
    return {"input_ids": ids, "attention_mask": mask}
