"""The bundled adapters that relied on fp32 islands, re-proven on the card's numerics: their
statistics are now prescaled sums in the model dtype, which hold against the card's documented
reduction and cast failures (torch-spyre#3804: fp32 mean past 32 rows; #2314: eager fp32 ->
fp16 casts; the reduced-precision fp16 mean). Each runs on shapes past 32 rows, eager and
compiled, in both profile versions, against its stock module in float64."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from hfadapt.adapters.registry import default_registry

ISLANDS = [
    "layer-norm-unfused",
    "rms-norm-square-qwen3",
    "rms-norm-square-llama",
    "rms-norm-square-gemma3",
    "rms-norm-square-t5",
    "rms-norm-square-eurobert",
    "rms-norm-contiguous",
]


def _module_and_input(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    adapter = default_registry().get(name)
    assert adapter.example is not None, name
    module, args, _ = adapter.example(0)
    width = args[0].shape[-1]
    g = torch.Generator().manual_seed(1)
    if name == "rms-norm-contiguous":  # a [B, H, S, D] view, as the example has it
        x = torch.randn(4, 64, 2, width, generator=g, dtype=torch.float64).transpose(1, 2) * 3
    else:  # 4 x 64 rows: past #3804's 32; a large mean next to a small spread for LayerNorm
        x = torch.randn(4, 64, width, generator=g, dtype=torch.float64) * 2 + 3
    return module, x


@pytest.mark.parametrize(
    "profile", ["spyre-2026.07", pytest.param("spyre-2026.10", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("name", ISLANDS)
def test_the_adapter_holds_on_the_card(
    spyre: object, spyre_backend: object, name: str, profile: str
) -> None:
    from hfadapt.spyre.eager.device import tracking

    module, x = _module_and_input(name)
    with torch.no_grad():
        ref = module(x).double()
    device_module = module.half()
    handle = default_registry().apply(device_module, device="spyre", only=[name])
    assert handle.names == [name], handle.names
    h = x.half()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compiled = torch.compile(device_module, backend="spyre", options={"profile": profile})(h)
        compiled_report = spyre_backend.last_report()
        with tracking(profile, collect=True) as eager_report:
            eager = device_module.to("spyre")(h.to("spyre")).cpu()
    for way, got, report in (
        ("compiled", compiled, compiled_report),
        ("eager", eager, eager_report),
    ):
        cos = float(F.cosine_similarity(got.double(), ref, dim=-1).min())
        along = (got.double() * ref).sum(-1) / (ref * ref).sum(-1)
        scale = float((along - 1).abs().max())
        print(f"{name} {profile} {way}: min cosine {cos:.6f}, max scale error {scale:.4f}, "
              f"defects {report.defect_ids()}, violations {len(report.violations)}")  # fmt: skip
        assert report.ok and report.defect_ids() == [], (way, report.summary())
        assert cos >= 0.9999 and scale <= 0.004, (way, cos, scale)


def test_a_constant_row_with_a_bert_eps_stays_finite(spyre: object, spyre_backend: object) -> None:
    """A padding position whose embedding is one table row is a constant row: variance 0. With
    BERT's eps (1e-12, below DL16's smallest normal) var + eps is 0 on the card and rsqrt(0)
    overflows to the NaN code, which 0 * NaN spreads through attention (gte's structural unit:
    NaN in all 311 real tokens). The adapter gives the constant row its bias, as stock does."""
    ln = torch.nn.LayerNorm(768, eps=1e-12)
    with torch.no_grad():
        ln.bias.normal_(0, 0.1)
    x = torch.randn(2, 64, 768) * 0.05
    x[:, 40:] = 0.0137  # constant rows
    ref = ln(x).detach()
    device = ln.half()
    default_registry().apply(device, device="spyre", only=["layer-norm-unfused"])
    with torch.no_grad():
        out = torch.compile(device, backend="spyre")(x.half()).float()
    print(f"NaN {int(out.isnan().sum())}; constant rows max |out - bias| "
          f"{float((out[:, 40:] - ref[:, 40:]).abs().max()):.4f}")  # fmt: skip
    assert not bool(out.isnan().any())
    assert float((out - ref).abs().max()) < 0.02
