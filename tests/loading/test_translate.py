"""Native translations of remote-code families (hfadapt.loading.translate): each family's
published shape builds a native model with the snapshot's parameter count, an unknown field or
an unsupported value keeps the model custom_code with that field named, and a checkpoint
written with the remote naming loads onto the native class with nothing missing."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from support.families import bundled_family

from hfadapt.errors import CustomCodeError
from hfadapt.hub.snapshot import read_snapshot
from hfadapt.loading import translate
from hfadapt.loading.signature import config_from_dict


def _variant(family: str, name: str) -> dict[str, Any]:
    fam = bundled_family(family)
    return copy.deepcopy(next(v for v in fam.variants if v["name"] == name))


def _row(model_id: str) -> Any:
    return next(r for r in read_snapshot() if r.model_id == model_id)


def _native_parameters(config: dict[str, Any]) -> int:
    from transformers import AutoModel

    with torch.device("meta"):
        model = AutoModel.from_config(config_from_dict(config))
    return sum(p.numel() for p in model.parameters())


def _jina_lora_parameters(raw: dict[str, Any]) -> int:
    """LoRA tensors the remote jina v3 checkpoint adds per task: rank * (fan_in + fan_out) on
    the word and token-type embeddings, Wqkv, out_proj, fc1, fc2 and the pooler."""
    h, inter, layers = raw["hidden_size"], raw["intermediate_size"], raw["num_hidden_layers"]
    per_layer = (h + 3 * h) + (h + h) + (h + inter) + (inter + h)
    per_task = (raw["vocab_size"] + h) + (raw["type_vocab_size"] + h) + layers * per_layer + 2 * h
    return len(raw["lora_adaptations"]) * raw["lora_rank"] * per_task


# (family, published shape, a snapshot row of that shape, extra parameters the row counts)
SHAPES = [
    ("nomic_bert", "nomic-embed-text-v1.5", "nomic-ai/nomic-embed-text-v1.5", 0),
    ("new", "gte-base-en-v1.5", "Alibaba-NLP/gte-base-en-v1.5", 0),
    ("new", "gte-large-en-v1.5", "Alibaba-NLP/gte-large-en-v1.5", 0),
    # the published repo also ships a 1-label token-classification head: hidden + 1
    ("new", "gte-multilingual-base", "Alibaba-NLP/gte-multilingual-base", 768 + 1),
    ("jina_embeddings_v3", "jina-embeddings-v3", "jinaai/jina-embeddings-v3", None),
    ("eurobert", "EuroBERT-210m", "jinaai/jina-embeddings-v5-text-nano-retrieval", 0),
]


@pytest.mark.parametrize(("family", "shape", "model_id", "extra"), SHAPES)
def test_each_family_translates_to_the_published_parameter_count(
    family: str, shape: str, model_id: str, extra: int | None
) -> None:
    variant = _variant(family, shape)
    got = translate.translate(variant["config"])
    assert isinstance(got, translate.Translation), f"{shape}: {got}"
    assert got.family == family and got.native_type == bundled_family(family).native
    native = _native_parameters(got.config)
    if extra is None:  # jina v3: the LoRA task adapters are counted by the Hub, not used
        extra = _jina_lora_parameters(variant["config"])
        assert extra == variant["lora_parameters"], f"LoRA parameters {extra}"
    row = _row(model_id)
    assert row.is_custom_code
    assert native + extra == row.parameters, (
        f"{model_id}: native {family} {native} + {extra} != snapshot {row.parameters}"
    )
    assert variant["parameters"] == native + (0 if family != "jina_embeddings_v3" else extra)


def test_nomic_renames_gpt2_style_fields_and_rewrites_rope() -> None:
    got = translate.translate(_variant("nomic_bert", "nomic-embed-text-v1.5")["config"])
    assert isinstance(got, translate.Translation)
    assert got.renamed["n_embd"] == "hidden_size" and got.renamed["n_inner"] == "intermediate_size"
    config = config_from_dict(got.config)
    assert (config.hidden_size, config.num_attention_heads, config.intermediate_size) == (
        768,
        12,
        3072,
    )
    assert config.hidden_act == "silu" and config.rope_parameters["rope_theta"] == 1000.0
    assert "use_flash_attn" in got.ignored


def test_fixed_ntk_rope_scaling_is_base_times_factor_then_linear() -> None:
    """Alibaba new-impl fixed NTK: inv_freq = 1/(base*f)^(2i/d) / f^(2/d); the native linear
    rope type with theta base*f and factor f^(2/d) gives the same frequencies."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    raw = _variant("new", "gte-base-en-v1.5")["config"]
    got = translate.translate(raw)
    assert isinstance(got, translate.Translation)
    config = config_from_dict(got.config)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["linear"](config, "cpu")
    dim, base, f = 64, float(raw["rope_theta"]), raw["rope_scaling"]["factor"]
    remote = 1.0 / (base * f) ** (torch.arange(0, dim, 2).float() / dim) / f ** (2 / dim)
    diff = float((inv_freq - remote).abs().max())
    assert diff < 1e-9, f"max |inv_freq diff| {diff}"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"flux_capacitor": 3}, "flux_capacitor"),  # unknown field
        ({"rotary_emb_fraction": 0.5}, "rotary_emb_fraction"),  # partial rotary
        ({"num_experts": 8, "moe_every_n_layers": 2}, "num_experts"),  # nomic v2 MoE
        ({"activation_function": "gelu"}, "activation_function"),
        ({"prenorm": True}, "prenorm"),
        ({"architectures": ["NomicVisionModel"]}, "architectures"),
    ],
)
def test_what_the_native_class_does_not_compute_keeps_custom_code(
    change: dict[str, Any], field: str
) -> None:
    raw = _variant("nomic_bert", "nomic-embed-text-v1.5")["config"]
    raw.update(change)
    got = translate.translate(raw)
    assert isinstance(got, translate.Refusal), f"{change} was translated"
    assert got.field == field, f"refusal names {got.field!r}: {got.reason}"


