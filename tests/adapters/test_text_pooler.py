"""The end-of-sequence pooler of CLIP-type text towers on the host (adapters/text_pooler.py):
exact in float64 against the stock forward (both EOS rules of CLIP), and the text towers of
tiny MetaCLIP 2 and CLIP embedders, built locally, fail lowering at the pooler without the
adapters and pass with them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from hfadapt.adapters.proofs import prove_float64
from hfadapt.adapters.registry import discover

REGISTRY = discover(paths=[], entry_points=False)

TEXT = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 2, "vocab_size": 1000, "eos_token_id": 2,
}  # fmt: skip
VISION = {"hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
          "num_attention_heads": 1}  # fmt: skip
COMPOSITES = {
    "metaclip_2": {"model_type": "metaclip_2", "text_config": TEXT, "vision_config": VISION},
    # eos 407: CLIP's post-#24773 rule (first EOS), the other branch of its pooler
    "clip": {"model_type": "clip", "text_config": {**TEXT, "eos_token_id": 407},
             "vision_config": VISION},
}  # fmt: skip
ADAPTER = {"metaclip_2": "text-eos-pool-host-metaclip-2", "clip": "text-eos-pool-host-clip"}


@pytest.mark.parametrize("name", sorted(ADAPTER.values()))
def test_eos_pooler_on_the_host_is_the_stock_forward_exactly(name: str) -> None:
    a = REGISTRY.get(name)
    eq = prove_float64(a, seeds=(0, 1), registry=REGISTRY)
    assert eq.equivalent and eq.controls_rejected, f"{name}: {eq.summary()}"
    # a gather and the same ops in the same order: not one rounding apart
    assert eq.max_rel_err == 0.0, f"{name}: max rel err {eq.max_rel_err:.3g} (expected 0)"


def test_clip_examples_cover_both_eos_rules_and_pool_at_the_first_eos() -> None:
    a = REGISTRY.get("text-eos-pool-host-clip")
    assert a.example is not None
    seen = set()
    for seed in (0, 1):
        model, _, kwargs = a.example(seed)
        ids = kwargs["input_ids"]
        eos = model.config.eos_token_id
        seen.add(eos == 2)
        with torch.no_grad():
            pooled = model(**kwargs).pooler_output
            last = model(**kwargs).last_hidden_state
        if eos != 2:  # row 1 holds EOS at 17 and 39: the first one is pooled
            assert (ids[1] == eos).nonzero().flatten().tolist() == [17, 39]
            diff = (pooled[1] - last[1, 17]).abs().max().item()
            assert diff == 0.0, f"row 1 is not pooled at its first EOS (|diff| {diff})"
    assert seen == {True, False}, f"examples use only eos==2 is {seen}: one CLIP rule unproven"


def _diagnose(name: str, execution: str, **options: Any) -> Any:
    from hfadapt.judge.diagnose import diagnose

    return diagnose(
        f"tiny/{name}",
        config=copy.deepcopy(COMPOSITES[name]),
        mode="structural",
        record=False,
        localize_failures=False,
        execution=execution,
        **options,
    )


@pytest.mark.parametrize(
    ("name", "execution"),
    [("metaclip_2", "eager"), ("clip", "eager"), ("metaclip_2", "compile")],
)
def test_text_tower_fails_at_the_pooler_without_and_passes_with_the_adapter(
    name: str, execution: str
) -> None:
    bare = _diagnose(name, execution="eager", adapters=False)
    assert bare.verdict == "lowering_failed", (bare.verdict, bare.reason)
    # every other adapter applied: what is left is the pooler (its casts and aten::index)
    without = _diagnose(name, execution=execution, without_adapters=(ADAPTER[name],))
    with_ = _diagnose(name, execution=execution)
    print(f"{name} {execution}: no adapters: {bare.reason}\n without the pooler's: "
          f"{without.reason}\n with it: {with_.reason}")  # fmt: skip
    assert without.verdict == "lowering_failed", (without.verdict, without.reason)
    assert "op.unsupported" in without.reason and "dtype.cast" in without.reason, without.reason
    if execution == "compile":  # the compiled report names the pooler's lines
        module = f"modeling_{name}.py"
        assert module in without.reason and "aten::index" in without.reason, without.reason
    assert ADAPTER[name] not in (without.adapters or []), without.adapters
    assert with_.verdict == "pass", (with_.verdict, with_.reason, with_.adapters)
    assert ADAPTER[name] in (with_.adapters or []), with_.adapters
