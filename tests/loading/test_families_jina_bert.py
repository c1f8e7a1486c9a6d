"""jina-bert v2 judged through hfadapt's own native class (hfadapt/loading/native/jina_bert_v2.py),
never its remote code: the class against ALiBi and GeGLU written out from their formulas, the
translation of the family's configs and snapshot rows, a remote-named checkpoint loaded onto it,
and a tiny model of the family on the simulated device without and with adapters."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from support.families import bundled_family

from hfadapt.hub.snapshot import bundled_config, read_snapshot
from hfadapt.loading import translate
from hfadapt.loading.native.jina_bert_v2 import JinaBertV2Model, alibi_slopes
from hfadapt.loading.signature import config_from_dict

TINY = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 256, "vocab_size": 1000}  # fmt: skip


def _base_en() -> dict[str, Any]:
    raw = bundled_config("jinaai/jina-embeddings-v2-base-en")
    assert raw is not None
    return copy.deepcopy(raw)


def _native(raw: dict[str, Any], **overrides: Any) -> JinaBertV2Model:
    got = translate.translate(raw)
    assert isinstance(got, translate.Translation), got.one_line()
    config = config_from_dict({**got.config, **overrides})
    torch.manual_seed(0)
    model = JinaBertV2Model(config).double().eval()
    with torch.no_grad():  # LayerNorms and biases off their defaults: every term shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _by_formula(model: JinaBertV2Model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """jina-bert v2 written out: LN(word + type0) embeddings; per layer h1 = LN(x + O(attn)),
    attention scores q.k/sqrt(d) - m_h |i-j| (masked keys -inf), m_h = 2^(-8h/n); out
    LN(h1 + W_o(gelu(h1 W_g) * h1 W_u))."""
    f = torch.nn.functional
    cfg = model.config
    e = model.embeddings
    x = e.word_embeddings.weight[ids] + e.token_type_embeddings.weight[0]
    x = f.layer_norm(
        x, (cfg.hidden_size,), e.LayerNorm.weight, e.LayerNorm.bias, cfg.layer_norm_eps
    )
    heads, length = cfg.num_attention_heads, ids.shape[1]
    d = cfg.hidden_size // heads
    slopes = [2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)]  # a power of two here
    dist = torch.tensor([[abs(i - j) for j in range(length)] for i in range(length)], dtype=x.dtype)
    for layer in model.encoder.layer:
        a = layer.attention
        q, k, v = (lin(x).view(*x.shape[:2], heads, d).transpose(1, 2)
                   for lin in (a.self.query, a.self.key, a.self.value))  # fmt: skip
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        scores = scores - torch.tensor(slopes, dtype=x.dtype)[:, None, None] * dist
        scores = scores.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(x.shape)
        o = a.output
        h1 = f.layer_norm(x + o.dense(ctx), (cfg.hidden_size,), o.LayerNorm.weight,
                          o.LayerNorm.bias, cfg.layer_norm_eps)  # fmt: skip
        mlp = layer.mlp
        w_gate, w_up = mlp.gated_layers.weight.chunk(2, dim=0)
        glu = f.gelu(h1 @ w_gate.T) * (h1 @ w_up.T)
        x = f.layer_norm(h1 + mlp.wo(glu), (cfg.hidden_size,), mlp.layernorm.weight,
                         mlp.layernorm.bias, cfg.layer_norm_eps)  # fmt: skip
    return x


def test_native_class_is_alibi_geglu_post_ln_as_written_out() -> None:
    model = _native(_base_en(), **TINY)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 1000, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
        want = _by_formula(model, ids, mask)
    err = (got - want)[mask.bool()].abs().max().item()
    assert err < 1e-12, f"native jina-bert v2 differs from the formula by {err:.3g}"
    for impl in ("eager", "sdpa"):
        model.config._attn_implementation = impl
        with torch.no_grad():
            other = model(input_ids=ids, attention_mask=mask).last_hidden_state
        diff = (other - got)[mask.bool()].abs().max().item()
        assert diff < 1e-12, f"{impl} attention differs by {diff:.3g}"


def test_alibi_slopes_are_the_papers() -> None:
    assert alibi_slopes(8) == [2.0**-k for k in range(1, 9)]
    twelve = [2.0**-k for k in range(1, 9)] + [2.0 ** -(k + 0.5) for k in range(4)]
    got = alibi_slopes(12)
    assert max(abs(a - b) for a, b in zip(got, twelve, strict=True)) < 1e-15, got


def test_published_shapes_have_the_snapshot_parameter_counts() -> None:
    rows = {r.model_id: r for r in read_snapshot()}
    counts = {}
    for variant in bundled_family("jina_bert_v2").variants:
        got = translate.translate(copy.deepcopy(variant["config"]))
        assert isinstance(got, translate.Translation), got.one_line()
        with torch.device("meta"):
            model = JinaBertV2Model(config_from_dict(got.config))
        counts[variant["name"]] = sum(p.numel() for p in model.parameters())
        assert counts[variant["name"]] == variant["parameters"], (variant["name"], counts)
    assert rows["jinaai/jina-embeddings-v2-base-en"].parameters == 137368320
    assert rows["jinaai/jina-embeddings-v2-small-en"].parameters == 32690688
    assert rows["jinaai/jina-embeddings-v2-base-de"].parameters == 160813824
    print(counts)


def test_snapshot_rows_of_model_type_bert_are_claimed_only_by_their_architecture() -> None:
    fam = translate.family_for_row(None, "bert", ("JinaBertForMaskedLM",))
    assert fam is not None and fam.name == "jina_bert_v2"
    assert translate.family_for_row(None, "bert", ("BertModel",)) is None
    assert translate.family_for_row(None, "bert") is None
    row = next(r for r in read_snapshot() if r.model_id == "jinaai/jina-embeddings-v2-small-en")
    got = translate.translate_row(
        row.model_id, row.config_class, row.model_type, row.parameters,
        architectures=row.architectures,
    )  # fmt: skip
    assert isinstance(got, translate.Translation), got.one_line()
    assert got.native_type == "jina_bert_v2" and got.config["hidden_size"] == 512


@pytest.mark.parametrize(
    ("change", "field"),
    [
        # the qk-post-norm code (jina-embeddings-v2-base-code) computes something else
        ({"auto_map": {"AutoConfig": "jinaai/jina-bert-v2-qk-post-norm--configuration_bert.JinaBertConfig",
                       "AutoModel": "jinaai/jina-bert-v2-qk-post-norm--modeling_bert.JinaBertModel"}},
         "auto_map.AutoModel"),
        ({"auto_map": {"AutoConfig": "configuration_bert.JinaBertConfig",
                       "AutoModel": "modeling_bert.JinaBertModel"}}, "auto_map.AutoModel"),
        ({"position_embedding_type": "absolute"}, "position_embedding_type"),
        ({"feed_forward_type": "original"}, "feed_forward_type"),
        ({"architectures": ["BertModel"]}, "architectures"),
        ({"attn_logit_softcapping": 30.0}, "attn_logit_softcapping"),
    ],
)  # fmt: skip
def test_what_the_native_class_does_not_compute_stays_custom_code(
    change: dict[str, Any], field: str
) -> None:
    got = translate.translate({**_base_en(), **change})
    assert isinstance(got, translate.Refusal), f"{change} was translated"
    assert got.field == field, f"refusal names {got.field!r}: {got.reason}"


def test_a_remote_named_checkpoint_loads_onto_the_native_class(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from hfadapt.loading.load import model_class
    from hfadapt.loading.remote import load_translated

    raw = {**_base_en(), **TINY}
    source = _native(raw).float()
    # JinaBertForMaskedLM's names: the encoder under "bert.", an MLM head under "cls."
    state = {f"bert.{k}": v.contiguous() for k, v in source.state_dict().items()}
    state["cls.predictions.bias"] = torch.zeros(1000)
    save_file(state, str(tmp_path / "model.safetensors"))
    got = translate.translate(raw)
    assert isinstance(got, translate.Translation)
    model, _config, notes = load_translated(
        [tmp_path / "model.safetensors"], got, "tiny/jina", model_class
    )
    assert type(model).__name__ == "JinaBertV2Model", type(model).__name__
    model.eval()  # as load() leaves it
    ids = torch.randint(1, 1000, (2, 11))
    with torch.no_grad():
        diff = model(input_ids=ids).last_hidden_state - source(input_ids=ids).last_hidden_state
    assert diff.abs().max().item() == 0.0, diff.abs().max().item()
    assert any("not used: 1" in n for n in notes), notes


def _diagnose(adapters: bool, execution: str, without: tuple[str, ...] = ()) -> Any:
    from hfadapt.judge.diagnose import diagnose

    return diagnose(
        "tiny/jina-bert-v2", config={**_base_en(), **TINY}, mode="structural",
        adapters=adapters, without_adapters=without, record=False, localize_failures=False,
        execution=execution,
    )  # fmt: skip


@pytest.mark.parametrize("execution", ["eager", "compile"])
def test_tiny_jina_bert_fails_without_adapters_and_passes_with(execution: str) -> None:
    bare = _diagnose(adapters=False, execution="eager")
    with_ = _diagnose(adapters=True, execution=execution)
    print(f"jina-bert v2 {execution}: without: {bare.reason}\n with: {with_.reason}")
    assert bare.verdict == "lowering_failed", (bare.verdict, bare.reason)
    assert with_.verdict == "pass", (with_.verdict, with_.reason, with_.adapters)
    assert "alibi-bias-host" in (with_.adapters or []), with_.adapters
    if execution == "eager":  # the fp32 -> fp16 cast of the stock bias, eagerly (#2314)
        without = _diagnose(adapters=True, execution="eager", without=("alibi-bias-host",))
        print(f" without alibi-bias-host: {without.verdict}: {without.reason}")
        assert without.verdict == "verification_failed", (without.verdict, without.reason)
        assert "defect.eager_fp32_cast" in without.reason, without.reason
    translated = with_.evidence.get("translated_from") or {}
    assert translated.get("family") == "jina_bert_v2", with_.evidence
