"""New families judged natively, never with their own code: the text tower of a multimodal
embedder (hfadapt.loading.translate.text_tower), bidirectional decoders as native classes with
``is_causal=False`` (the gte_qwen2, llama_bidirec and pplx_qwen3 families), and gemma2's and
Qwen3-VL's rows of the RoPE table. Tiny models of each family, built locally."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from support.families import bundled_family

from hfadapt.hub.snapshot import read_snapshot
from hfadapt.loading import translate
from hfadapt.loading.remote import text_tower_model
from hfadapt.loading.signature import config_from_dict, structural_signature
from hfadapt.loading.structural import build

TINY_QWEN3_VL: dict[str, Any] = {
    "model_type": "qwen3_vl",
    "text_config": {
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 1000,
        "rope_parameters": {"rope_type": "default", "rope_theta": 5e6,
                            "mrope_section": [24, 20, 20], "mrope_interleaved": True},
    },
    "vision_config": {"depth": 1, "hidden_size": 64, "intermediate_size": 64, "num_heads": 1,
                      "out_hidden_size": 256},
}  # fmt: skip
TINY_METACLIP_2: dict[str, Any] = {
    "model_type": "metaclip_2",
    "text_config": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                    "num_attention_heads": 2, "vocab_size": 1000, "eos_token_id": 2},
    "vision_config": {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
                      "num_attention_heads": 1},
}  # fmt: skip
TINY_DECODER = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                "vocab_size": 100, "max_position_embeddings": 64}  # fmt: skip


def _composite(raw: dict[str, Any]) -> Any:
    from transformers import AutoModel

    torch.manual_seed(0)
    return AutoModel.from_config(config_from_dict(raw)).eval()


@pytest.mark.parametrize(
    ("raw", "text_class"),
    [(TINY_QWEN3_VL, "Qwen3VLTextModel"), (TINY_METACLIP_2, "MetaClip2TextModel")],
)
def test_text_tower_is_the_module_the_composite_runs_for_text(
    raw: dict[str, Any], text_class: str
) -> None:
    got = translate.text_tower(raw)
    assert got is not None and got.family == f"text tower of {raw['model_type']}"
    # structural: the text model class, built from text_config alone
    built = build(f"tiny/{raw['model_type']}", config=copy.deepcopy(raw))
    assert type(built.model).__name__ == text_class, type(built.model).__name__
    assert built.translated_from is not None
    assert built.translated_from["family"] == got.family
    # full mode: the composite's own text module, with the composite's weights; its output on
    # text is what the composite computes for text
    composite = _composite(raw)
    text, config, notes = text_tower_model(composite, got, "tiny")
    assert type(text).__name__ == text_class and config is text.config
    assert "judged as its text model" in notes[0]
    ids = torch.tensor([[5, 6, 7, 8, 2]])
    with torch.no_grad():
        alone = text(input_ids=ids).last_hidden_state
        if raw["model_type"] == "qwen3_vl":
            whole = composite(input_ids=ids).last_hidden_state
        else:
            whole = composite.text_model(input_ids=ids).last_hidden_state
    diff = (alone - whole).abs().max().item()
    assert diff == 0.0, f"text tower differs from the composite's text path by {diff}"


def test_a_config_of_no_known_composite_has_no_text_tower() -> None:
    assert translate.text_tower({"model_type": "bert"}) is None
    assert translate.text_model_class("metaclip_2_text_model") == "MetaClip2TextModel"
    assert translate.text_model_class("bert") is None


def _tiny_translation(family: str, raw: dict[str, Any]) -> dict[str, Any]:
    got = translate.translate(raw, bundled_family(family))
    assert isinstance(got, translate.Translation), got.one_line()
    return {**got.config, **TINY_DECODER}


def _token0_moves_with_last_token(native: dict[str, Any]) -> float:
    from transformers import AutoModel

    torch.manual_seed(0)
    model = AutoModel.from_config(config_from_dict(native)).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    other = ids.clone()
    other[0, 4] = 9
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        b = model(input_ids=other, attention_mask=torch.ones_like(ids)).last_hidden_state
    return float((a[0, 0] - b[0, 0]).abs().max())


BIDIRECTIONAL = [
    ("gte_qwen2", lambda: copy.deepcopy(bundled_family("gte_qwen2").variants[0]["config"])),
    ("llama_bidirec", lambda: {
        "model_type": "llama_bidirec", "architectures": ["LlamaBidirectionalModel"],
        "auto_map": {"AutoConfig": "llama_bidirectional_model.LlamaBidirectionalConfig",
                     "AutoModel": "llama_bidirectional_model.LlamaBidirectionalModel"},
        "pooling": "avg", "temperature": 1.0, "rope_theta": 500000.0, "hidden_act": "silu",
        **TINY_DECODER}),
    ("pplx_qwen3", lambda: {
        "model_type": "bidirectional_pplx_qwen3", "architectures": ["PPLXQwen3Model"],
        "auto_map": {"AutoConfig": "configuration.PPLXQwen3Config",
                     "AutoModel": "modeling.PPLXQwen3Model"},
        "use_bidirectional_attention": True, "rope_theta": 1000000, "hidden_act": "silu",
        **TINY_DECODER}),
]  # fmt: skip


@pytest.mark.parametrize(("family", "make"), BIDIRECTIONAL, ids=[b[0] for b in BIDIRECTIONAL])
def test_bidirectional_decoder_is_the_native_class_with_is_causal_false(
    family: str, make: Any
) -> None:
    native = _tiny_translation(family, make())
    assert native["is_causal"] is False, native
    moved = _token0_moves_with_last_token(native)
    assert moved > 1e-4, f"{family}: token 0 ignores the last token ({moved}): still causal"
    causal = _token0_moves_with_last_token({**native, "is_causal": True})
    assert causal == 0.0, f"the causal twin of {family} sees the future ({causal})"
    # never one verdict for both: the signature records the bidirectional mask
    sig_bi = structural_signature(config_from_dict(native))
    sig_causal = structural_signature(config_from_dict({**native, "is_causal": True}))
    assert sig_bi != sig_causal


def test_bidirectionality_must_be_the_models_own_statement() -> None:
    raw = copy.deepcopy(bundled_family("gte_qwen2").variants[0]["config"])
    unstated = {k: v for k, v in raw.items() if k != "is_causal"}
    got = translate.translate(unstated)
    assert isinstance(got, translate.Refusal) and got.field == "is_causal", got
    causal = translate.translate({**raw, "is_causal": True})
    assert isinstance(causal, translate.Refusal) and causal.field == "is_causal", causal
    other = translate.translate({**raw, "auto_map": {"AutoModel": "modeling_x.Qwen2Model"}})
    assert isinstance(other, translate.Refusal) and other.field == "auto_map.AutoModel", other
    pplx = {"model_type": "bidirectional_pplx_qwen3", "architectures": ["PPLXQwen3Model"],
            "auto_map": {"AutoConfig": "configuration.PPLXQwen3Config"}, **TINY_DECODER}  # fmt: skip
    got = translate.translate(pplx)
    assert isinstance(got, translate.Refusal)
    assert got.field == "use_bidirectional_attention", got


def test_gte_qwen2_shape_has_the_snapshot_parameter_count() -> None:
    from transformers import AutoModel

    variant = bundled_family("gte_qwen2").variants[0]
    native = translate.translate(copy.deepcopy(variant["config"]))
    assert isinstance(native, translate.Translation)
    with torch.device("meta"):
        model = AutoModel.from_config(config_from_dict(native.config))
    count = sum(p.numel() for p in model.parameters())
    rows = {r.model_id: r for r in read_snapshot()}
    stella = rows["NovaSearch/stella_en_1.5B_v5"].parameters
    assert count == variant["parameters"] == stella, (count, variant["parameters"], stella)
    for model_id in ("NovaSearch/stella_en_1.5B_v5", "Alibaba-NLP/gte-Qwen2-1.5B-instruct"):
        row = rows[model_id]
        got = translate.translate_row(
            model_id, row.config_class, row.model_type, row.parameters,
            approximate=row.parameters_from_name, architectures=row.architectures,
        )  # fmt: skip
        assert isinstance(got, translate.Translation), got.one_line()
        assert got.config["is_causal"] is False


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("qwen3_vl", TINY_QWEN3_VL),
        ("gemma2", {"model_type": "gemma2", **TINY_DECODER, "hidden_size": 256,
                    "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128,
                    "intermediate_size": 512}),
    ],
)  # fmt: skip
def test_new_rope_rows_pass_with_adapters_and_fail_without(name: str, raw: dict[str, Any]) -> None:
    from hfadapt.judge.diagnose import diagnose

    verdicts = {}
    for adapters in (False, True):
        d = diagnose(f"tiny/{name}", config=copy.deepcopy(raw), mode="structural",
                     adapters=adapters, record=False, localize_failures=False,
                     execution="compile" if adapters else "eager")  # fmt: skip
        verdicts[adapters] = (d.verdict, d.reason, d.adapters)
    assert verdicts[False][0] == "lowering_failed", f"{name} passes without adapters: {verdicts}"
    assert verdicts[True][0] == "pass", f"{name} with adapters: {verdicts[True]}"
    applied = " ".join(str(a) for a in verdicts[True][2] or [])
    family = "qwen3-vl" if name == "qwen3_vl" else name
    assert f"rope-host-{family}" in applied, applied
