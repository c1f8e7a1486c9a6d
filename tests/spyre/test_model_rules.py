"""Config-level rules across the families' field names: alignment and head_dim, on transformers
config objects and on plain config.json dicts."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from hfadapt.errors import SpyreUnsupportedModelError
from hfadapt.spyre import load_profile
from hfadapt.spyre.rules.layout_rules import check_model, ensure_supported, head_dim, uses_rope

# (model_type, fields of a popular checkpoint, expected head_dim, RoPE, expected messages)
CASES = [
    (
        "bert",
        {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
        64,
        False,
        [],
    ),
    (
        "bert",
        {"hidden_size": 384, "num_attention_heads": 12, "intermediate_size": 1536},
        32,
        False,
        ["head_dim=32 is not a multiple of 64: zero-pad Q, K and V to 64"],
    ),
    (
        "xlm-roberta",
        {"hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096},
        64,
        False,
        [],
    ),
    (
        "roberta",
        {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
        64,
        False,
        [],
    ),
    (
        "mpnet",
        {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072},
        64,
        False,
        [],
    ),
    ("distilbert", {"dim": 768, "n_heads": 12, "hidden_dim": 3072}, 64, False, []),
    (
        "modernbert",
        {"hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 1152},
        64,
        True,
        ["head_dim=64 is not a multiple of 128: zero-pad Q, K and V to 128 (RoPE)"],
    ),
    (
        "qwen3",
        {
            "hidden_size": 1024,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 3072,
        },
        128,
        True,
        [],
    ),
    (
        "gemma3_text",
        {
            "hidden_size": 768,
            "num_attention_heads": 3,
            "num_key_value_heads": 1,
            "head_dim": 256,
            "intermediate_size": 1152,
        },
        256,
        True,
        [],
    ),
    ("t5", {"d_model": 768, "d_ff": 3072, "d_kv": 64, "num_heads": 12}, 64, False, []),
    (
        "t5",
        {"d_model": 512, "d_ff": 1000, "d_kv": 32, "num_heads": 16},
        32,
        False,
        [
            "d_ff=1000 is not a multiple of 64; it cannot be padded without changing the arithmetic",
            "head_dim=32 is not a multiple of 64: zero-pad Q, K and V to 64",
        ],
    ),
]


@pytest.mark.parametrize(
    ("model_type", "fields", "size", "rope", "messages"),
    CASES,
    ids=[f"{c[0]}-{c[2]}" + ("-bad" if c[4] else "") for c in CASES],
)
def test_transformers_configs(
    model_type: str, fields: dict[str, int], size: int, rope: bool, messages: list[str]
) -> None:
    config = AutoConfig.for_model(model_type, **fields)
    assert (head_dim(config), uses_rope(config)) == (size, rope)
    found = check_model(config, load_profile())
    assert [v.message for v in found] == messages
    for v in found:  # the config class is the call site: one fingerprint per architecture
        assert v.location is not None and v.location.function == type(config).__name__, v


def test_distilbert_is_named_by_its_own_fields() -> None:
    config = AutoConfig.for_model("distilbert", dim=312, n_heads=12, hidden_dim=1200)
    with pytest.raises(SpyreUnsupportedModelError) as info:
        ensure_supported(config)
    text = str(info.value)
    assert "dim=312 is not a multiple of 64" in text and "hidden_dim=1200" in text, text


def test_nomic_bert_custom_code_config_dict() -> None:
    # nomic-ai/nomic-embed-text-v1.5's config.json (trust_remote_code fields)
    config = {
        "model_type": "nomic_bert",
        "n_embd": 768,
        "n_head": 12,
        "n_inner": 3072,
        "rotary_emb_fraction": 1.0,
    }
    assert (head_dim(config), uses_rope(config)) == (64, True)
    [v] = check_model(config)
    assert (v.rule_id, v.location) == ("layout.head_dim", None)
    assert v.message.endswith("zero-pad Q, K and V to 128 (RoPE)")
    ensure_supported(config)  # 768 and 3072 are aligned
    bad = dict(config, n_embd=800)
    with pytest.raises(SpyreUnsupportedModelError, match="n_embd=800"):
        ensure_supported(bad)


def test_transformers_native_nomic_bert_and_plain_dicts() -> None:
    native = AutoConfig.for_model("nomic_bert")
    assert (head_dim(native), uses_rope(native)) == (64, True)
    plain = {
        "model_type": "bert",
        "hidden_size": 384,
        "num_attention_heads": 12,
        "intermediate_size": 1536,
    }
    assert [v.rule_id for v in check_model(plain)] == ["layout.head_dim"]


def test_the_adapters_api_and_the_attention_measure_read_this_head_dim() -> None:
    """One definition: T5's d_kv (32 here, not d_model / heads = 64) and an explicit head_dim
    of 0 (taken as unset) read alike by the layout rules, the adapters' API and the stand-ins'
    attention measure."""
    from types import SimpleNamespace

    from transformers import T5Config

    from hfadapt.adapters import api
    from hfadapt.loading import attention_logits

    t5 = T5Config(d_model=512, num_heads=8, d_kv=32)
    zero = {"head_dim": 0, "hidden_size": 768, "num_attention_heads": 12}
    for config, expected in ((t5, 32), (zero, 64)):
        model = SimpleNamespace(config=config)
        got = (head_dim(config), api.head_dim(config), attention_logits.head_dim(model))  # type: ignore[arg-type]
        assert got == (expected,) * 3, (config, got)