def test_unknown_rope_scaling_and_unmapped_class_are_named() -> None:
    raw = _variant("new", "gte-base-en-v1.5")["config"]
    raw["rope_scaling"] = {"type": "ntk", "factor": 2.0, "mixed_b": 0.5}
    got = translate.translate(raw)
    assert isinstance(got, translate.Refusal) and got.field == "rope_scaling.mixed_b"
    mistral = {"auto_map": {"AutoConfig": "org/bidi--configuration.MistralBiDirectionalConfig"}}
    got = translate.translate(mistral)
    assert isinstance(got, translate.Refusal) and "native mistral is causal" in got.reason, got


def test_snapshot_rows_match_a_published_shape_by_parameter_count() -> None:
    v15 = _row("nomic-ai/nomic-embed-text-v1.5")
    got = translate.translate_row(v15.model_id, v15.config_class, v15.model_type, v15.parameters)
    assert isinstance(got, translate.Translation) and "nomic-embed-text-v1.5" in got.source
    moe = _row("nomic-ai/nomic-embed-text-v2-moe")
    got = translate.translate_row(moe.model_id, moe.config_class, moe.model_type, moe.parameters)
    assert isinstance(got, translate.Refusal) and got.field == "parameters", got
    assert str(moe.parameters) in got.reason
    mgte = _row("Alibaba-NLP/gte-multilingual-base")  # also ships a 1-label token classifier
    got = translate.translate_row(
        mgte.model_id, mgte.config_class, mgte.model_type, mgte.parameters,
        architectures=mgte.architectures,
    )  # fmt: skip
    assert isinstance(got, translate.Translation), got
    assert any("1-label classification head" in n for n in got.notes), got.notes
    got = translate.translate_row(
        mgte.model_id, mgte.config_class, mgte.model_type, mgte.parameters
    )
    assert isinstance(got, translate.Refusal), "a head is accepted only for a *Classification row"


def test_structural_build_names_the_unknown_field(tmp_path: Path) -> None:
    from hfadapt.loading import structural

    raw = _variant("nomic_bert", "nomic-embed-text-v1.5")["config"]
    raw["flux_capacitor"] = 3
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CustomCodeError, match=r"flux_capacitor.*`trust_remote_code`"):
        structural.build(tmp_path)


def test_structural_build_of_a_remote_folder_is_the_native_class(tmp_path: Path) -> None:
    from hfadapt.loading import structural

    (tmp_path / "config.json").write_text(json.dumps(_variant("new", "gte-base-en-v1.5")["config"]))
    loaded = structural.build(tmp_path)
    assert type(loaded.model).__name__ == "GteModel"
    assert loaded.translated_from is not None and loaded.translated_from["family"] == "new"
    assert loaded.raw_config is not None and loaded.raw_config["model_type"] == "gte"


# ---- checkpoints with the remote naming -----------------------------------------------------


def _tiny(family: str, shape: str) -> dict[str, Any]:
    raw = _variant(family, shape)["config"]
    small = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2}
    small |= {"num_attention_heads": 4, "vocab_size": 128}
    names = {v: k for k, v in bundled_family(family).renames.items()}
    for native_name, value in small.items():
        raw[names.get(native_name, native_name)] = value
    raw.pop("head_dim", None)
    if family == "eurobert":  # special ids inside the tiny vocabulary
        raw.update(pad_token_id=1, bos_token_id=0, eos_token_id=1, mask_token_id=2)
    return raw


