"""hfadapt.sweep.narrow: the cheapest config with the same structural signature (what a structural
sweep judges a 4096-wide default config on), and the sweep plan that uses it."""

from __future__ import annotations

from typing import Any

import pytest

from hfadapt.loading.signature import SHAPE_FIELDS
from hfadapt.loading.structural import (
    config_from_dict,
    lowering_signature,
    signature_fields,
    structural_signature,
)
from hfadapt.sweep.narrow import NARROW_ABOVE, narrowed
from hfadapt.sweep.plan import _cost


def _width(raw: dict[str, Any]) -> tuple[int, int, int | None]:
    config = config_from_dict(raw)
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    inter = getattr(config, "intermediate_size", None)
    return hidden, getattr(config, "num_attention_heads", None) or config.n_head, inter


@pytest.mark.parametrize(
    ("raw", "hidden", "heads", "kv"),
    [
        ({"model_type": "qwen3"}, 256, 2, 2),  # head_dim 128 kept, MHA kept
        ({"model_type": "mistral"}, 512, 4, 1),  # GQA 32:8 -> 4:1
        ({"model_type": "gemma3_text"}, 512, 2, 1),  # head_dim 256, GQA 8:4 -> 2:1
        ({"model_type": "llama"}, 256, 2, 2),
        ({"model_type": "gpt_neox"}, 192, 2, None),  # head_dim 96 (off the stick) kept
        ({"model_type": "albert"}, 128, 2, None),
    ],
)
def test_wide_defaults_narrow_to_the_same_signature(
    raw: dict[str, Any], hidden: int, heads: int, kv: int | None
) -> None:
    small = narrowed(raw)
    assert small is not None, raw
    before, after = _cost(raw, 2), _cost(small.config, 2)
    print(
        f"\n{raw['model_type']}: {small.describe()}; cost {before:.3g} -> {after:.3g} ({before / after:.0f}x)"
    )
    # same lowering class (every field but the sizes), never the same full signature
    assert lowering_signature(small.config) == lowering_signature(raw) == small.signature
    kept = {k: v for k, v in signature_fields(raw).items() if k not in SHAPE_FIELDS}
    got = {k: v for k, v in signature_fields(small.config).items() if k not in SHAPE_FIELDS}
    assert got == kept, {k: (kept.get(k), got.get(k)) for k in kept if kept.get(k) != got.get(k)}
    assert structural_signature(small.config) != structural_signature(raw)
    config = config_from_dict(small.config)
    got_hidden = getattr(config, "hidden_size", None)
    assert got_hidden == hidden and config.num_attention_heads == heads, (
        got_hidden,
        config.num_attention_heads,
    )
    assert getattr(config, "num_key_value_heads", None) == kv
    assert before / after >= 10, f"only {before / after:.1f}x cheaper"


def test_gptj_narrows_through_its_own_field_names() -> None:
    small = narrowed({"model_type": "gptj"})
    assert small is not None and small.changes == {"n_embd": (4096, 512), "n_head": (16, 2)}, small


@pytest.mark.parametrize(
    "raw",
    [
        {"model_type": "bert"},  # BERT-base: cheap enough as it is
        {
            "model_type": "bert",
            "hidden_size": 384,
            "num_attention_heads": 12,
            "intermediate_size": 1536,
        },
        {"model_type": "qwen3_vl"},  # composite (text_config): the signature does not look inside
        {"model_type": "not-a-transformers-type", "hidden_size": 4096},
    ],
)
def test_cheap_composite_or_unknown_configs_are_left_alone(raw: dict[str, Any]) -> None:
    assert narrowed(raw) is None


def test_narrow_threshold_is_four_bert_base_layers() -> None:
    assert NARROW_ABOVE == 4 * 768 * (4 * 768 + 3 * 3072)
    # 2 layers of xlm-roberta-large (1024 x 4096) stay under it: judged at their real width.
    assert (
        narrowed(
            {
                "model_type": "xlm-roberta",
                "hidden_size": 1024,
                "num_attention_heads": 16,
                "intermediate_size": 4096,
            }
        )
        is None
    )


def test_plan_orders_units_longest_first_and_narrows_only_when_asked() -> None:
    from hfadapt.db.tables import HubModel
    from hfadapt.sweep.plan import plan_sweep

    models = [
        HubModel(
            id="a/bert",
            rank=1,
            model_type="bert",
            config_json={
                "model_type": "bert",
                "hidden_size": 256,
                "num_attention_heads": 4,
                "intermediate_size": 512,
            },
        ),
        # a crawled config counts only with its shapes (the listing's summary has none)
        HubModel(
            id="a/qwen3",
            rank=2,
            model_type="qwen3",
            config_json={"model_type": "qwen3", "hidden_size": 4096},
        ),
        HubModel(
            id="a/xlmr",
            rank=3,
            model_type="xlm-roberta",
            config_json={"model_type": "xlm-roberta", "hidden_size": 768},
        ),
    ]
    plan = plan_sweep(models)
    # xlm-roberta defaults (768 wide) cost most; narrowed Qwen3 ties with the 256-wide BERT,
    # and ties keep rank order.
    assert [u.representative for u in plan.units] == ["a/xlmr", "a/bert", "a/qwen3"], plan.units
    qwen = next(u for u in plan.units if u.representative == "a/qwen3")
    assert qwen.narrow is not None and qwen.narrow.changes["hidden_size"] == (4096, 256)
    wide = plan_sweep(models, narrow=False)
    assert wide.units[0].representative == "a/qwen3" and wide.units[0].narrow is None
    assert wide.units[0].cost > 20 * qwen.cost, (wide.units[0].cost, qwen.cost)


def test_planning_records_ids_stored_before_crawls_checked_them() -> None:
    """A runs.db crawled before ids were validated may hold anything: the plan records such a
    model as load_failed, never looks it up (the HF cache, the Hub) and never crashes."""
    from hfadapt import verdicts
    from hfadapt.db.tables import HubModel
    from hfadapt.sweep.plan import plan_sweep

    bad = ["../../etc/passwd", "org/x' onmouseover='y", "org/\x1b[2Jname", "org--a/b"]
    models = [HubModel(id=m, rank=i + 1, model_type="bert") for i, m in enumerate(bad)]
    plan = plan_sweep(models, mode="structural")
    assert plan.units == [] and [r["model_id"] for r in plan.direct] == bad, plan.direct
    assert {r["verdict"] for r in plan.direct} == {verdicts.LOAD_FAILED}
    assert all(r["reason"].startswith("not a Hub model id: ") for r in plan.direct), plan.direct
