"""Two stick-layout defects of the card as profile defects: ``exp`` over a row that is not a
whole number of sticks (defect.exp_unaligned, torch-spyre#3799) and the 64-token head split
``x.view(B, S, H, D).transpose(1, 2)`` (defect.view_transpose_64, torch-spyre#1783). Each
lowers, returns wrong numbers, is localized by diagnose with its id in the evidence, and is
avoided by its adapter. Errors are measured against CPU fp32 and printed."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from support.defect_models import tiny_bert_folder

from hfadapt.adapters.registry import default_registry, discover
from hfadapt.spyre.compile.backend import lower

EXP_DEFECT = "defect.exp_unaligned"
HEADS_DEFECT = "defect.view_transpose_64"


def _compiled(module: torch.nn.Module, *inputs: torch.Tensor):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lowered, report = lower(module, inputs)
    assert report.ok, f"the defect model must lower: {report.summary()}"
    return lowered(*inputs), report


# -- defect.exp_unaligned ----------------------------------------------------------------------


class _Exp(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x)


# torch-spyre#3799: max abs error of compiled torch.exp on torch.randn fp16 (seed 0); (3, 100)
# at one core (SENCORES=1): at 32 cores that shape fails to compile, which is not modelled.
PUBLISHED_EXP = {(63, 100): 45.88, (64, 100): 29.22, (3, 100): 10.34}


def test_exp_past_the_first_stick_is_wrong_as_published() -> None:
    torch.manual_seed(0)
    measured = {}
    for shape, published in PUBLISHED_EXP.items():
        x = torch.randn(*shape, dtype=torch.float16)
        out, report = _compiled(_Exp(), x)
        fired = [f for f in report.defects if f.defect_id == EXP_DEFECT]
        assert len(fired) == 1 and fired[0].op.startswith("aten::exp"), report.defects
        assert "#3799" in fired[0].source
        diff = (out.float() - torch.exp(x.float())).abs()
        err = float(diff.max())
        measured[shape] = err
        # only the columns past the first stick are wrong
        assert float(diff[:, :64].max()) < 0.1, f"{shape}: first stick off by {diff[:, :64].max()}"
        # the same size as the card's error: within a factor of 2 of the published value
        assert published / 2 < err < published * 2, (
            f"{shape}: max abs error {err:.2f}, published {published}"
        )
    print(
        "exp max abs error, measured vs published: "
        + ", ".join(f"{s}: {measured[s]:.2f} vs {p}" for s, p in PUBLISHED_EXP.items())
    )
    # whole sticks, or a row inside one stick: nothing fires, the numbers are right
    for shape in ((4, 128), (5, 50), (2, 64)):
        x = torch.randn(*shape, dtype=torch.float16)
        out, report = _compiled(_Exp(), x)
        err = float((out.float() - torch.exp(x.float())).abs().max())
        assert report.defects == [] and err < 0.1, f"{shape}: {report.defects}, max err {err}"


def test_exp_stick_pad_avoids_the_defect() -> None:
    from hfadapt.adapters.examples import ExpFeatures

    torch.manual_seed(0)
    module = ExpFeatures()
    x = torch.randn(2, 64, 64)
    with torch.no_grad():
        ref = module(x)
    stock = module.half()
    out, report = _compiled(stock, x.half())
    err = float((out.float() - ref).abs().max())
    fired = [f for f in report.defects if f.defect_id == EXP_DEFECT]
    assert len(fired) == 1 and fired[0].module == "" and fired[0].shape == (2, 64, 100), fired
    registry = discover(paths=[], entry_points=False)
    with registry.apply(stock, device="spyre", only=["exp-stick-pad"]) as handle:
        assert handle.names == ["exp-stick-pad"], handle.names
        out_adapted, report_adapted = _compiled(stock, x.half())
    err_adapted = float(((out_adapted.float() - ref).abs() / ref.abs().clamp_min(1)).max())
    print(f"ExpFeatures: max abs error stock {err:.2f}, adapted max rel error {err_adapted:.4f}")
    assert err > 0.5, f"stock: max abs error {err:.3f}"
    assert report_adapted.defects == [] and err_adapted < 0.01, (
        f"adapted: {[str(f) for f in report_adapted.defects]}, max rel error {err_adapted}"
    )


# -- defect.view_transpose_64 ------------------------------------------------------------------


class _Heads(torch.nn.Module):
    """The head split of torch-spyre#1783's repro, made contiguous (as to_cpu does there), or as
    a permute; ``select``: the heads re-taken by the attention-heads-select adapter's helper.
    ``strided``: the input is the first 256 columns of a wider tensor (a strided view)."""

    def __init__(self, form: str = "transpose", strided: bool = False) -> None:
        super().__init__()
        self.form, self.strided = form, strided

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.strided:
            x = x[..., :256]
        b, s, h = x.shape
        split = x.view(b, s, 4, h // 4)
        if self.form == "permute":
            return split.permute(0, 2, 1, 3).contiguous()
        heads = split.transpose(1, 2)
        if self.form == "select":
            return torch.cat([heads.transpose(1, 2).select(2, i).unsqueeze(1) for i in range(4)], 1)
        return heads.contiguous()


def test_the_64_token_head_split_is_wrong_and_other_lengths_are_not() -> None:
    torch.manual_seed(0)
    errors: dict[str, float] = {}
    for seq in (1, 64, 128):
        wide = torch.randn(2, seq, 512)
        for name, x in (("contiguous", wide[..., :256].contiguous()), ("strided", wide)):
            module = _Heads(strided=name == "strided")
            ref = module(x)
            out, report = _compiled(module, x.half())
            fired = [f for f in report.defects if f.defect_id == HEADS_DEFECT]
            errors[f"seq{seq}_{name}"] = err = float((out.float() - ref).abs().max())
            if seq == 64:
                assert len(fired) == 1 and fired[0].op.startswith("aten::clone"), fired
                assert fired[0].shape == (2, 4, 64, 64) and "#1783" in fired[0].source
                # the source: about 3 (input scale not given); unit-normal input here
                assert 1.0 < err < 20.0, f"seq 64 {name}: max abs error {err:.3f}"
            else:
                # the source: 1 token, max 0.001; 128 tokens: not matched
                assert report.defects == [] and err < 0.01, f"seq {seq} {name}: {err}"
    print("head split max abs error: " + ", ".join(f"{k} {v:.4f}" for k, v in errors.items()))

    x = torch.randn(2, 64, 256)
    ref = _Heads()(x)
    out, report = _compiled(_Heads("permute"), x.half())
    assert [f.defect_id for f in report.defects] == [HEADS_DEFECT], report.defects
    assert float((out.float() - ref).abs().max()) > 1.0
    # the transpose undone by a view before any op reads it: no layout transform, no defect
    out, report = _compiled(_Heads("select"), x.half())
    err = float((out.float() - ref).abs().max())
    assert report.defects == [] and err < 0.01, f"select: {report.defects}, max err {err}"


def _bert_folder(tmp_path: Path, tokens: int) -> Path:
    """A two-layer BERT whose probes are ``tokens`` long (the structural probes stop at
    max_position_embeddings)."""
    return tiny_bert_folder(tmp_path / f"bert-{tokens}", max_position_embeddings=tokens)


@pytest.mark.slow
def test_diagnose_localizes_the_64_token_head_split_and_the_adapter_fixes_it(
    tmp_path: Path,
) -> None:
    import hfadapt.judge.diagnose as diagnose_module

    options = {"mode": "structural", "execution": "compile", "record": False}
    runs = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for tokens in (64, 128):
            folder = _bert_folder(tmp_path, tokens)
            runs[tokens, "stock"] = diagnose_module.diagnose(
                str(folder), without_adapters=["attention-heads-select"], **options
            )
            runs[tokens, "adapted"] = diagnose_module.diagnose(str(folder), **options)
    cosines = {k: (d.metrics.min_token_cosine if d.metrics else None) for k, d in runs.items()}
    print(f"min token cosine: {cosines}")

    stock = runs[64, "stock"]
    assert stock.verdict == "verification_failed", f"{stock.verdict}: {stock.reason}"
    for (tokens, _), run in runs.items():
        assert f" x {tokens} tokens" in run.evidence["probes"], run.evidence["probes"]
    d = stock.divergence
    assert d is not None, stock.evidence.get("localize_error")
    assert d.module == "encoder.layer.0.attention.self", d.summary()
    assert {x["defect_id"] for x in d.defects} == {HEADS_DEFECT}, d.defects
    evidence = stock.evidence["defects"]
    assert [e["defect_id"] for e in evidence] == [HEADS_DEFECT], evidence
    assert "#1783" in evidence[0]["source"]
    modules = {f["module"] for f in evidence[0]["firings"]}
    assert modules == {"encoder.layer.0.attention.self", "encoder.layer.1.attention.self"}

    adapted = runs[64, "adapted"]
    assert adapted.verdict == "pass", f"{adapted.verdict}: {adapted.reason}"
    assert "attention-heads-select" in adapted.adapters and "defects" not in adapted.evidence
    assert adapted.metrics is not None and adapted.metrics.min_token_cosine > 0.999
    # 128 tokens: the head split is not matched, with or without the adapter
    for kind in ("stock", "adapted"):
        run = runs[128, kind]
        assert run.verdict == "pass" and "defects" not in run.evidence, (kind, run.reason)


class _ExpGate(torch.nn.Module):
    """x + exp features of x, padded back to the hidden size: an exp over 100 columns (more
    than one stick, not a whole number of them) inside a BERT layer."""

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        from hfadapt.adapters.examples import ExpFeatures

        torch.manual_seed(0)
        self.features = ExpFeatures(hidden, 100)
        with torch.no_grad():
            self.features.proj.weight.mul_(0.5)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.features(x)
        return x + torch.nn.functional.pad(f, (0, self.hidden - f.shape[-1]))


def _loaded_with_exp(tmp_path: Path):  # type: ignore[no-untyped-def]
    from hfadapt.loading import structural

    loaded = structural.build(str(_bert_folder(tmp_path / "exp", 512)))
    layer = loaded.model.encoder.layer[0].attention.output
    layer.LayerNorm = torch.nn.Sequential(layer.LayerNorm, _ExpGate())
    return loaded


@pytest.mark.slow
def test_diagnose_localizes_unaligned_exp_and_the_adapter_fixes_it(
    tmp_path: Path,
) -> None:
    import hfadapt.judge.diagnose as diagnose_module

    (tmp_path / "exp").mkdir()
    options = {"mode": "structural", "execution": "compile", "record": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stock = diagnose_module.diagnose(
            _loaded_with_exp(tmp_path), without_adapters=["exp-stick-pad"], **options
        )
        (tmp_path / "exp").rename(tmp_path / "exp-stock")
        (tmp_path / "exp").mkdir()
        adapted = diagnose_module.diagnose(_loaded_with_exp(tmp_path), **options)
    m, ma = stock.metrics, adapted.metrics
    print(
        f"exp gate: stock {stock.verdict} min token cosine {m.min_token_cosine if m else None}; "
        f"adapted {adapted.verdict} {ma.min_token_cosine if ma else None}"
    )
    assert stock.verdict == "verification_failed", f"{stock.verdict}: {stock.reason}"
    d = stock.divergence
    assert d is not None, stock.evidence.get("localize_error")
    where = "encoder.layer.0.attention.output.LayerNorm.1.features"
    assert d.module == where, d.summary()
    assert {x["defect_id"] for x in d.defects} == {EXP_DEFECT}, d.defects
    evidence = stock.evidence["defects"]
    assert [e["defect_id"] for e in evidence] == [EXP_DEFECT], evidence
    assert {f["module"] for f in evidence[0]["firings"]} == {where}

    assert adapted.verdict == "pass", f"{adapted.verdict}: {adapted.reason}"
    assert "exp-stick-pad" in adapted.adapters and "defects" not in adapted.evidence
    assert ma is not None and ma.min_token_cosine > 0.999


HEAD_ADAPTERS = ("attention-heads-select", "mpnet-attention-heads-select")
LAYOUT_DEFECTS = frozenset({HEADS_DEFECT, EXP_DEFECT})
# the families whose lowered graphs meet defect.view_transpose_64 at 64 tokens without the head
# adapters (fp16, view + transpose head split); ModernBERT splits heads with a 5-D transpose,
# Gemma runs in bf16; tiny Qwen3's q/k are normed between view and transpose and its one KV
# head makes v's transpose contiguous (a real Qwen3 with 8 KV heads meets it on v)
MEETS_HEAD_SPLIT = {"bert", "distilbert", "mpnet", "xlm-roberta"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type",
    ["bert", "distilbert", "gemma3_text", "modernbert", "mpnet", "qwen3", "xlm-roberta"],
)
def test_bundled_families_meet_neither_defect_at_64_tokens(model_type: str) -> None:
    """The tiny families of test_compile_models at 64 tokens, in their profile dtype, with the
    bundled adapters: no head split read through its transposed view, and no exp at all (their
    softmax is the native op), so defect.exp_unaligned has nothing to match; no other defect
    fires either."""
    from support.tiny_models import TINY, tiny_inputs
    from transformers import AutoConfig, AutoModel

    from hfadapt.spyre.rules.profile import load_profile

    torch.manual_seed(0)
    fields = {"num_hidden_layers": 2, "vocab_size": 1000, "use_cache": False, **TINY[model_type]}
    config = AutoConfig.for_model(model_type, **fields)
    dtype = load_profile().family_dtype(model_type)[0]
    torch_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    model = AutoModel.from_config(config).eval().to(torch_dtype)
    inputs = tiny_inputs(config.vocab_size)
    registry = default_registry()
    reports = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for label, exclude in (("without", HEAD_ADAPTERS), ("with", ())):
            # a fresh Dynamo session: frames compiled for the same model with other adapters
            # would hand this audit their graph boundaries (docs/device-profile-rules.md, the
            # post-LayerNorm handoff's caveat)
            torch._dynamo.reset()
            with registry.apply(model, exclude=exclude):
                _, reports[label] = lower(model, inputs)
    fired = {
        label: sorted({f.module for f in r.defects if f.defect_id == HEADS_DEFECT})
        for label, r in reports.items()
    }
    print(f"{model_type} ({dtype}): head-split firings without / with the head adapters: {fired}")
    assert reports["with"].ok and reports["without"].ok, reports["with"].summary()
    assert bool(fired["without"]) == (model_type in MEETS_HEAD_SPLIT), fired
    exps = {op: n for op, n in reports["with"].ops_seen.items() if op.startswith("aten::exp.")}
    assert exps == {}, f"{model_type} calls exp: {exps}"
    # no defect at all with the adapters (the post-LayerNorm handoff included: once reported in
    # ModernBERT's Wqkv after other tests, from a graph break that depended on the rebind cache;
    # tests/adapters/test_post_ln_handoff.py::test_graph_boundaries_do_not_depend_on_what_the_process_...)
    layout = [str(f) for f in reports["with"].defects]
    assert layout == [], reports["with"].summary()