def _remote_named(family: str, native: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The native state dict written the way the remote code names (and fuses) it."""
    out: dict[str, torch.Tensor] = {}
    prefix = {
        "nomic_bert": "",
        "new": "new.",
        "jina_embeddings_v3": "roberta.",
        "eurobert": "model.",
    }[family]
    for key, value in native.items():
        name = key
        if family in ("nomic_bert", "jina_embeddings_v3"):
            name = name.replace("embeddings.LayerNorm.", "emb_ln.").replace(
                "layers.", "encoder.layers.", 1
            )
            name = name.replace("post_attention_layernorm", "norm1").replace(
                "post_mlp_layernorm", "norm2"
            )
        if family == "nomic_bert":
            name = name.replace("self_attn.o_proj", "attn.out_proj").replace(
                "mlp.up_proj", "mlp.fc11"
            )
            name = name.replace("mlp.gate_proj", "mlp.fc12").replace("mlp.down_proj", "mlp.fc2")
        if family == "jina_embeddings_v3":
            name = name.replace("self_attn.o_proj", "mixer.out_proj")
        if family == "new":
            name = name.replace("layers.", "encoder.layer.", 1).replace(
                "self_attn.o_proj", "attention.o_proj"
            )
            name = name.replace("post_attention_layernorm", "attn_ln").replace(
                "post_mlp_layernorm", "mlp_ln"
            )
        out[prefix + name] = value
    fused = {
        "nomic_bert": "attn.Wqkv",
        "jina_embeddings_v3": "mixer.Wqkv",
        "new": "attention.qkv_proj",
    }
    for key in [k for k in out if ".self_attn.q_proj." in k]:
        parts = [out.pop(key.replace("q_proj", p)) for p in ("q_proj", "k_proj", "v_proj")]
        if family in fused:
            out[key.replace("self_attn.q_proj", fused[family])] = torch.cat(parts)
        else:
            for p, t in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
                out[key.replace("q_proj", p)] = t
    if family == "new":
        for key in [k for k in out if ".mlp.up_proj." in k]:
            gate = out.pop(key.replace("up_proj", "gate_proj"))
            out[key.replace("up_proj", "up_gate_proj")] = torch.cat([out.pop(key), gate])
    if family == "jina_embeddings_v3":  # torch.nn.utils.parametrize names, plus one task's LoRA
        for key in [k for k in out if k.endswith(".weight") and "Wqkv" in k]:
            base = key[: -len(".weight")]
            out[base + ".parametrizations.weight.original"] = out.pop(key)
            out[base + ".parametrizations.weight.0.lora_A"] = torch.zeros(5, 4, 64)
    return out


@pytest.mark.parametrize(
    ("family", "shape"),
    [
        ("nomic_bert", "nomic-embed-text-v1.5"),
        ("new", "gte-base-en-v1.5"),
        ("jina_embeddings_v3", "jina-embeddings-v3"),
        ("eurobert", "EuroBERT-210m"),
    ],
)
def test_remote_checkpoint_keys_map_onto_the_native_model(family: str, shape: str) -> None:
    from transformers import AutoModel

    got = translate.translate(_tiny(family, shape))
    assert isinstance(got, translate.Translation), got
    torch.manual_seed(0)
    model = AutoModel.from_config(config_from_dict(got.config))
    native = {k: v.clone() for k, v in model.state_dict().items()}
    renamed, dropped = translate.rename_checkpoint(family, _remote_named(family, native))
    missing = sorted(set(native) - set(renamed))
    unexpected = sorted(set(renamed) - set(native))
    assert not missing and not unexpected, f"missing {missing[:3]}, unexpected {unexpected[:3]}"
    worst = max(float((renamed[k] - native[k]).abs().max()) for k in native)
    assert worst == 0.0, f"a renamed tensor differs by {worst}"
    assert all("lora" in k for k in dropped), dropped


def test_full_mode_loads_a_remote_named_checkpoint(tmp_path: Path, minilm_path: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModel, AutoTokenizer

    from hfadapt.loading.load import load

    raw = _tiny("nomic_bert", "nomic-embed-text-v1.5")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    raw["vocab_size"] = tokenizer.vocab_size
    got = translate.translate(raw)
    assert isinstance(got, translate.Translation)
    torch.manual_seed(1)
    reference = AutoModel.from_config(config_from_dict(got.config)).eval()
    state = _remote_named("nomic_bert", reference.state_dict())
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(raw))
    tokenizer.save_pretrained(tmp_path)

    loaded = load(tmp_path)
    assert type(loaded.model).__name__ == "NomicBertModel"
    assert loaded.translated_from is not None and loaded.translated_from["family"] == "nomic_bert"
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102]])
    with torch.inference_mode():
        want = reference(input_ids=ids).last_hidden_state
        have = loaded.model(input_ids=ids).last_hidden_state
    diff = float((want - have).abs().max())
    assert diff == 0.0, f"loaded translated model differs from the written one by {diff}"

    state.pop(next(k for k in state if "Wqkv" in k))
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "model.safetensors"))
    from hfadapt.errors import WeightsError

    with pytest.raises(WeightsError, match=r"lack 3 tensor"):
        load(tmp_path)
