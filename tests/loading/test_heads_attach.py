"""Attaching the sentence-transformers heads leaves the transformer as it was: its class, its
forward and so every adapter's match (a subclass overriding ``forward`` hid the mask
builders DistilBERT's forward calls from attention-mask-host, and distiluse failed to lower)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from support.models import TINY_ARCHS
from support.tiny_models import TINY, tiny_inputs

from hfadapt.adapters.registry import default_registry
from hfadapt.loading.heads import HEADS_MASK, HEADS_NAME, DenseLayer, Heads, attach

_IDENTITY = "torch.nn.modules.linear.Identity"
# every bundled family with a tiny model in tests/support (tiny_models.TINY, models.TINY_ARCHS)
_FAMILIES = {**TINY, "roberta": TINY_ARCHS["roberta"]}


def _tiny(arch: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModel

    from hfadapt.loading.load import quiet_transformers

    layers = {"n_layers": 1} if arch == "distilbert" else {"num_hidden_layers": 1}
    pad = {} if "pad_token_id" in _FAMILIES[arch] else {"pad_token_id": 0}
    with quiet_transformers():
        config = AutoConfig.for_model(arch, vocab_size=128, **{**_FAMILIES[arch], **layers, **pad})
        torch.manual_seed(0)
        return AutoModel.from_config(config).eval()


def _heads(hidden: int) -> Heads:
    """distiluse's and BGE-M3's heads in one: mean Pooling, a tanh Dense, Normalize, and the
    token-level sparse and ColBERT linears."""
    dense = {"in_features": hidden, "out_features": 64, "bias": True,
             "activation_function": "torch.nn.modules.activation.Tanh"}  # fmt: skip
    heads = Heads(
        [
            ("pooling", "1_Pooling", {"pooling_mode_mean_tokens": True}),
            ("dense", "2_Dense", dense),
            ("normalize", "3_Normalize", {}),
            ("m3_sparse", "sparse_linear", {}),
            ("m3_colbert", "colbert_linear", {}),
        ],
        multi_vector=False,
    )
    heads.built["2_Dense"] = DenseLayer(dense)
    heads.built["sparse_linear"] = torch.nn.Linear(hidden, 1)
    heads.built["colbert_linear"] = torch.nn.Linear(hidden, hidden)
    return heads.eval()


def _matches(model: torch.nn.Module) -> dict[str, list[str]]:
    """Each adapter of the default registry with the transformer modules it would patch (the
    heads' own modules left out: adapters may rightly take those, e.g. post-ln-handoff-clone)."""
    out = {}
    for a, hits in default_registry().matches(model):
        names = [n or "<root>" for n, _ in hits if not n.startswith(HEADS_NAME)]
        if names:
            out[a.name] = names
    return out


@pytest.mark.parametrize("arch", sorted(_FAMILIES))
def test_attached_heads_leave_every_adapter_match_as_without_them(arch: str) -> None:
    model = _tiny(arch)
    hidden = int(model.get_input_embeddings().weight.shape[1])
    stock_class, stock_forward = type(model), type(model).forward
    without = _matches(model)
    attached = attach(copy.deepcopy(model), _heads(hidden))
    with_heads = _matches(attached)
    print(f"{arch}: without heads {sorted(without)}\n{arch}: with heads    {sorted(with_heads)}")
    assert type(attached) is stock_class and type(attached).forward is stock_forward
    assert "forward" not in vars(attached), "an instance forward would hide the class's"
    assert with_heads == without, {
        "only without heads": sorted(set(without) - set(with_heads)),
        "only with heads": sorted(set(with_heads) - set(without)),
    }
    if arch in ("distilbert", "qwen3"):  # their forward builds the masks itself
        assert "attention-mask-host" in with_heads, sorted(with_heads)


def test_attached_heads_run_after_the_model_and_a_deep_copy_stays_attached() -> None:
    model = _tiny("distilbert").double()
    heads = _heads(128).double()
    inputs = tiny_inputs(128)
    with torch.inference_mode():
        plain = model(**inputs).last_hidden_state
        mask = inputs["attention_mask"].to(torch.float64)
        expected = heads(plain, mask)
        attached = attach(copy.deepcopy(model), copy.deepcopy(heads))
        outs: list[Any] = [
            attached(**inputs),
            copy.deepcopy(attached)(**inputs, **{HEADS_MASK: mask}),
        ]
    for out in outs:
        diffs = {k: float((out[k] - v).abs().max()) for k, v in expected.items()}
        print(type(out).__name__, diffs, float((out.last_hidden_state - plain).abs().max()))
        assert torch.equal(out.last_hidden_state, plain)
        assert set(diffs) == {"sentence_embedding", "token_weights", "token_vectors"}, diffs
        assert max(diffs.values()) == 0.0, diffs
    # the mask handed to the heads is used once: nothing stale is left for the next call
    assert getattr(attached, HEADS_NAME).given == {}, getattr(attached, HEADS_NAME).given
    hooks = (len(attached._forward_pre_hooks), len(attached._forward_hooks))
    attach(attached, copy.deepcopy(heads))  # attached again: the heads replaced, run once
    again = (len(attached._forward_pre_hooks), len(attached._forward_hooks))
    assert hooks == again == (1, 1), (hooks, again)
