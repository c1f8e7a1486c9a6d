"""The heads attached to a transformer whose forward builds its masks itself (DistilBERT, as
distiluse-base-multilingual-cased-v1): the default adapters still apply to it, so the whole
pipeline lowers and passes compiled; and the max-sim of multi-vector heads judges real tokens
only (BGE-M3's ColBERT head left 0/0 = NaN at fp16 padded positions, which users'
hosts drop)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from hfadapt import verdicts
from hfadapt.judge.diagnose import diagnose
from hfadapt.judge.output_metrics import multi_vector_metrics

_ST = "sentence_transformers.models."


def _distiluse_like(tiny: Path, folder: Path) -> Path:
    """The tiny DistilBERT with distiluse's module list: mean Pooling, then a tanh Dense."""
    shutil.copytree(tiny, folder)
    hidden, out = 64, 128
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": f"{_ST}Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": f"{_ST}Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": f"{_ST}Dense"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling/config.json").write_text(
        json.dumps({"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": True})
    )
    (folder / "2_Dense").mkdir()
    dense = {"in_features": hidden, "out_features": out, "bias": True,
             "activation_function": "torch.nn.modules.activation.Tanh"}  # fmt: skip
    (folder / "2_Dense/config.json").write_text(json.dumps(dense))
    gen = torch.Generator().manual_seed(1)
    state = {
        "linear.weight": torch.randn(out, hidden, generator=gen) / hidden**0.5,
        "linear.bias": torch.randn(out, generator=gen) * 0.05,
    }
    save_file(state, str(folder / "2_Dense/model.safetensors"))
    return folder


def test_a_distilbert_with_a_dense_head_lowers_and_passes_compiled(
    tiny_model_dirs: dict[str, Path], tmp_path: Path, one_thread: None
) -> None:
    folder = _distiluse_like(tiny_model_dirs["distilbert"], tmp_path / "distiluse-like")
    diag = diagnose(
        folder, mode="structural", execution="compile", record=False, localize_failures=False
    )
    pipe = diag.evidence.get("pipeline", {})
    outputs = diag.metrics.to_dict()["outputs"] if diag.metrics is not None else []
    print(diag.verdict, diag.reason, diag.adapters, pipe, sep="\n")
    assert diag.verdict == verdicts.PASS, diag.reason
    assert "attention-mask-host" in diag.adapters, diag.adapters
    assert pipe["whole"] is True, pipe
    assert pipe["on_device"] == ["Transformer", "1_Pooling:Pooling", "2_Dense:Dense"], pipe
    sentence = next(o for o in outputs if o["output"] == "sentence_embedding")
    cosine = next(c["value"] for c in sentence["checks"] if c["name"] == "min sentence cosine")
    assert sentence["passed"] and cosine > 0.999, sentence


def test_max_sim_judges_real_tokens_whatever_the_device_left_in_padded_ones() -> None:
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[0, 5:] = 0  # the first probe padded: a NaN there once made the whole check NaN
    mask[2, 3:] = 0
    ref = torch.nn.functional.normalize(torch.randn(3, 8, 16, generator=gen), dim=-1)
    ref = ref * mask.unsqueeze(-1)
    noise = 1e-4 * torch.randn(3, 8, 16, generator=gen)
    close = ref + noise
    nan_padded = close.masked_fill(~mask.bool().unsqueeze(-1), float("nan"))
    clean = multi_vector_metrics(ref, close, mask).to_dict()
    padded = multi_vector_metrics(ref, nan_padded, mask).to_dict()
    print("zeros in padded positions:", clean["checks"])
    print("NaN in padded positions:  ", padded["checks"])
    assert padded["checks"] == clean["checks"], (clean["checks"], padded["checks"])
    assert padded["passed"] and padded["nonfinite"] == 0, padded

    # a NaN on a real token of a later probe still fails, whatever its position in the batch
    broken = close.clone()
    broken[2, 1, 0] = float("nan")
    bad = multi_vector_metrics(ref, broken, mask).to_dict()
    print("NaN on a real token:", bad["nonfinite"], bad["checks"])
    assert not bad["passed"] and bad["nonfinite"] == 1, bad
