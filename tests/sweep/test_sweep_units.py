"""A sweep judges each unit once, on its best-ranked model, and gives that verdict to every
member: so models share a unit only when what is judged is the same, the config and the heads
users run after the transformer (BGE-M3's sparse and ColBERT heads, a Dense of its own)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hfadapt.db.tables import HubModel
from hfadapt.sweep.plan import plan_sweep

XLMR = {
    "model_type": "xlm-roberta",
    "architectures": ["XLMRobertaModel"],
    "hidden_size": 1024,
    "num_attention_heads": 16,
    "num_hidden_layers": 24,
    "intermediate_size": 4096,
    "vocab_size": 250002,
    "max_position_embeddings": 8194,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-05,
    "hidden_act": "gelu",
    "position_embedding_type": "absolute",
}


def _model(model_id: str, rank: int, config: dict[str, Any]) -> HubModel:
    return HubModel(
        id=model_id,
        rank=rank,
        downloads=1000 - rank,
        model_type=config["model_type"],
        config_json=copy.deepcopy(config),
    )


def _units(plan: Any) -> dict[str, list[str]]:
    return {u.key: sorted(u.members) for u in plan.units}


def test_bge_m3_with_its_heads_never_shares_a_plain_xlm_rs_unit() -> None:
    models = [
        _model("BAAI/bge-m3", 1, XLMR),
        _model("intfloat/multilingual-e5-large", 2, XLMR),
        _model("org/xlmr-twin", 3, XLMR),
    ]
    units = _units(plan_sweep(models))
    members = sorted(units.values())
    assert members == [["BAAI/bge-m3"], ["intfloat/multilingual-e5-large", "org/xlmr-twin"]], units


def test_a_dense_head_read_from_the_models_folder_splits_its_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four models in the HF cache, one config: the one whose modules.json declares no Dense is
    judged on its own, two with the same Dense share a unit, a Dense of another width does not."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def cached(name: str, dense: int | None) -> str:
        repo = tmp_path / "hub" / f"models--org--{name}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("0" * 40)
        root = repo / "snapshots" / ("0" * 40)
        root.mkdir(parents=True)
        (root / "config.json").write_text(json.dumps(XLMR))
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {
                "idx": 1,
                "name": "1",
                "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling",
            },
        ]
        if dense is not None:
            modules.append(
                {
                    "idx": 2,
                    "name": "2",
                    "path": "2_Dense",
                    "type": "sentence_transformers.models.Dense",
                }
            )
            (root / "2_Dense").mkdir()
            (root / "2_Dense" / "config.json").write_text(
                json.dumps(
                    {
                        "in_features": 1024,
                        "out_features": dense,
                        "activation_function": "torch.nn.modules.activation.Tanh",
                    }
                )
            )
        (root / "modules.json").write_text(json.dumps(modules))
        return f"org/{name}"

    ids = [
        cached("plain", None),
        cached("dense-a", 768),
        cached("dense-b", 768),
        cached("dense-c", 512),
    ]
    models = [
        HubModel(id=m, rank=i, downloads=100 - i, model_type="xlm-roberta")
        for i, m in enumerate(ids)
    ]
    members = sorted(_units(plan_sweep(models)).values())
    assert members == [["org/dense-a", "org/dense-b"], ["org/dense-c"], ["org/plain"]], members
