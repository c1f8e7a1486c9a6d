"""The card's silent failures as profile defects: each lowers, returns the wrong numbers the card
returns, is recorded (id, source, ATen node, module) in the lowering report, and is avoided by
its adapter. Numbers are measured against a CPU fp32 reference and printed on failure."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from support.defect_models import tiny_bert_folder
from torch.nn import functional as F

from hfadapt.errors import ProfileError
from hfadapt.spyre.compile.backend import lower
from hfadapt.spyre.compile.defects import (
    CROSS_GRAPH_TRIGGERS,
    TRIGGERS,
    memory_order,
    misread_layout,
)
from hfadapt.spyre.rules.lowering_report import LoweringReport
from hfadapt.spyre.rules.profile import available_profiles, load_profile

SDPA_DEFECT = "defect.transpose_sdpa_noncontiguous"
RMS_DEFECT = "defect.rms_norm_noncontiguous"
INF_DEFECT = "defect.minus_inf_amax"
# Sequence length of these tests: at 64 tokens every view + transpose head split also meets
# defect.view_transpose_64 (tests/spyre/test_device_defects_layout.py), even after .contiguous().
SEQ = 128
ROOT = Path(__file__).resolve().parents[2]


def _token_cosine(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-token cosine over the last dimension, every other dimension a token."""
    a, b = out.double().reshape(-1, out.shape[-1]), ref.double().reshape(-1, ref.shape[-1])
    return F.cosine_similarity(a, b, dim=-1)


def _compiled(module: torch.nn.Module, *inputs: torch.Tensor):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lowered, report = lower(module, inputs)
    assert report.ok, f"the defect model must lower: {report.summary()}"
    return lowered(*inputs), report


# -- the profile data ------------------------------------------------------------------------


@pytest.mark.parametrize("name", available_profiles())
def test_every_profile_defect_is_complete(name: str) -> None:
    p = load_profile(name)
    ids = [d.id for d in p.defects]
    assert {SDPA_DEFECT, RMS_DEFECT, INF_DEFECT} <= set(ids), ids
    for d in p.defects:
        assert d.trigger in TRIGGERS or d.trigger in CROSS_GRAPH_TRIGGERS, (
            f"{d.id}: trigger {d.trigger} has no matcher"
        )
        assert d.effect and d.modes and set(d.modes) <= {"eager", "compile"}, d
        source = p.defect_source(d)
        assert source != d.source and ("hf-adapters" in source or "torch-spyre" in source), (
            f"{d.id}: source key {d.source!r} resolves to {source!r}"
        )
        # fixed only where a source says so, and with that source
        assert d.fixed_in is None or p.sources.get(d.fixed_source), d
    here = tuple(int(x) for x in p.version.split(".")[:2])
    active = [
        d.id
        for d in p.defects
        if "compile" in d.modes
        and (d.fixed_in is None or here < tuple(int(x) for x in d.fixed_in.split(".")[:2]))
    ]
    assert [d.id for d in p.active_defects("compile")] == active
    # the card's eager ops are per-op compiles: the per-op defects reach eager too
    eager = {d.id for d in p.active_defects("eager")}
    assert {"defect.exp_unaligned", SDPA_DEFECT, RMS_DEFECT} <= eager, eager
    assert "defect.post_ln_handoff" not in eager and "defect.view_transpose_64" not in eager


def test_a_newer_profile_marks_a_defect_fixed(tmp_path: Path) -> None:
    child = {
        "name": "spyre-test-fixed",
        "version": "2027.01.1",
        "extends": "spyre-2026.07",
        "fix_defects": [{"id": RMS_DEFECT, "fixed_in": "2027.01", "source": "a test"}],
    }
    path = tmp_path / "fixed.json"
    path.write_text(json.dumps(child))
    p = load_profile(str(path))
    active = [d.id for d in p.active_defects()]
    assert SDPA_DEFECT in active and RMS_DEFECT not in active, active
    assert next(d for d in p.defects if d.id == RMS_DEFECT).fixed_in == "2027.01"
    # the fixed profile no longer corrupts the norm
    norm = _NormOfHeads().half()
    x = torch.randn(2, SEQ, 128).half()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, report = lower(norm, (x,), p)
    assert report.defects == [], [str(f) for f in report.defects]

    bad = dict(child, fix_defects=[{"id": "defect.nope", "fixed_in": "2027.01"}])
    path.write_text(json.dumps(bad))
    with pytest.raises(ProfileError, match=r"unknown defect defect\.nope"):
        load_profile.__wrapped__(str(path))


