"""The module list after a transformer, read and built: BGE-M3's heads from their files (or its
repository id in a structural run), and the files a Hub load fetches for the heads."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from support.pipeline_models import HIDDEN, dense_head_folder

from hfadapt.loading.heads import build_heads
from hfadapt.loading.load import load
from hfadapt.loading.pipeline import head_files, read_pipeline


def test_bge_m3_heads_come_from_their_files_with_their_shapes(tmp_path: Path) -> None:
    folder = dense_head_folder(tmp_path / "m3")
    torch.save(
        {"weight": torch.randn(1, HIDDEN), "bias": torch.zeros(1)}, folder / "sparse_linear.pt"
    )
    torch.save(
        {"weight": torch.randn(HIDDEN, HIDDEN), "bias": torch.zeros(HIDDEN)},
        folder / "colbert_linear.pt",
    )
    pipeline = read_pipeline(folder)
    built = build_heads(load(folder), pipeline)
    print(pipeline.source, built.built, built.outputs())
    assert pipeline.source == "modules.json + FlagEmbedding M3"
    assert [b.split(":")[0] for b in built.built[-2:]] == ["sparse_linear", "colbert_linear"], (
        built.built
    )
    assert built.outputs() == ["sentence_embedding", "token_weights", "token_vectors"]
    assert built.heads is not None
    hidden, mask = torch.randn(2, 8, HIDDEN), torch.ones(2, 8, dtype=torch.long)
    out = built.heads(hidden, mask)
    shapes = {k: tuple(v.shape) for k, v in out.items()}
    assert shapes == {
        "sentence_embedding": (2, HIDDEN),
        "token_weights": (2, 8),
        "token_vectors": (2, 7, HIDDEN),
    }, shapes
    assert float(out["token_weights"].min()) >= 0.0  # relu


def test_a_structural_bge_m3_gets_stand_in_heads_by_its_repository(tmp_path: Path) -> None:
    assert [m.kind for m in read_pipeline(None, "BAAI/bge-m3").modules] == [
        "transformer",
        "m3_sparse",
        "m3_colbert",
    ]
    assert read_pipeline(None, "someone/else").modules == ()


def test_a_hub_load_fetches_each_module_s_config_and_weights(tmp_path: Path) -> None:
    folder = dense_head_folder(tmp_path / "dense")
    files = head_files(folder)
    print(files)
    assert "2_Dense/model.safetensors" in files and "3_Dense/config.json" in files
    assert "sparse_linear.pt" in files and not any(f.startswith("/") for f in files)
    (folder / "modules.json").write_text(json.dumps({"not": "a list"}))
    assert head_files(folder) == ["sparse_linear.pt", "colbert_linear.pt"]
