"""The card's reduced-precision RMSNorm (issue 12, item 2), against hf-adapters' published
figures (docs/spyre-numerical-findings.md): mean relative error of the card's DL16 RMSNorm
against fp32, on inputs scaled 1/sqrt(hidden) like real activations.

Band: the hidden-1024 figure (Qwen3-0.6B, 1.73%) is reproduced within +-50% ([0.87%, 2.6%]).
At larger hidden sizes the sequential-accumulation model overshoots (printed, measured vs
published); the test holds it to "grows with hidden and stays below 3x the published figure"."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from hfadapt.spyre.dl16 import DEFAULT_FORMAT, round_dl16
from hfadapt.spyre.kernels import native_kernel
from hfadapt.spyre.profile import load_profile

PUBLISHED = {1024: 0.0173, 2048: 0.0251, 3072: 0.0378, 3584: 0.0507, 4096: 0.0499}


def _mean_rel_error(hidden: int, rows: int = 64, seed: int = 0) -> float:
    g = torch.Generator().manual_seed(seed)
    x = round_dl16(torch.randn(rows, hidden, generator=g) / hidden**0.5)
    w = round_dl16(1 + 0.1 * torch.randn(hidden, generator=g))
    kernel = native_kernel("aten::rms_norm", load_profile())
    assert kernel is not None, "the profile enables the DL16 rms_norm kernel"
    out = kernel([x, [hidden], w, 1e-6], {}, DEFAULT_FORMAT)
    ref = F.rms_norm(x, [hidden], w, 1e-6)
    return float(((out - ref).abs() / ref.abs().clamp_min(1e-12)).mean())


def test_rms_norm_matches_the_published_figure_at_hidden_1024() -> None:
    measured = _mean_rel_error(1024)
    print(f"DL16 RMSNorm, hidden 1024: measured {measured:.2%}, published 1.73% (Qwen3-0.6B)")
    assert 0.0087 <= measured <= 0.026, f"measured {measured:.3%}, band [0.87%, 2.6%]"


@pytest.mark.slow
def test_rms_norm_error_grows_with_hidden_size() -> None:
    measured = {h: _mean_rel_error(h, rows=32) for h in PUBLISHED}
    for h, value in measured.items():
        print(f"hidden {h}: measured {value:.2%}, published {PUBLISHED[h]:.2%}")
    sizes = sorted(measured)
    assert all(measured[a] < measured[b] for a, b in itertools.pairwise(sizes)), measured
    assert all(measured[h] < 3 * PUBLISHED[h] for h in sizes), measured


def test_an_fp32_island_avoids_the_error() -> None:
    """The rms-norm adapters' form, (x*x).mean() in fp32, computes in IEEE fp32 on the card:
    rounding only its output to DL16 keeps the error at DL16's half-ulp."""
    g = torch.Generator().manual_seed(1)
    x = round_dl16(torch.randn(64, 1024, generator=g) / 32)
    ref = F.rms_norm(x, [1024], None, 1e-6)
    island = round_dl16(x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6))
    rel = float(((island - ref).abs() / ref.abs().clamp_min(1e-12)).mean())
    print(f"fp32 island: mean relative error {rel:.4%} (DL16 half-ulp bound {2**-10:.4%})")
    assert rel <= 2**-10, rel


# ---- softmax: probability left on masked positions -----------------------------------------
# Published (hf-adapters docs/spyre-numerical-findings.md): about 2e-5 of probability on each
# -inf-masked position, masked-region max 4.9e-5, where the CPU gives exactly 0.


def _masked_attention(spread: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention logits (8 heads x 16 queries x 64 keys, the last 40 keys masked with -inf as
    a padded batch has them) whose unmasked part has standard deviation ``spread``: large for
    the peaked attention of trained models, small for diffuse attention."""
    g = torch.Generator().manual_seed(seed)
    logits = spread * torch.randn(8, 16, 64, generator=g)
    masked = torch.zeros(64, dtype=torch.bool)
    masked[24:] = True
    return logits.masked_fill(masked, float("-inf")), masked


@pytest.mark.parametrize("op", ["aten::_softmax", "aten::softmax.int"])
def test_softmax_leaves_the_published_probability_on_masked_positions(op: str) -> None:
    kernel = native_kernel(op, load_profile())
    assert kernel is not None, f"the profile enables the softmax kernel for {op}"
    logits, masked = _masked_attention(spread=3.0)
    # on the device the -inf fill is held as -0xEFFF (the transfer rule), finite
    held = round_dl16(logits, transfer=True)
    probs = kernel([held, -1, False if op == "aten::_softmax" else None], {}, DEFAULT_FORMAT)
    cpu = torch.softmax(logits, -1)
    leak = probs[..., masked]
    each, top = float(leak.mean()), float(leak.max())
    print(f"{op}: masked probability mean {each:.2e} (published about 2e-5), max {top:.2e} "
          f"(published 4.9e-5); CPU {float(cpu[..., masked].max()):.1e}")  # fmt: skip
    assert float(cpu[..., masked].max()) == 0.0
    assert 1e-5 <= each <= 4e-5, f"mean masked probability {each:.2e}, band [1e-5, 4e-5]"
    assert 3.5e-5 <= top <= 4.9e-5 * 1.01, f"masked max {top:.2e}, band [3.5e-5, 4.95e-5]"
    rows = probs.sum(-1)
    assert float((rows - 1).abs().max()) <= 2**-8, f"rows sum to {rows.min()}..{rows.max()}"


def test_softmax_without_masks_keeps_the_cpu_result() -> None:
    """The floor only shows on keys far below the row's maximum: diffuse attention with no
    mask is the CPU's softmax up to DL16 rounding."""
    kernel = native_kernel("aten::_softmax", load_profile())
    assert kernel is not None
    g = torch.Generator().manual_seed(2)
    logits = round_dl16(torch.randn(8, 16, 64, generator=g))
    got = kernel([logits, -1, False], {}, DEFAULT_FORMAT)
    rel = float(((got - torch.softmax(logits, -1)).abs() / torch.softmax(logits, -1)).max())
    print(f"unmasked softmax: max relative difference {rel:.2e} (DL16 ulp {2**-9:.2e})")
    assert rel <= 2**-9, rel