def test_an_unknown_trigger_is_a_profile_error(tmp_path: Path) -> None:
    child = {
        "name": "spyre-test-trigger",
        "version": "2027.01.1",
        "extends": "spyre-2026.07",
        "add_defects": [
            {"id": "defect.x", "source": "hfa", "trigger": "no_such_matcher", "effect": "x"}
        ],
    }
    path = tmp_path / "trigger.json"
    path.write_text(json.dumps(child))
    p = load_profile(str(path))
    # raised while the graph is built; Dynamo wraps what a backend raises
    with warnings.catch_warnings(), pytest.raises(Exception, match="no_such_matcher") as info:
        warnings.simplefilter("ignore")
        lower(torch.nn.Linear(64, 64).half(), (torch.randn(2, 64).half(),), p)
    assert "ProfileError" in str(info.value) or isinstance(info.value, ProfileError)


def test_the_docs_table_lists_every_defect() -> None:
    text = (ROOT / "docs" / "device-profile-rules.md").read_text()
    for d in load_profile().defects:
        row = next((line for line in text.splitlines() if f"`{d.id}`" in line), None)
        assert row is not None, f"{d.id} missing from docs/device-profile-rules.md"
        assert d.trigger in row, f"{d.id}: the docs row does not name trigger {d.trigger}: {row}"
        if d.fixed_in:
            assert d.fixed_in in row, f"{d.id}: the docs row does not say fixed in {d.fixed_in}"


def test_misread_layout_reads_storage_as_contiguous() -> None:
    y = torch.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)  # [B, S, H, D]
    x = y.transpose(1, 2)  # [B, H, S, D] view
    order = memory_order(x)
    assert order == (0, 2, 1, 3)
    bad = misread_layout(x, order, tuple(x.shape))
    assert torch.equal(bad.reshape(-1), y.reshape(-1)), "the misread must walk the storage order"
    assert not torch.equal(bad, x)
    assert memory_order(y) is None  # contiguous
    assert memory_order(y[:, :1].expand(2, 3, 4, 5)) is None  # broadcast: not a permutation
    assert memory_order(y.unsqueeze(1).transpose(1, 2)) is None  # size-1 swap is contiguous


def test_report_round_trips_firings() -> None:
    attention = _Attention(heads=2).half()
    _, report = _compiled(attention, torch.randn(2, 64, 128).half())
    again = LoweringReport.from_json(report.to_json())
    assert [f.to_dict() for f in again.defects] == [f.to_dict() for f in report.defects]
    assert SDPA_DEFECT in report.summary()


# -- defect.transpose_sdpa_noncontiguous --------------------------------------------------------


