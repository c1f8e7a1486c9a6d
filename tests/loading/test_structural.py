"""Structural mode (real or default config, truncated, seeded random weights) and the
structural signature sweeps dedupe on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from hfadapt.errors import CustomCodeError, ModelNotFoundError
from hfadapt.loading import structural
from hfadapt.loading.pooling import PoolingSpec
from hfadapt.loading.structural import (
    STRUCTURAL_VOCAB,
    signature_fields,
    structural_signature,
    truncate_layers,
)

# Small models on a shared machine: one torch thread (see conftest.one_thread).
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_bundled_real_config_offline() -> None:
    lm = structural.build("sentence-transformers/all-MiniLM-L6-v2")
    c = lm.config
    assert lm.structural and lm.source == "structural:bundled", lm.source
    # real shape kept: hidden 384, 12 heads -> head_dim 32; intermediate 1536; layers 6 -> 2
    assert (c.hidden_size, c.num_attention_heads, c.intermediate_size, c.num_hidden_layers) == (
        384,
        12,
        1536,
        2,
    )
    assert c.vocab_size == STRUCTURAL_VOCAB, c.vocab_size
    assert lm.tokenizer is None
    assert lm.pooling == PoolingSpec("mean", True, "1_Pooling/config.json")
    assert len(lm.model.encoder.layer) == 2
    assert any("layers truncated 6 -> 2" in n for n in lm.notes), lm.notes
    assert any("vocab shrunk 30522 -> 4096" in n for n in lm.notes), lm.notes


def test_snapshot_model_without_config_uses_model_type_defaults() -> None:
    lm = structural.build("BAAI/bge-small-en-v1.5")  # in the snapshot, no bundled config
    assert lm.source == "structural:defaults", lm.source
    assert lm.config.hidden_size == AutoConfig.for_model("bert").hidden_size
    assert type(lm.model).__name__ == "BertModel"


def test_local_folder_keeps_its_tokenizer(tiny_model_dirs: dict[str, Path]) -> None:
    lm = structural.build(tiny_model_dirs["xlm-roberta"])
    assert lm.source == "structural:folder" and lm.tokenizer is not None
    assert lm.config.vocab_size == STRUCTURAL_VOCAB  # 30522 rows shrunk; ids get folded


def test_t5_family_builds_its_encoder_only(tmp_path: Path) -> None:
    folder = tmp_path / "sentence-t5-like"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]})
    )
    lm = structural.build(folder)
    assert type(lm.model).__name__ == "T5EncoderModel", type(lm.model)
    assert lm.config.num_layers == 2 and lm.config.vocab_size == STRUCTURAL_VOCAB, lm.notes


def test_random_weights_are_seeded() -> None:
    a = structural.build("sentence-transformers/all-MiniLM-L6-v2").model.state_dict()
    b = structural.build("sentence-transformers/all-MiniLM-L6-v2").model.state_dict()
    c = structural.build("sentence-transformers/all-MiniLM-L6-v2", seed=1).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_truncation_keeps_one_layer_of_each_type() -> None:
    config = AutoConfig.for_model("gemma3_text")  # sliding x5, full, sliding x5, full...
    kinds = list(config.layer_types)
    note = truncate_layers(config, 2)
    first_full = kinds.index("full_attention")
    assert config.layer_types == ["sliding_attention", "full_attention"], config.layer_types
    assert (
        config.num_hidden_layers == 2
        and note == f"layers truncated {len(kinds)} -> 2 (kept [0, {first_full}])"
    ), note


def test_vocab_shrink_renumbers_special_ids_past_the_new_table() -> None:
    from hfadapt.loading.probes import random_probes, reserved_ids
    from hfadapt.loading.structural import shrink_vocab

    config = AutoConfig.for_model(
        "qwen3", vocab_size=151936, bos_token_id=151643, eos_token_id=[151645, 151643]
    )
    note = shrink_vocab(config)
    assert config.vocab_size == STRUCTURAL_VOCAB, note
    assert (config.bos_token_id, config.eos_token_id) == (0, [1, 0]), (
        config.bos_token_id,
        config.eos_token_id,
    )
    assert note and "151643: 0" in note and reserved_ids(config) == 2, note
    ids = random_probes(config).inputs["input_ids"]
    assert int(ids.max()) < STRUCTURAL_VOCAB, int(ids.max())
    # small special ids (roberta's pad 1) stay where they are
    roberta = AutoConfig.for_model("xlm-roberta", vocab_size=250002)
    shrink_vocab(roberta)
    assert (roberta.pad_token_id, roberta.bos_token_id, roberta.eos_token_id) == (1, 0, 2)


def test_unknown_id_offline() -> None:
    with pytest.raises(ModelNotFoundError, match="not in hfadapt's snapshot"):
        structural.build("nobody/never-heard-of-it")


def test_snapshot_custom_code_is_refused() -> None:
    from hfadapt.loading.load import snapshot_index
    from hfadapt.loading.translate import family_for_row

    row = next(
        r
        for r in snapshot_index().values()
        if r.is_custom_code
        and r.model_type
        and family_for_row(r.config_class, r.model_type, r.architectures) is None
    )
    with pytest.raises(CustomCodeError, match=r"custom_code.*no native translation"):
        structural.build(row.model_id)
    moe = snapshot_index()["nomic-ai/nomic-embed-text-v2-moe"]  # a family, but not its shape
    with pytest.raises(
        CustomCodeError, match=rf"no native translation \(parameters: {moe.parameters}"
    ):
        structural.build(moe.model_id)


# ---- the signature ---------------------------------------------------------------------------

MINILM = json.loads(
    (
        Path(structural.__file__).parents[1]
        / "data/configs/sentence-transformers__all-MiniLM-L6-v2/config.json"
    ).read_text()
)


def test_signature_is_stable_and_ignores_what_a_structural_run_does_not_judge() -> None:
    sig = structural_signature(MINILM)
    assert sig == structural_signature(dict(MINILM)) and len(sig) == 16
    # a dict and the config built from it agree (a sweep hashes config.json, diagnose a config)
    assert sig == structural_signature(structural.config_from_dict(MINILM))
    # layers (truncated to 2), a vocabulary past the 4096 rows judged, max positions (no rule
    # reads them): same signature (MiniLM-L12 vs L6)
    assert sig == structural_signature(
        {**MINILM, "num_hidden_layers": 12, "vocab_size": 250002, "max_position_embeddings": 1024}
    )


@pytest.mark.parametrize(
    "change",
    [
        {"hidden_act": "gelu_new"},
        {"hidden_size": 400, "num_attention_heads": 10},  # alignment mod 64 and head_dim
        {"intermediate_size": 1500},
        {"num_attention_heads": 6},  # head_dim 32 -> 64
        {"type_vocab_size": 1},
        {"model_type": "roberta"},
        # sizes with the same alignment and head_dim: still different shapes, never one verdict
        {"hidden_size": 768, "num_attention_heads": 24, "intermediate_size": 1536},
        {"intermediate_size": 1600},  # 1536 + 64
        {"vocab_size": 1000},  # a vocabulary smaller than the 4096 rows a structural run keeps
    ],
)
def test_signature_changes_with_what_decides_lowering(change: dict[str, object]) -> None:
    before, after = signature_fields(MINILM), signature_fields({**MINILM, **change})
    diff = {k: (before.get(k), after.get(k)) for k in after if before.get(k) != after.get(k)}
    assert structural_signature(MINILM) != structural_signature({**MINILM, **change}), diff
    assert diff, f"{change} changed nothing in {before}"


def test_rubert_tiny2_shape_never_shares_bert_base_signature() -> None:
    """cointegrated/rubert-tiny2 (hidden 312, 12 heads, intermediate 600) against BERT-base
    defaults: every size differs, so do the signatures and the lowering classes."""
    tiny = {"model_type": "bert", "hidden_size": 312, "num_attention_heads": 12,
            "intermediate_size": 600, "vocab_size": 83828, "max_position_embeddings": 2048}  # fmt: skip
    base = {"model_type": "bert"}
    small, big = signature_fields(tiny), signature_fields(base)
    assert (small["hidden_size"], small["head_dim"], small["intermediate_size"]) == (
        312,
        26,
        600,
    ), small
    assert (big["hidden_size"], big["head_dim"], big["intermediate_size"]) == (768, 64, 3072), big
    assert structural_signature(tiny) != structural_signature(base)
    assert structural.lowering_signature(tiny) != structural.lowering_signature(base)


def test_signature_knows_attention_defaults() -> None:
    assert signature_fields({"model_type": "mpnet"})["attn_implementation"] == "eager"
    assert signature_fields({"model_type": "bert"})["attn_implementation"] == "sdpa"
    assert (
        signature_fields({"model_type": "bert", "attn_implementation": "eager"})[
            "attn_implementation"
        ]
        == "eager"
    )


def test_an_encoder_decoder_keeps_two_layers_on_both_sides() -> None:
    """BART aliases num_hidden_layers to encoder_layers: the decoder's 12 layers would stay and
    the structural run would cost a full-depth decoder (135 s of a sweep's 939 worker-seconds)."""
    from transformers import AutoConfig

    from hfadapt.loading.structural import truncate_layers

    for model_type, field in (("bart", "decoder_layers"), ("t5", "num_decoder_layers")):
        config = AutoConfig.for_model(model_type)
        before = getattr(config, field)
        note = truncate_layers(config)
        print(f"{model_type}: {note}")
        assert config.num_hidden_layers == 2 and getattr(config, field) == 2, (before, note)
        assert note is not None and f"{field} {before} -> 2" in note, note


def test_a_composite_config_is_truncated_in_every_tower() -> None:
    """Vision + text configs nest their towers (Qwen2.5-Omni: text, vision ``depth``, audio
    ``encoder_layers``): each is cut to two layers and its vocabulary shrunk, widths kept. Before,
    the towers kept every layer and five units of a sweep ran out of memory (130 worker-s)."""
    from hfadapt.loading.structural import shrink_config

    config = AutoConfig.for_model("qwen2_5_omni_thinker")
    widths = {name: sub.hidden_size for name, sub in structural.sub_configs(config)}
    notes = shrink_config(config)
    print(notes)
    towers = dict(structural.sub_configs(config))
    assert set(towers) == {"text_config", "vision_config", "audio_config"}, set(towers)
    assert towers["vision_config"].depth == 2, towers["vision_config"].depth
    assert towers["audio_config"].encoder_layers == 2, towers["audio_config"].encoder_layers
    assert towers["text_config"].num_hidden_layers == 2
    assert towers["text_config"].vocab_size == STRUCTURAL_VOCAB
    assert {n: s.hidden_size for n, s in towers.items()} == widths, widths
    assert "vision_config: layers truncated 32 -> 2 (kept [0, 1])" in notes, notes


def test_a_config_without_probe_ids_is_built_without_weights(tmp_path: Path) -> None:
    """No tokenizer and no vocabulary of its own (a vision-only model; composite vision + text
    configs are judged on their text tower now): the judge stops at its probes, so the stand-in
    is built on the meta device (no weights seeded) and the verdict says why, as before."""
    from hfadapt.judge.diagnose import diagnose

    folder = tmp_path / "vit"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "vit"}))
    loaded = structural.build(folder)
    devices = {p.device.type for p in loaded.model.parameters()}
    assert devices == {"meta"}, devices
    assert any("meta tensors" in n for n in loaded.notes), loaded.notes
    diag = diagnose(folder, mode="structural", record=False)
    assert diag.verdict == "load_failed", (diag.verdict, diag.reason)
    assert "no usable vocab_size for random probe ids" in diag.reason, diag.reason
    # a config with a vocabulary still gets real weights
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert {p.device.type for p in structural.build(bert).model.parameters()} == {"cpu"}


@pytest.mark.slow
def test_a_modernbert_with_32_wide_heads_passes_compiled() -> None:
    """granite-embedding-small-english-r2 (ModernBERT, head_dim 32, its own bundled config):
    its rotation runs in fp16; a 32-wide rotate_half as ``x @ R`` would be a matmul whose K is
    off the stick (layout.matmul_k), and its halves on a new axis the [2, 16] split of the stick
    torch-spyre#3138 refuses (layout.interleaved_stick_split). rope-rotate-padded-modernbert
    zero-pads the head to a whole stick and multiplies by R with zero rows for the padding."""
    from hfadapt.judge.diagnose import diagnose

    diag = diagnose(
        "ibm-granite/granite-embedding-small-english-r2",
        mode="structural",
        execution="compile",
        record=False,
    )
    cos = diag.metrics.min_token_cosine if diag.metrics else None
    assert diag.verdict == "pass", f"{diag.verdict}: {diag.reason} (min token cosine {cos})"
    assert "rope-rotate-padded-modernbert" in diag.adapters, diag.adapters
