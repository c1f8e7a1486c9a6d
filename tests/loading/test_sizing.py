"""Structural stand-ins sized to a memory budget before any weight exists: a type-default
config is shaped like the family's small members; a wide one is narrowed (head_dim, the stick
residues, grouped-query groups, norms and activations kept: the lowering class is unchanged),
then made shallower; one that fits nowhere is ``skipped`` with the memory it needs; a sweep
worker sizes stand-ins from its per-worker limit."""

from __future__ import annotations

from typing import Any

import pytest

from hfadapt import verdicts
from hfadapt.loading import sizing
from hfadapt.loading.signature import ALIGNMENT, lowering_signature
from hfadapt.loading.structural import (
    _instantiate,
    config_from_dict,
    shrink_config,
    truncate_layers,
)

QWEN3_8B_SHAPE = {  # the shape of Qwen3-8B's config.json (36 layers, 4096 wide, GQA 32/8)
    "model_type": "qwen3",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "vocab_size": 151936,
}


def _meta(config: Any) -> Any:
    return _instantiate(config, "t", 0, False, True)


def _stand_in(raw: dict[str, Any]) -> Any:
    config = config_from_dict(raw)
    shrink_config(config)
    return config


def test_the_estimate_counts_the_parameters_exactly() -> None:
    config = _stand_in(QWEN3_8B_SHAPE)
    est = sizing.estimate(config, _meta)
    # 2 layers: q,o 4096x4096; k,v 4096x1024; MLP 3 x 4096x12288; norms; vocab 4096 x 4096
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288 + 2 * 4096 + 2 * 128
    expected = 2 * layer + 4096 * 4096 + 4096
    assert est.parameters == expected, (est.parameters, expected)
    assert est.judge_mb > sizing.DEFAULT_BUDGET_MB, est.describe()


def test_a_type_default_config_is_shaped_like_the_small_members() -> None:
    config = _stand_in({"model_type": "qwen3"})  # transformers' default: 4096 wide, 22016
    before = lowering_signature(config)
    notes = sizing.fit(config, _meta, truncate_layers, small_member=True, budget_mb=4096)
    print(f"\n{notes}")
    got = (
        config.hidden_size,
        config.num_attention_heads,
        config.head_dim,
        config.intermediate_size,
    )
    assert got == (1024, 8, 128, 5504), got  # 22016/4096 = 5504/1024, residue 0 kept
    assert lowering_signature(config) == before
    assert "small members" in notes[0] and "within the 4,096 MB budget" in notes[-1], notes


@pytest.mark.parametrize("budget_mb", [2500, 900])
def test_a_wide_config_is_narrowed_to_the_widest_instance_that_fits(budget_mb: int) -> None:
    config = _stand_in(QWEN3_8B_SHAPE)
    before = lowering_signature(config)
    notes = sizing.fit(config, _meta, truncate_layers, budget_mb=budget_mb)
    est = sizing.estimate(config, _meta)
    got = (config.hidden_size, config.num_attention_heads, config.num_key_value_heads)
    print(f"\n{budget_mb} MB: {got}, {est.describe()}\n{notes}")
    assert est.judge_mb <= budget_mb, (est.describe(), budget_mb)
    assert config.head_dim == 128 and config.num_attention_heads % config.num_key_value_heads == 0
    assert config.num_attention_heads // config.num_key_value_heads == 4, got  # GQA group kept
    assert config.hidden_size % ALIGNMENT == 0 and config.intermediate_size % ALIGNMENT == 0, got
    assert lowering_signature(config) == before
    assert config.num_hidden_layers == 2, notes  # width first: depth kept while it can be
    wider = dict(QWEN3_8B_SHAPE, num_attention_heads=got[1] + 4, num_key_value_heads=got[2] + 1)
    wider_config = _stand_in(wider)
    wider_config.hidden_size = (got[1] + 4) * 128
    assert sizing.estimate(wider_config, _meta).judge_mb > budget_mb  # the widest that fits


def test_depth_goes_when_the_narrowest_width_does_not_fit() -> None:
    raw = {"model_type": "bert", "hidden_size": 1024, "num_attention_heads": 16,
           "intermediate_size": 4096, "num_hidden_layers": 24, "vocab_size": 30522}  # fmt: skip
    narrowest = _stand_in(dict(raw, hidden_size=128, num_attention_heads=2, intermediate_size=512))
    two = sizing.estimate(narrowest, _meta).judge_mb
    truncate_layers(narrowest, 1)
    one = sizing.estimate(narrowest, _meta).judge_mb
    budget = int((one + two) / 2)
    config = _stand_in(raw)
    notes = sizing.fit(config, _meta, truncate_layers, budget_mb=budget)
    print(f"\n1 layer {one:.0f} MB, 2 layers {two:.0f} MB, budget {budget}: {notes}")
    assert config.num_hidden_layers == 1 and sizing.estimate(config, _meta).judge_mb <= budget
    assert any("layers truncated 2 -> 1" in n for n in notes), notes


def test_a_config_too_large_even_so_is_skipped_with_its_reason() -> None:
    from hfadapt.judge.diagnose import diagnose

    with sizing.budget(20):
        diag = diagnose("org/huge", mode="structural", config=QWEN3_8B_SHAPE, record=False,
                        reuse_reference=False)  # fmt: skip
    print(f"\n{diag.verdict}: {diag.reason}")
    assert diag.verdict == verdicts.SKIPPED, diag.reason
    assert "over the 20 MB budget" in diag.reason and "--memory-limit" in diag.reason, diag.reason


def test_the_budget_follows_the_worker_limit() -> None:
    base = sizing.PROCESS_BASE_MB
    assert sizing.budget_for_limit(None) == sizing.DEFAULT_BUDGET_MB
    assert sizing.budget_for_limit(base + 700) == 700
    assert sizing.budget_for_limit(10_000) == sizing.DEFAULT_BUDGET_MB
    assert sizing.budget_for_limit(base - 1) == 0
    with sizing.budget(123):
        assert sizing.current_budget_mb() == 123
