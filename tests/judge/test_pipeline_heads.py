"""A verdict judges what users get: the sentence-transformers module list runs on the device
after the transformer (Dense, SPLADE's MLM head and pooling, a ColBERT projection), each output
judged in its own metric, and the evidence says which modules ran and which metric decided."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.cli_runner import run_cli
from support.pipeline_models import colbert_folder, dense_head_folder, splade_folder

from hfadapt import verdicts
from hfadapt.judge.diagnose import diagnose


def _output(diag: Any, name: str) -> dict[str, Any]:
    found = [o for o in diag.metrics.to_dict()["outputs"] if o["output"] == name]
    assert len(found) == 1, diag.metrics.to_dict()["outputs"]
    return found[0]


def _check(output: dict[str, Any], name: str) -> float:
    return float(next(c["value"] for c in output["checks"] if c["name"] == name))


def test_a_dense_head_is_run_and_judged_and_a_defect_only_in_it_flips_the_verdict(
    tmp_path: Path, cpu_runner: Any, fault_runner: Callable[..., Any], one_thread: None
) -> None:
    folder = dense_head_folder(tmp_path / "dense")
    good = diagnose(folder, runner=cpu_runner, record=False)
    pipe = good.evidence["pipeline"]
    sentence = _output(good, "sentence_embedding")
    print(good.reason, pipe)
    assert good.verdict == verdicts.PASS, good.reason
    assert pipe["whole"] is True and pipe["left_out"] == [], pipe
    assert pipe["on_device"] == [
        "Transformer",
        "1_Pooling:Pooling",
        "2_Dense:Dense",
        "3_Dense:Dense",
        "4_Normalize:Normalize",
    ]
    assert pipe["decided_by"]["sentence_embedding"] == "dense cosine", pipe
    assert _check(sentence, "min sentence cosine") > 0.9999, sentence

    # half the first Dense's channels zeroed on the device, nothing else: the token states
    # still pass, the sentence embedding users get does not
    bad = diagnose(folder, runner=fault_runner("sentence_heads.built.2_Dense"), record=False)
    broken = _output(bad, "sentence_embedding")
    print(bad.reason)
    assert bad.verdict == verdicts.VERIFICATION_FAILED, bad.reason
    assert bad.metrics.min_token_cosine > 0.9999, bad.metrics.summary()
    assert _check(broken, "min sentence cosine") < 0.95, broken
    assert "sentence_embedding (dense cosine): min sentence cosine" in bad.reason
    assert bad.divergence is not None and bad.divergence.module.startswith(
        "sentence_heads.built.2_Dense"
    )


def test_a_splade_model_is_judged_on_its_top_k_terms(
    tmp_path: Path, cpu_runner: Any, fault_runner: Callable[..., Any], one_thread: None
) -> None:
    folder = splade_folder(tmp_path / "splade")
    good = diagnose(folder, runner=cpu_runner, record=False)
    sparse = _output(good, "sparse_embedding")
    print(good.reason)
    assert good.verdict == verdicts.PASS, good.reason
    assert sparse["metric"] == "sparse top-k" and _check(sparse, "min overlap@32") >= 0.9, sparse
    assert _check(sparse, "max top-k weight error") < 0.015, sparse
    assert good.evidence["pipeline"]["on_device"] == [
        "MLMTransformer",
        "1_SpladePooling:SpladePooling",
    ]

    bad = diagnose(
        folder, runner=fault_runner("sentence_heads.built.mlm_head", "zero_half"), record=False
    )
    broken = _output(bad, "sparse_embedding")
    print(bad.reason)
    assert bad.verdict == verdicts.VERIFICATION_FAILED and not broken["passed"], broken
    assert (
        _check(broken, "min overlap@32") < 0.9 or _check(broken, "max top-k weight error") > 0.015
    ), broken


@pytest.mark.slow  # ~45 s: the compiled audit of a 256-word vocabulary head, twice
def test_the_device_sees_the_splade_head_and_refuses_its_log1p(
    tmp_path: Path, one_thread: None
) -> None:
    diag = diagnose(
        splade_folder(tmp_path / "splade"), record=False, execution="compile",
        without_adapters=["splade-log1p-by-log"], localize_failures=False,
    )  # fmt: skip
    print("without splade-log1p-by-log:", diag.reason)
    assert diag.verdict == verdicts.LOWERING_FAILED, diag.reason
    assert "aten::log1p" in diag.reason and "splade_pooling.py" in diag.reason, diag.reason

    # with it, and post-ln-handoff-clone cloning the token states handed into the MLM head's
    # graph, the whole SparseEncoder passes compiled
    diag = diagnose(
        splade_folder(tmp_path / "splade"), record=False, execution="compile",
        localize_failures=False,
    )  # fmt: skip
    sparse = _output(diag, "sparse_embedding")
    print("with it:", diag.reason)
    assert diag.verdict == verdicts.PASS, diag.reason
    assert "defects" not in diag.evidence, diag.evidence["defects"]
    assert _check(sparse, "min overlap@32") >= 0.9, sparse
    assert _check(sparse, "max top-k weight error") < 0.015, sparse


@pytest.mark.slow  # ~45 s: two compiled runs
def test_a_colbert_projection_reads_the_handoff_clone_compiled(
    tmp_path: Path, one_thread: None
) -> None:
    # the transformer's frame breaks (host masks), so the projection's matmul is the first op
    # of the heads' graph, reading the encoder's last LayerNorm output (defect.post_ln_handoff)
    folder = colbert_folder(tmp_path / "colbert")
    bad = diagnose(
        folder, record=False, execution="compile", without_adapters=["post-ln-handoff-clone"],
        localize_failures=False,
    )  # fmt: skip
    fired = [
        f["module"]
        for d in bad.evidence.get("defects", [])
        if d["defect_id"] == "defect.post_ln_handoff"
        for f in d["firings"]
    ]
    print("without post-ln-handoff-clone:", bad.verdict, bad.reason, fired)
    assert bad.verdict == verdicts.VERIFICATION_FAILED, bad.reason
    assert "sentence_heads.built.1_Dense.linear" in fired, fired

    good = diagnose(folder, record=False, execution="compile", localize_failures=False)
    vectors = _output(good, "token_vectors")
    print("with it:", good.reason)
    assert good.verdict == verdicts.PASS and "post-ln-handoff-clone" in good.adapters, good.reason
    assert "defects" not in good.evidence, good.evidence["defects"]
    assert _check(vectors, "max max-sim error") < 0.01, vectors


def test_a_colbert_model_is_judged_on_max_sim(
    tmp_path: Path, cpu_runner: Any, fault_runner: Callable[..., Any], one_thread: None
) -> None:
    folder = colbert_folder(tmp_path / "colbert")
    good = diagnose(folder, runner=cpu_runner, record=False)
    vectors = _output(good, "token_vectors")
    print(good.reason, vectors["info"])
    assert good.verdict == verdicts.PASS and vectors["metric"] == "max-sim", good.reason
    assert _check(vectors, "max max-sim error") < 0.01, vectors
    assert vectors["info"]["pairs"] == 144, vectors["info"]  # 12 probes, each against each
    assert good.evidence["pipeline"]["on_device"] == ["Transformer", "1_Dense:Dense"]

    bad = diagnose(folder, runner=fault_runner("sentence_heads.built.1_Dense"), record=False)
    broken = _output(bad, "token_vectors")
    print(bad.reason)
    assert bad.verdict == verdicts.VERIFICATION_FAILED, bad.reason
    assert _check(broken, "max max-sim error") > 0.01, broken


def test_an_unknown_module_is_named_and_the_pipeline_is_not_whole(
    tmp_path: Path, cpu_runner: Any, one_thread: None
) -> None:
    folder = dense_head_folder(tmp_path / "dense")
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(
        3,
        {
            "idx": 9,
            "name": "9",
            "path": "9_LayerNorm",
            "type": "sentence_transformers.models.LayerNorm",
        },
    )
    (folder / "modules.json").write_text(json.dumps(modules))
    diag = diagnose(folder, runner=cpu_runner, record=False)
    pipe = diag.evidence["pipeline"]
    print(pipe)
    assert pipe["whole"] is False, pipe
    named = {e["module"]: e["why"] for e in pipe["left_out"]}
    assert "not one hfadapt builds" in named["9_LayerNorm:LayerNorm"], named
    assert "follows 9_LayerNorm:LayerNorm" in named["3_Dense:Dense"], named
    assert pipe["on_device"] == ["Transformer", "1_Pooling:Pooling", "2_Dense:Dense"], pipe


def test_structural_runs_build_stand_in_heads_of_the_declared_shapes(
    tmp_path: Path, cpu_runner: Any, one_thread: None
) -> None:
    diag = diagnose(
        dense_head_folder(tmp_path / "dense"), mode="structural", runner=cpu_runner, record=False
    )
    pipe = diag.evidence["pipeline"]
    print(diag.reason, pipe)
    assert diag.verdict == verdicts.PASS, diag.reason
    assert pipe["weights"] == "stand-in (seed 0)" and pipe["whole"] is True, pipe
    assert "2_Dense:Dense" in pipe["on_device"] and "sentence_embedding" in pipe["decided_by"]


def test_hfadapt_diagnose_runs_the_dense_head_on_the_simulated_device(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    one_thread: None,
) -> None:
    folder = dense_head_folder(tmp_path / "dense")
    args = ["diagnose", str(folder), "--json", "--db", str(tmp_path / "runs.db")]
    code, out, err = run_cli(args, monkeypatch, capsys)
    data = json.loads(out)
    pipe = data["evidence"]["pipeline"]
    print(data["verdict"], data["reason"], pipe)
    assert code == 0 and data["verdict"] == "pass", (data["reason"], err)
    assert pipe["whole"] is True and "3_Dense:Dense" in pipe["on_device"], pipe
    sentence = next(o for o in data["metrics"]["outputs"] if o["output"] == "sentence_embedding")
    assert sentence["passed"] and sentence["metric"] == "dense cosine", sentence
