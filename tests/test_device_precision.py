"""The card's reduced-precision RMSNorm (issue 12, item 2), against hf-adapters' published
figures (docs/spyre-numerical-findings.md): mean relative error of the card's DL16 RMSNorm
against fp32 on real weights: 1.73% at hidden 1024 (Qwen3-0.6B) up to about 5% at 3584-4096.

Inputs scaled like real activations: the hidden states that reach a norm have channels whose
magnitudes differ by orders of magnitude, modelled here as N(0, 1) times a per-channel scale
exp(N(0, 1)) (log-normal, sigma 1), over sqrt(hidden). Band: every width within 0.6x-1.4x of
its published figure (measured over seeds 0-3: 0.80x-1.32x). For comparison, the same kernel on
plain N(0, 1/hidden) inputs overshoots about 2x at 3-4k (printed by the last test)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hfadapt.spyre.dl16 import DEFAULT_FORMAT, round_dl16
from hfadapt.spyre.kernels import native_kernel
from hfadapt.spyre.profile import load_profile

PUBLISHED = {1024: 0.0173, 2048: 0.0251, 3072: 0.0378, 3584: 0.0507, 4096: 0.0499}
BAND = (0.6, 1.4)


def _mean_rel_error(hidden: int, *, rows: int = 64, seed: int = 0, spread: float = 1.0) -> float:
    g = torch.Generator().manual_seed(seed)
    scale = torch.exp(spread * torch.randn(hidden, generator=g))
    x = round_dl16(torch.randn(rows, hidden, generator=g) * scale / hidden**0.5)
    w = round_dl16(1 + 0.1 * torch.randn(hidden, generator=g))
    kernel = native_kernel("aten::rms_norm", load_profile())
    assert kernel is not None, "the profile enables the DL16 rms_norm kernel"
    out = kernel([x, [hidden], w, 1e-6], {}, DEFAULT_FORMAT)
    ref = F.rms_norm(x, [hidden], w, 1e-6)
    return float(((out - ref).abs() / ref.abs().clamp_min(1e-12)).mean())


@pytest.mark.parametrize("hidden", sorted(PUBLISHED))
def test_rms_norm_reproduces_the_published_error(hidden: int) -> None:
    measured = _mean_rel_error(hidden)
    published = PUBLISHED[hidden]
    ratio = measured / published
    print(
        f"DL16 RMSNorm, hidden {hidden}: measured {measured:.2%}, published {published:.2%} "
        f"({ratio:.2f}x; band {BAND[0]}x-{BAND[1]}x)"
    )
    assert BAND[0] <= ratio <= BAND[1], (
        f"hidden {hidden}: measured {measured:.3%} vs published {published:.2%} = {ratio:.2f}x, "
        f"outside {BAND}"
    )


def test_plain_gaussian_inputs_show_the_model_limit() -> None:
    """Without the channel spread the sequential model swamps more at large widths: it still
    matches at 1024, and overshoots at 4096 (kept below 3x; the channel-scaled inputs above are
    the calibration)."""
    at_1024 = _mean_rel_error(1024, spread=0.0)
    at_4096 = _mean_rel_error(4096, rows=32, spread=0.0)
    print(
        f"N(0, 1/hidden) inputs: 1024 {at_1024:.2%} (published 1.73%), 4096 {at_4096:.2%} (4.99%)"
    )
    assert BAND[0] <= at_1024 / PUBLISHED[1024] <= BAND[1], at_1024
    assert PUBLISHED[4096] < at_4096 < 3 * PUBLISHED[4096], at_4096


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


def test_softmax_clamps_its_exponent_without_changing_a_bit() -> None:
    """The kernel clamps exponents below log(floor) before exp (the CPU's exp is slow on the
    masked keys' -3.35e7): every such exp ends at the floor anyway, so the result is the one
    the unclamped definition gives, bit for bit, -inf, NaN and whole masked rows included."""
    from hfadapt.spyre import kernels

    floor = float(load_profile().numerics["softmax_exp_floor"]["exp_floor"])
    logits, _ = _masked_attention(spread=30.0, seed=3)
    held = round_dl16(logits, transfer=True)
    held[0, 0, :] = -3.35e7  # a fully masked row
    held[0, 1, :4] = float("-inf")
    held[0, 2, 5] = float("nan")
    e = torch.exp(held - held.amax(-1, keepdim=True)).clamp_min_(floor)
    definition = e / e.sum(-1, keepdim=True)
    got = kernels._softmax_floor(held, -1, floor)
    same = (got.view(torch.int32) == definition.view(torch.int32)) | (
        got.isnan() & definition.isnan()
    )
    print(f"floor {floor:.3e}: {int((~same).sum())} of {got.numel()} values differ")
    assert bool(same.all()), int((~same).sum())


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


# ---- matmul: chunked accumulation with truncated partials ----------------------------------
# The hardware-simulating Triton matmul (tl_matmul_chunk_truncate): K accumulated in chunks,
# each chunk's fp32 product rounded half-up to DL16's 9 mantissa bits before it joins the fp32
# accumulator (docs/device-profile-rules.md, numerics.matmul_chunk_truncate).


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).abs().mean() / ref.abs().mean())


def test_a_truncated_partial_rounds_half_up_where_the_cpu_rounds_to_even() -> None:
    """K = 128 (two sticks): the first stick's partial is exactly 1 + 2^-10, half a DL16 ulp
    above 1. Truncated half-up it is 1 + 2^-9; computed in fp32 and rounded to nearest-even
    once, it would be 1.0."""
    from hfadapt.spyre.compile.backend import lower

    a = torch.ones(1, 128, dtype=torch.float16)
    b = torch.zeros(128, 64, dtype=torch.float16)
    b[0], b[1] = 1.0, 2.0**-10
    lowered, report = lower(lambda x, w: x @ w, (a, b))
    got = float(lowered.audit_output[0, 0])
    once = float(round_dl16(a.float() @ b.float())[0, 0])
    print(f"device {got!r}, one rounding {once!r}, expected {1 + 2**-9!r}")
    assert report.ok
    assert got == 1 + 2**-9, got
    assert once == 1.0, once


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "chunks"),
    [
        ((64, 768), (768, 96), 2),  # an even split: one batched product
        ((64, 768), (768, 96), 3),
        ((20, 100), (100, 33), 2),  # an uneven split: the pieces one by one
        ((6, 40, 128), (6, 128, 64), 2),  # batched (attention's probabilities @ V)
        ((3, 7, 256), (256, 9), 4),  # a broadcast batch
    ],
)
def test_the_one_pass_accumulation_computes_the_piecewise_definition(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], chunks: int
) -> None:
    """kernels.chunked_matmul (pieces made side by side, truncated, summed, biased and rounded
    in one pass by the C kernels when built, else by torch ops): both paths give the same bits,
    and they compute the definition: each stick-aligned piece's product truncated, added in
    order, then the bias added and the sum rounded to DL16."""
    from hfadapt.spyre import kernels

    g = torch.Generator().manual_seed(1)
    a = torch.randn(*a_shape, generator=g) * 3
    b = torch.randn(*b_shape, generator=g)
    bias = torch.randn(b_shape[-1], generator=g)
    k = a_shape[-1]
    sticks = -(-k // kernels.STICK)
    per = -(-sticks // chunks) * kernels.STICK
    summed: torch.Tensor | None = None
    for start in range(0, k, per):
        part = kernels.truncate_partial_(
            a[..., start : start + per] @ b[..., start : start + per, :], 9
        )
        summed = part if summed is None else summed + part
    assert summed is not None
    definitions = {"sum": summed, "linear": round_dl16(summed + bias)}

    def run() -> dict[str, torch.Tensor]:
        return {
            "sum": kernels.chunked_matmul(a, b, chunks, 9),
            "linear": kernels.chunked_matmul(a, b, chunks, 9, bias=bias, fmt=DEFAULT_FORMAT),
        }

    native = run()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kernels, "_native_kernels", lambda: (None, None))
        torch_path = run()
    for name, expected in definitions.items():
        got, slow = native[name], torch_path[name]
        # the C kernels and the torch ops: the same bits
        differ = int((got.view(torch.int32) != slow.view(torch.int32)).sum())
        assert differ == 0, f"{name}: native and torch paths differ in {differ} values"
        # against the piecewise definition: the pieces' products come from another BLAS call
        # (one batched product), whose fp32 rounding may move a truncated partial by one step
        assert got.shape == expected.shape, (got.shape, expected.shape)
        moved = float((got != expected).float().mean())
        worst = float(((got - expected).abs() / expected.abs().clamp_min(1e-3)).max())
        print(f"{name}: {moved:.2%} of values off the definition, worst by {worst:.2e}")
        assert moved <= 0.01 and worst <= 2**-7, (moved, worst)


def test_chunked_accumulation_adds_error_on_both_paths() -> None:
    """One product, K = 768, against fp64: the chunked matmul's error is above a single DL16
    rounding of the exact product (the truncated partials add their own); eager and compiled
    compute the same numbers."""
    import hfadapt.spyre as spyre_device
    from hfadapt.spyre.compile.backend import lower

    g = torch.Generator().manual_seed(0)
    # DL16 values (9 mantissa bits), so moving them onto the device loses nothing
    a = round_dl16(torch.randn(512, 768, generator=g)).half()
    b = round_dl16(torch.randn(768, 768, generator=g) / 768**0.5).half()
    ref = a.double() @ b.double()
    with torch.no_grad():
        lowered, report = lower(lambda x, w: x @ w, (a, b))
        compiled = lowered.audit_output
        spyre_device.register()
        eager = (a.to("spyre") @ b.to("spyre")).cpu()
    single = round_dl16(ref.float())  # the exact product, rounded to DL16 once
    measured, floor = _rel(compiled, ref), _rel(single, ref)
    print(
        f"matmul mean relative error: chunked {measured:.3e}, one DL16 rounding {floor:.3e} "
        f"({measured / floor:.2f}x); eager {_rel(eager, ref):.3e}"
    )
    assert report.ok
    assert torch.equal(compiled, eager), float((compiled.float() - eager.float()).abs().max())
    assert 1.1 <= measured / floor <= 2.0, (measured, floor)