class _Attention(torch.nn.Module):
    """Multi-head self-attention shaped like transformers': Q, K, V are [B, S, H, D] views
    transposed to [B, H, S, D] and handed to SDPA, made contiguous first or not."""

    def __init__(self, heads: int, contiguous: bool = False, hidden: int = 128) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.heads, self.contiguous = heads, contiguous
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(hidden, hidden) for _ in range(3))
        for lin in self.qkv:
            torch.nn.init.normal_(lin.weight, std=hidden**-0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (
            lin(x).view(b, s, self.heads, h // self.heads).transpose(1, 2) for lin in self.qkv
        )
        if self.contiguous:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = F.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(b, s, h)


def test_sdpa_on_transposed_views_returns_garbage_and_contiguous_fixes_it() -> None:
    x = torch.randn(2, SEQ, 128)
    stock = _Attention(heads=2)
    with torch.no_grad():
        ref = stock(x)
    out, report = _compiled(stock.half(), x.half())
    cos = _token_cosine(out, ref)
    fired = [f for f in report.defects if f.defect_id == SDPA_DEFECT]
    assert len(fired) == 3, [str(f) for f in report.defects]  # query, key and value
    assert {f.shape for f in fired} == {(2, 2, SEQ, 64)}
    assert fired[0].stride == (SEQ * 128, 64, 128, 1), fired[0]
    assert "hf_common.py" in fired[0].source
    # hf_common.py: "garbage"; docs/device-profile-rules.md (Defects): per-token cosine near 0
    assert float(cos.mean()) < 0.5, f"defect fired, mean per-token cosine {float(cos.mean()):.4f}"
    print(f"sdpa on transposed views: per-token cosine mean {float(cos.mean()):.4f}")

    fixed = _Attention(heads=2, contiguous=True).half()
    out_fixed, report_fixed = _compiled(fixed, x.half())
    cos_fixed = _token_cosine(out_fixed, ref)
    assert report_fixed.defects == [], [str(f) for f in report_fixed.defects]
    assert float(cos_fixed.min()) > 0.999, f"contiguous: min cosine {float(cos_fixed.min()):.6f}"


def test_one_head_is_not_a_transpose() -> None:
    """With one head the transposed view is contiguous: nothing to misread, nothing fires."""
    _, report = _compiled(_Attention(heads=1).half(), torch.randn(2, 64, 128).half())
    assert report.defects == []


# -- defect.rms_norm_noncontiguous --------------------------------------------------------------


class _NormOfHeads(torch.nn.Module):
    """RMSNorm over head_dim of a [B, H, S, D] view (torch-spyre#1781's shape)."""

    def __init__(self, heads: int = 2, contiguous: bool = False) -> None:
        super().__init__()
        self.heads, self.contiguous = heads, contiguous
        self.norm = torch.nn.RMSNorm(64, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        heads = x.view(b, s, self.heads, h // self.heads).transpose(1, 2)
        if self.contiguous:
            heads = heads.contiguous()
        return self.norm(heads)


def test_rms_norm_on_a_transposed_view_is_wrong_and_contiguous_fixes_it() -> None:
    torch.manual_seed(1)
    x = torch.randn(2, SEQ, 128) * 3
    with torch.no_grad():
        ref = _NormOfHeads()(x)
    out, report = _compiled(_NormOfHeads().half(), x.half())
    fired = [f for f in report.defects if f.defect_id == RMS_DEFECT]
    assert len(fired) == 1, [str(f) for f in report.defects]
    assert fired[0].module == "norm" and fired[0].module_class == "RMSNorm", fired[0]
    assert "#1781" in fired[0].source
    err = float((out.float() - ref).abs().max())
    # torch-spyre#1781: max error about 8 (on RMSNorm outputs of unit-scale rows)
    assert 2.0 < err < 20.0, f"defect fired: max |error| {err:.3f} (published: about 8)"

    out_fixed, report_fixed = _compiled(_NormOfHeads(contiguous=True).half(), x.half())
    err_fixed = float((out_fixed.float() - ref).abs().max())
    assert report_fixed.defects == [] and err_fixed < 0.05, f"contiguous: max |error| {err_fixed}"

    # the bundled adapter (torch.nn.RMSNorm on contiguous input) on the stock module
    from hfadapt.adapters.registry import discover

    registry = discover(paths=[], entry_points=False)
    stock = _NormOfHeads().half()
    with registry.apply(stock, device="spyre", only=["rms-norm-contiguous"]) as handle:
        assert handle.names == ["rms-norm-contiguous"], handle.names
        out_adapted, report_adapted = _compiled(stock, x.half())
    err_adapted = float((out_adapted.float() - ref).abs().max())
    assert report_adapted.defects == [] and err_adapted < 0.05, (
        f"adapted: {[str(f) for f in report_adapted.defects]}, max |error| {err_adapted}"
    )
    print(
        f"rms_norm on a [B, H, S, D] view: max |error| stock {err:.3f}, adapted {err_adapted:.4f}"
    )


# -- defect.minus_inf_amax -----------------------------------------------------------------------


class _TwoAttentions(torch.nn.Module):
    """Two self-attentions over a padded batch; the mask keeps real query x real key pairs, so
    padded query rows are fully masked. ``additive=False``: SDPA gets the boolean mask (its
    math fills -inf); True: an additive mask from the host with finfo.min / 2 (what the
    attention-mask-host adapter sends)."""

    def __init__(self, additive: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.additive = additive
        self.proj = torch.nn.Linear(128, 128)

    def forward(self, x: torch.Tensor, keep: torch.Tensor, additive: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        mask = additive if self.additive else keep
        for _ in range(2):
            heads = self.proj(x).view(b, s, 2, 64).transpose(1, 2).contiguous()
            x = F.scaled_dot_product_attention(heads, heads, heads, attn_mask=mask)
            x = x.transpose(1, 2).reshape(b, s, h)
        return x


def test_a_minus_inf_fill_at_sdpa_amax_poisons_the_batch_and_additive_masks_avoid_it() -> None:
    x = torch.randn(2, SEQ, 128)
    real = torch.ones(2, SEQ, dtype=torch.bool)
    real[1, 40:] = False
    keep = real[:, None, :, None] & real[:, None, None, :]
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float16).min / 2)
    inputs = (x.half(), keep, additive.half())
    results = {}
    for form in (False, True):
        module = _TwoAttentions(additive=form)
        with torch.no_grad():
            ref = module(x, keep, additive)
        out, report = _compiled(module.half(), *inputs)
        out = out.float()
        results[form] = (report, out[real], ref[real])
    report, out, ref = results[False]
    fired = [f for f in report.defects if f.defect_id == INF_DEFECT]
    assert len(fired) == 2 and fired[0].op.startswith("aten::_softmax"), [str(f) for f in fired]
    assert "0xEFFF" in fired[0].source
    assert bool(torch.isfinite(ref).all())
    # the padded sentence's padded rows become NaN in the first attention; the second carries
    # it into all of its 40 real rows; the unpadded sentence (SEQ rows) stays finite
    nan_rows = out.isnan().any(-1)
    assert int(nan_rows[SEQ:].sum()) == 40 and not bool(nan_rows[:SEQ].any()), (
        f"real rows with NaN: padded sentence {int(nan_rows[SEQ:].sum())} of 40, "
        f"unpadded {int(nan_rows[:SEQ].sum())} of {SEQ}"
    )

    report, out, ref = results[True]
    err = float((out - ref).abs().max())
    assert report.defects == [] and err < 0.01, f"additive mask: {report.defects}, max err {err}"


# -- the judge: verification_failed, localized, evidence, adapter ------------------------------


@pytest.mark.slow
def test_diagnose_localizes_the_sdpa_defect_and_the_adapter_fixes_it(
    tmp_path: Path,
) -> None:
    import hfadapt.judge.diagnose as diagnose_module
    from hfadapt.cli import diagnose as cli_diagnose

    folder = tiny_bert_folder(tmp_path / "bert-sdpa")
    # attention-heads-select runs attention-sdpa-contiguous's attention too
    without_the_fix = ("attention-sdpa-contiguous", "attention-heads-select")

    options = {"mode": "structural", "execution": "compile", "record": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = diagnose_module.diagnose(str(folder), without_adapters=without_the_fix, **options)
        adapted = diagnose_module.diagnose(str(folder), **options)

    m = stock.metrics
    assert stock.verdict == "verification_failed", f"{stock.verdict}: {stock.reason}"
    assert m is not None and m.min_token_cosine < 0.5, m
    d = stock.divergence
    assert d is not None, stock.evidence.get("localize_error")
    assert d.module == "encoder.layer.0.attention.self", d.summary()
    assert d.cosine is not None and d.cosine < 0.5 and (d.input_cosine or 0) > 0.99, d.summary()
    assert {x["defect_id"] for x in d.defects} == {SDPA_DEFECT}, d.defects
    assert stock.evidence["localize_execution"] == "compile"
    evidence = stock.evidence["defects"]
    assert [e["defect_id"] for e in evidence] == [SDPA_DEFECT]
    assert "hf_common.py" in evidence[0]["source"]
    modules = {f["module"] for f in evidence[0]["firings"]}
    assert modules == {"encoder.layer.0.attention.self", "encoder.layer.1.attention.self"}
    assert SDPA_DEFECT in stock.next_step
    assert stock.to_dict()["divergence"]["defects"], "the JSON output carries the defect"

    with cli_diagnose.console.capture() as captured:
        cli_diagnose.render(stock)
    text = " ".join(captured.get().split())
    assert re.search(r"device defect \[defect\.transpose_sdpa_noncontiguous\] fired in", text), text
    assert "first divergent module: encoder.layer.0.attention.self" in text, text

    assert adapted.verdict == "pass", f"{adapted.verdict}: {adapted.reason}"
    assert "attention-sdpa-contiguous" in adapted.adapters
    assert adapted.metrics is not None and adapted.metrics.min_token_cosine > 0.999
    assert "defects" not in adapted.evidence
    print(
        f"stock min token cosine {m.min_token_cosine:.4f}, "
        f"adapted {adapted.metrics.min_token_cosine:.6f}"
    )


# -- defect.bf16_minus_inf_sum ----------------------------------------------------------------


class _TwoMasks(torch.nn.Module):
    """Scores plus a padding mask plus a window mask, both made in the graph with -inf fills
    (two masks combined, as some models build them), or with one finite masked value."""

    def __init__(self, finite: bool = False) -> None:
        super().__init__()
        self.fill = -32752.0 if finite else float("-inf")

    def forward(
        self, scores: torch.Tensor, padded: torch.Tensor, far: torch.Tensor
    ) -> torch.Tensor:
        zeros, fill = torch.zeros_like(scores), torch.full_like(scores, self.fill)
        pad = torch.where(padded[:, None, :], fill, zeros)
        window = torch.where(far, fill, zeros)
        return scores + (pad + window)


def test_bf16_minus_inf_plus_minus_inf_is_nan_and_a_finite_mask_avoids_it() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 8, 8, generator=g).to(torch.bfloat16)
    padded = torch.zeros(2, 8, dtype=torch.bool)
    padded[1, 5:] = True
    pos = torch.arange(8)
    far = (pos[:, None] - pos[None, :]).abs() > 2  # a window of 2 around each query
    results = {}
    for finite in (False, True):
        out, report = _compiled(_TwoMasks(finite), scores, padded, far)
        fired = [f.defect_id for f in report.defects]
        results[finite] = (int(torch.isnan(out.float()).sum()), fired)
    print(f"-inf fills: NaN {results[False][0]}, fired {results[False][1]}; "
          f"finite fills: NaN {results[True][0]}, fired {results[True][1]}")  # fmt: skip
    nans, fired = results[False]
    # positions both masks cover: row 1's 3 padded keys outside each query's window: 12
    assert nans == 12 and "defect.bf16_minus_inf_sum" in fired, results
    assert results[True] == (0, []), results
