"""The attention's spread, measured and drawn (hfadapt.loading.attention_logits): the measure
follows each family's own logit scale, ``sharpen`` reaches the target through the query's
projection or its per-head norm, and says why when it cannot."""

from __future__ import annotations

import math

import pytest
import torch

from hfadapt.loading.attention_logits import logit_spread, seeded_row, sharpen


def _bert() -> torch.nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=64, num_attention_heads=2, intermediate_size=128, num_hidden_layers=2,
        vocab_size=3000, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    return BertModel(config)


def _qwen3() -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(
        hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        intermediate_size=128, num_hidden_layers=2, vocab_size=3000, initializer_range=0.2,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen3Model(config)


def test_the_spread_scales_with_the_query_and_follows_the_familys_own_scaling() -> None:
    from transformers import T5Config, T5EncoderModel

    bert, row = _bert().eval(), seeded_row(3000, [101])
    before = logit_spread(bert, row)
    with torch.no_grad():
        bert.encoder.layer[0].attention.self.query.weight.mul_(2.0)
    after = logit_spread(bert, row)
    print(f"bert spreads {before} -> {after} (layer 0's query doubled)")
    assert len(before) == 2 and after[0] == pytest.approx(2 * before[0], rel=1e-4), after
    t5 = T5EncoderModel(T5Config(d_model=64, d_kv=32, num_heads=2, d_ff=128, num_layers=1,
                                 vocab_size=3000)).eval()  # fmt: skip
    seen: dict[str, torch.Tensor] = {}
    attention = t5.encoder.block[0].layer[0].SelfAttention
    attention.q.register_forward_hook(lambda _m, _a, out: seen.__setitem__("q", out))
    attention.k.register_forward_hook(lambda _m, _a, out: seen.__setitem__("k", out))
    (spread,) = logit_spread(t5, row)
    q, k = (seen[n].reshape(1, 64, 2, 32).transpose(1, 2) for n in ("q", "k"))
    scores = (q @ k.transpose(-1, -2)).double()[..., 1:]  # T5 scales by 1.0, not 1/sqrt(32)
    by_hand = float((scores - scores.mean(-1, keepdim=True)).std())
    print(
        f"t5 spread {spread:.4f}, by hand {by_hand:.4f}, over sqrt(32) {by_hand / math.sqrt(32):.4f}"
    )
    assert spread == pytest.approx(by_hand, rel=1e-3), (spread, by_hand)


def test_the_spread_is_taken_between_the_normed_queries_and_keys() -> None:
    """Qwen3 applies a per-head RMSNorm to its keys as to its queries: the logits the attention
    computes are between the normed ones, so scaling the key norm scales the spread, while
    scaling the key projection (undone by that norm) leaves it."""
    model, row = _qwen3().eval(), seeded_row(3000, [101])
    attention = model.layers[0].self_attn
    before = logit_spread(model, row)
    with torch.no_grad():
        attention.k_proj.weight.mul_(3.0)
    projection_scaled = logit_spread(model, row)
    with torch.no_grad():
        attention.k_norm.weight.mul_(2.0)
    norm_scaled = logit_spread(model, row)
    print(
        f"qwen3 spreads {before}; key projection x3 {projection_scaled}; key norm x2 {norm_scaled}"
    )
    assert projection_scaled[0] == pytest.approx(before[0], rel=1e-3), (before, projection_scaled)
    assert norm_scaled[0] == pytest.approx(2 * before[0], rel=1e-3), (before, norm_scaled)


@pytest.mark.parametrize("family", ["bert", "qwen3"])
def test_sharpen_reaches_the_measured_spread_and_leaves_the_model_as_it_was(family: str) -> None:
    model = _bert() if family == "bert" else _qwen3()
    model.train()  # as a model built from its config is: the measure must not drop out
    proj = [p.detach().clone() for n, p in model.named_parameters() if "q_proj.weight" in n]
    row = seeded_row(3000, [101])
    done = sharpen(model, 4.733, 2.021, row)
    again = logit_spread(model, row)
    print(f"{family}: {done.describe()}; before {done.before}, measured again {again}")
    assert done.skipped is None and model.training, done
    assert done.after[0] == pytest.approx(4.733, rel=0.05), done.after
    assert done.after[1] == pytest.approx(2.021, rel=0.05), done.after
    assert list(again) == list(done.after), (again, done.after)  # deterministic: no dropout
    if family == "qwen3":  # the per-head norm carries the scale: a scaled projection is undone
        after = [p for n, p in model.named_parameters() if "q_proj.weight" in n]
        assert all(torch.equal(a, b) for a, b in zip(proj, after, strict=True))


def test_sharpen_says_why_it_drew_nothing() -> None:
    with torch.device("meta"):
        meta = _bert()
    linear = torch.nn.Sequential(torch.nn.Linear(4, 4))
    row = seeded_row(3000)
    for model, why in ((meta, "a model without weights"), (_bert(), "no spread to draw")):
        first = 0.0 if why == "no spread to draw" else 4.7
        done = sharpen(model, first, 2.0, row)
        print(done.describe())
        assert done.skipped == why and "not sharpened" in done.describe(), done
    done = sharpen(linear, 4.7, 2.0, row)
    assert done.skipped == "no attention projections found", done
    done = sharpen(_bert(), 4.7, 2.0, seeded_row(30000))  # ids past its 3,000-row table
    assert done.skipped == "its forward did not run on the seeded row: IndexError", done
