"""Probe inputs: fixed sentences of mixed lengths, languages and scripts, one batch padded to a
multiple of 64; deterministic random ids when there is no tokenizer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from hfadapt.loading.probes import (
    PAD_MULTIPLE,
    PROBE_SENTENCES,
    RANDOM_LENGTHS,
    fold_ids,
    max_probe_length,
    model_inputs,
    random_probes,
    tokenize_probes,
)

# Small models on a shared machine: one torch thread (see conftest.one_thread).
pytestmark = pytest.mark.usefixtures("one_thread")

SCRIPTS = {
    "CJK": r"[\u4e00-\u9fff]",
    "kana": r"[\u3040-\u30ff]",
    "Arabic": r"[\u0600-\u06ff]",
    "Cyrillic": r"[\u0400-\u04ff]",
    "Devanagari": r"[\u0900-\u097f]",
    "German umlaut": r"[äöüß]",
    "French accent": r"[éèàç]",
    "code": r"def \w+\(",
    "numbers": r"\d+\.\d\d",
}


def test_probe_sentences_cover_scripts_and_lengths() -> None:
    text = "\n".join(PROBE_SENTENCES)
    missing = [name for name, pattern in SCRIPTS.items() if not re.search(pattern, text)]
    assert not missing, f"probe sentences lack {missing}"
    words = sorted(len(s.split()) for s in PROBE_SENTENCES)
    assert words[0] <= 3 and words[-1] >= 150, (
        f"word counts {words}: need a very short and a long probe"
    )


def test_tokenized_batch_is_padded_to_a_multiple_of_64(minilm_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    batch = tokenize_probes(tokenizer)
    b, s = batch.shape
    lengths = batch.attention_mask.sum(dim=1).tolist()
    assert b == len(PROBE_SENTENCES)
    assert s % PAD_MULTIPLE == 0 and s >= max(lengths), f"padded length {s}, real lengths {lengths}"
    assert max(lengths) > 128 and min(lengths) < 10, (
        lengths
    )  # the long paragraph and "Hello, world!"
    # the pad positions hold the pad id, the real ones do not
    ids = batch.inputs["input_ids"]
    assert bool((ids[batch.attention_mask == 0] == tokenizer.pad_token_id).all())
    assert batch.source == "tokenizer" and batch.texts == PROBE_SENTENCES


def test_max_length_respects_position_tables() -> None:
    assert max_probe_length(AutoConfig.for_model("bert", max_position_embeddings=512)) == 512
    assert max_probe_length(AutoConfig.for_model("xlm-roberta", max_position_embeddings=514)) == 512
    assert max_probe_length(AutoConfig.for_model("bert", max_position_embeddings=200)) == 192


def test_random_probes_are_deterministic_with_a_realistic_mask() -> None:
    config = AutoConfig.for_model("xlm-roberta", vocab_size=4096)
    a, b = random_probes(config), random_probes(config)
    assert torch.equal(a.inputs["input_ids"], b.inputs["input_ids"])
    assert not torch.equal(a.inputs["input_ids"], random_probes(config, seed=1).inputs["input_ids"])
    lengths = a.attention_mask.sum(dim=1).tolist()
    assert lengths == list(RANDOM_LENGTHS), lengths
    assert a.shape[1] % PAD_MULTIPLE == 0, a.shape
    ids = a.inputs["input_ids"]
    real = a.attention_mask.bool()
    assert int(ids.max()) < 4096 and bool((ids[~real] == config.pad_token_id).all())
    assert bool((ids[:, 0] == config.bos_token_id).all()), ids[:, 0]
    # random ids never hit a special id except where placed (pad 1 would shift roberta positions)
    inner = torch.cat([ids[i, 1 : n - 1] for i, n in enumerate(lengths)])
    assert int(inner.min()) >= 3, int(inner.min())
    assert "token_type_ids" in a.inputs


def test_random_probes_fit_a_short_position_table() -> None:
    config = AutoConfig.for_model("bert", vocab_size=500, max_position_embeddings=128)
    batch = random_probes(config)
    assert batch.shape[1] == 128 and int(batch.attention_mask.sum(dim=1).max()) == 128, batch.shape


def test_fold_ids_keeps_special_ids_and_fits_the_vocab() -> None:
    config = AutoConfig.for_model("xlm-roberta")  # pad 1, bos 0, eos 2
    batch = random_probes(config)
    folded = fold_ids(batch, 4096, reserved=3)
    ids, before = folded.inputs["input_ids"], batch.inputs["input_ids"]
    assert int(ids.max()) < 4096
    specials = before < 3
    assert torch.equal(ids[specials], before[specials])
    assert int(ids[~specials].min()) >= 3
    assert folded.folded_vocab == 4096


@pytest.mark.parametrize(("arch", "expected"), [("bert", True), ("distilbert", False)])
def test_model_inputs_drop_what_forward_does_not_take(
    tiny_model_dirs: dict[str, Path], arch: str, expected: bool
) -> None:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(tiny_model_dirs[arch])
    batch = random_probes(AutoConfig.for_model("bert", vocab_size=100))
    got = model_inputs(model, batch)
    assert ("token_type_ids" in got) is expected, sorted(got)
    assert {"input_ids", "attention_mask"} <= set(got)


def test_the_mask_comes_from_the_tokenizer_not_from_the_pad_id(minilm_path: Path) -> None:
    """A tokenizer whose unknown-token id is also its pad id: real tokens that are unknown keep
    mask 1 (a mask rebuilt as ``input_ids != pad_token_id`` would drop them, and a row of
    unknown words would become all padding)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    tokenizer.pad_token = tokenizer.unk_token
    batch = tokenize_probes(tokenizer)
    ids, mask = batch.inputs["input_ids"], batch.attention_mask
    pad = tokenizer.pad_token_id
    unknown_real = int(((ids == pad) & (mask == 1)).sum())
    print(f"pad id {pad}: {unknown_real} real tokens share it, all kept in the mask")
    assert unknown_real > 0
    lengths = [len(tokenizer(t)["input_ids"]) for t in batch.texts or ()]
    assert mask.sum(dim=1).tolist() == lengths
