"""The heads hfadapt builds compute what sentence-transformers computes: on the CPU in fp32, a
tiny Dense model (Pooling, Dense tanh, Dense, Normalize) against
``SentenceTransformer.encode`` and a tiny SPLADE model (MLM head, SpladePooling) against
``SparseEncoder.encode``, on the same texts, so the head code cannot drift from what users
run."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from support.pipeline_models import dense_head_folder, splade_folder

from hfadapt.judge.pipeline_judging import heads_for, with_heads
from hfadapt.loading.load import load

TEXTS = [
    "a short one",
    "Spyre runs the whole pipeline, heads included, in one graph.",
    "x",
    "Sparse vectors keep the heaviest terms of the vocabulary.",
]


def _hfadapt_outputs(folder: Path) -> Any:
    loaded = load(folder)
    built = heads_for(loaded)
    assert built.heads is not None and not built.left_out, built.left_out
    model = with_heads(loaded.model, built).eval()
    batch = loaded.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.inference_mode():
        return model(**batch)


def _compare(ours: torch.Tensor, theirs: torch.Tensor) -> tuple[float, float]:
    """(max |diff|, max |diff| / max |value|) in float64."""
    diff = float((ours.double() - theirs.double()).abs().max())
    return diff, diff / float(theirs.double().abs().max())


def test_dense_heads_agree_with_sentence_transformer_encode(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    folder = dense_head_folder(tmp_path / "dense")
    ours = _hfadapt_outputs(folder).sentence_embedding
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = SentenceTransformer(str(folder), device="cpu")
        theirs = st.encode(TEXTS, convert_to_tensor=True, batch_size=len(TEXTS))
    diff, rel = _compare(ours, theirs)
    print(f"dense: {tuple(ours.shape)} vs {tuple(theirs.shape)}, max |diff| {diff:.3e} ({rel:.3e})")
    assert ours.shape == theirs.shape == (len(TEXTS), 64), (ours.shape, theirs.shape)
    assert rel < 1e-5, f"hfadapt's Dense heads differ from SentenceTransformer.encode: {rel:.3e}"


def test_splade_heads_agree_with_sparse_encoder_encode(tmp_path: Path) -> None:
    from sentence_transformers import SparseEncoder

    folder = splade_folder(tmp_path / "splade")
    ours = _hfadapt_outputs(folder).sparse_embedding
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = SparseEncoder(str(folder), device="cpu")
        theirs = st.encode(TEXTS, convert_to_tensor=True, batch_size=len(TEXTS)).to_dense()
    diff, rel = _compare(ours, theirs)
    support = (ours > 0).ne(theirs > 0).sum()
    print(
        f"splade: {tuple(ours.shape)}, {int((theirs > 0).sum())} non-zero weights, "
        f"{int(support)} differ in support, max |diff| {diff:.3e} ({rel:.3e})"
    )
    assert ours.shape == theirs.shape == (len(TEXTS), 256), (ours.shape, theirs.shape)
    assert int((theirs > 0).sum()) > 0, "the reference must have non-zero weights to compare"
    assert int(support) == 0, f"{int(support)} terms are non-zero in one output only"
    assert rel < 1e-5, f"hfadapt's SPLADE heads differ from SparseEncoder.encode: {rel:.3e}"
