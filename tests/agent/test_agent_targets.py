"""Targets besides a module's forward, drafted through the loop `hfadapt draft` runs against a
scripted loopback endpoint, on a tiny RoFormer (config built here, no Hub): the staticmethod
``RoFormerSelfAttention.apply_rotary_position_embeddings`` is captured with its own arguments
and a rewrite as constant matmuls is accepted; transformers' module-level mask builder
``create_bidirectional_mask`` (three of the model's failures sit below it) is captured with its
own arguments on a FunctionSite, proven against the stock function and applied by rebinding
it in ``RoFormerModel.forward``. Wrong drafts of each are refused with the numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from support.drafting import draft_cli, rows, run
from support.openai_server import (
    ScriptedOpenAI,
    openai_server_fixture,  # noqa: F401
)

from hfadapt.agent.cases import FailureCase, stock_call
from hfadapt.agent.loop import ACCEPTED

ROFORMER = {
    "model_type": "roformer",
    "architectures": ["RoFormerModel"],
    "hidden_size": 128,
    "embedding_size": 128,
    "num_attention_heads": 2,
    "intermediate_size": 256,
    "num_hidden_layers": 1,
    "vocab_size": 96,
    "max_position_embeddings": 512,
    "initializer_range": 0.2,
}
ROTARY = (
    "transformers.models.roformer.modeling_roformer:"
    "RoFormerSelfAttention.apply_rotary_position_embeddings"
)
MASK = "transformers.masking_utils:create_bidirectional_mask"
SITE = "transformers.models.roformer.modeling_roformer:RoFormerModel.forward"
HEAD = "import torch\n\nfrom hfadapt.adapters.api import adapter\n\n\n"


def _rotary(sign: str = "1.0") -> str:
    """RoFormer's rotary embedding as matmuls with constant 0/+-1 matrices (no strided slices,
    no stack); ``sign`` is the rotation's sign for even channels (1.0 is right)."""
    return (
        f"```python\n{HEAD}"
        f'@adapter(name="rotary-agent", target="{ROTARY}", rule="layout.basic_slicing")\n'
        "def apply_rotary_position_embeddings(sinusoidal_pos, query_layer, key_layer, value_layer=None):\n"
        "    d = query_layer.shape[-1]\n"
        "    half = d // 2\n"
        "    spread_sin = [[1.0 if i < half and j // 2 == i else 0.0 for j in range(d)] for i in range(d)]\n"
        "    spread_cos = [[1.0 if i >= half and j // 2 == i - half else 0.0 for j in range(d)] for i in range(d)]\n"
        f"    rotate = [[({sign} if i % 2 == 0 else -1.0) if j == i + 1 - 2 * (i % 2) else 0.0 "
        "for j in range(d)] for i in range(d)]\n"
        "    dtype, device = query_layer.dtype, query_layer.device\n"
        "    sin_pos = torch.matmul(sinusoidal_pos, torch.tensor(spread_sin).to(device=device, dtype=dtype))\n"
        "    cos_pos = torch.matmul(sinusoidal_pos, torch.tensor(spread_cos).to(device=device, dtype=dtype))\n"
        "    r = torch.tensor(rotate).to(device=device, dtype=dtype)\n"
        "    query_layer = query_layer * cos_pos + torch.matmul(query_layer, r) * sin_pos\n"
        "    key_layer = key_layer * cos_pos + torch.matmul(key_layer, r) * sin_pos\n"
        "    if value_layer is not None:\n"
        "        value_layer = value_layer * cos_pos + torch.matmul(value_layer, r) * sin_pos\n"
        "        return query_layer, key_layer, value_layer\n"
        "    return query_layer, key_layer\n"
        "```\n"
    )


def _mask(body: str) -> str:
    return (
        f"```python\n{HEAD}"
        f'@adapter(name="mask-agent", target="{MASK}", rule="dtype.cast")\n'
        "def create_bidirectional_mask(config, inputs_embeds, attention_mask, "
        "encoder_hidden_states=None, cache=None, or_mask_function=None, and_mask_function=None, "
        "allow_is_bidirectional_skip=True, position_ids=None, **kwargs):\n"
        "    dtype = inputs_embeds.dtype\n"
        f"{body}\n"
        "    return masked.expand(inputs_embeds.shape[0], 1, inputs_embeds.shape[1], "
        "attention_mask.shape[-1])\n"
        "```\n"
    )


# The eager mask the stock code builds (0 where kept, finfo.min where padded), with no integer
# cast on the device: a comparison selects between two values made from the embeddings.
MASK_RIGHT = _mask(
    "    zero = inputs_embeds[:, :1, :1].unsqueeze(1) * 0.0\n"
    "    masked = torch.where(attention_mask[:, None, None, :] == 0, "
    "zero + torch.finfo(dtype).min, zero)"
)
# The same values through an integer -> float cast: the device refuses the cast.
MASK_CAST = _mask(
    "    keep = attention_mask[:, None, None, :].to(dtype)\n"
    "    masked = (1.0 - keep) * torch.finfo(dtype).min"
)
# Masks nothing: every position attends, padding included.
MASK_NONE = _mask(
    "    masked = inputs_embeds[:, :1, :1].unsqueeze(1) * 0.0 + attention_mask[:, None, None, :1] * 0.0"
)


@pytest.fixture(scope="module")
def roformer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, FailureCase]]:
    """A tiny RoFormer folder and its cases judged eager without adapters, by target kind."""
    from hfadapt.agent.workflows import cases_for_model
    from hfadapt.judge.options import JudgeOptions

    root = tmp_path_factory.mktemp("roformer")
    folder = root / "tiny-roformer"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(ROFORMER))
    judge = JudgeOptions(mode="structural", execution="eager", adapters=False)
    _, cases = cases_for_model(folder, judge, workdir=root, record=False)
    by_rule = {c.rule_id: c for c in cases}
    return folder, by_rule


def test_each_kind_is_located_and_captured_with_its_own_arguments(
    roformer: tuple[Path, dict[str, FailureCase]],
) -> None:
    _, cases = roformer
    found = {(c.rule_id, c.kind, c.target, c.call_site) for c in cases.values()}
    assert ("layout.basic_slicing", "staticmethod", ROTARY, None) in found, found
    assert ("dtype.cast", "function", MASK, SITE) in found, found
    assert (
        cases["dtype.cast"].evidence["failing_function"]
        == "transformers.masking_utils:_preprocess_mask_arguments"
    )
    # the staticmethod's own arguments (sinusoidal_pos, query, key), not forward's hidden states
    module, args, kwargs = torch.load(
        cases["layout.basic_slicing"].example_file, weights_only=False
    )[0]
    shapes = [tuple(a.shape) for a in args]
    assert type(module).__name__ == "RoFormerSelfAttention" and len(args) == 3 and not kwargs, (
        shapes
    )
    assert shapes[0][-1] == 64 and shapes[1][1:] == (2, shapes[1][2], 64), shapes
    q, k = stock_call(ROTARY)(module, *args)
    assert q.shape == args[1].shape and k.shape == args[2].shape, (q.shape, k.shape)
    # the mask builder's: tensors by name, the config held by the site
    site, args, kwargs = torch.load(cases["dtype.cast"].example_file, weights_only=False)[0]
    assert args == () and sorted(kwargs) == ["attention_mask", "cache", "inputs_embeds"], kwargs
    assert site.context()["config"].model_type == "roformer", site.context()
    mask = stock_call(MASK)(site, **kwargs)
    assert mask.shape[-2:] == (kwargs["inputs_embeds"].shape[1],) * 2, mask.shape


@pytest.mark.slow
@pytest.mark.usefixtures("proofs_in_process")
def test_rotary_staticmethod_as_constant_matmuls_is_accepted_a_wrong_sign_refused(
    roformer: tuple[Path, dict[str, FailureCase]], openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    _, cases = roformer
    openai_server.script = [_rotary("-1.0"), _rotary()]
    outcome, engine = run(
        openai_server.url, tmp_path, attempts=2, case=cases["layout.basic_slicing"]
    )
    _, attempts = rows(engine)
    assert outcome.outcome == ACCEPTED, (outcome.reason, [a.feedback for a in attempts])
    first = attempts[0]
    assert first.failed_step == "equivalence" and "max rel err" in (first.feedback or ""), (
        first.feedback
    )
    steps = {s["step"]: s for s in attempts[1].steps or []}
    assert "fingerprint 40bddef4330c gone" in steps["device"]["summary"], steps["device"]
    assert steps["equivalence"]["output"]["max_rel_err"] == 0.0, steps["equivalence"]["summary"]


def _answer_by_target(answers: dict[str, list[str]]) -> Any:
    """A scripted answer: the next draft queued for the target the prompt names, else none."""

    def answer(body: dict[str, Any]) -> str:
        prompt = body["messages"][1]["content"]
        for target, queue in answers.items():
            if target in prompt and queue:
                return queue.pop(0)
        return "no code this time"

    return answer


@pytest.mark.slow
@pytest.mark.usefixtures("proofs_in_process")
def test_masking_utility_rewrite_through_draft_cli_is_accepted_and_applied_where_called(
    roformer: tuple[Path, dict[str, FailureCase]],
    openai_server: ScriptedOpenAI,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """`hfadapt draft MODEL --no-adapters --eager`: the first mask failure gets a draft that
    masks nothing (refused at equivalence) then one with an integer cast (refused on the
    device, with the violation counts); the next gets the right one (accepted: every mask
    failure gone). The rotary and gelu failures get no code: exit 1."""
    folder, _ = roformer
    answers = {"create_bidirectional_mask": [MASK_NONE, MASK_CAST, MASK_RIGHT]}
    openai_server.script = [_answer_by_target(answers)] * 12
    args = [
        *("draft", str(folder), "--mode", "structural", "--no-adapters", "--eager"),
        *("--base-url", openai_server.url, "--model", "scripted-model", "--api-key", "sk-cli"),
        *("--max-attempts", "2", "--db", str(tmp_path / "runs.db"), "--json"),
    ]
    code, out, err = draft_cli(args, monkeypatch, capsys, tmp_path / "home")
    assert code == 1, (code, out[-2000:], err[-2000:])
    outcomes = json.loads(out)
    masks = [o for o in outcomes if o["case"] in {"5ddb7f757681", "57102918bd27", "0a41f132a64b"}]
    assert [o["outcome"] for o in masks][:2] == ["rejected", "accepted"], masks
    # .get: an attempt that stopped at an earlier step has no later one (print the steps)
    assert masks[0]["steps"][0].get("equivalence") == "fail", masks[0]["steps"]
    assert masks[0]["steps"][1].get("device") == "fail", masks[0]["steps"]
    from sqlmodel import select

    from hfadapt.db.engine import get_engine, session
    from hfadapt.db.tables import AgentAttempt

    with session(get_engine(str(tmp_path / "runs.db")), write=False) as s:
        tried = [
            a
            for a in s.exec(select(AgentAttempt))
            if a.code and "create_bidirectional_mask" in a.code
        ]
    feedback = [a.feedback or "" for a in tried]
    assert "max rel err" in feedback[0] or "rel" in feedback[0], feedback[0]
    assert "new violation" in feedback[1] and "cast from int" in feedback[1], feedback[1]
    manifest = json.loads((Path(masks[1]["adapter_path"]) / "adapter.json").read_text())
    assert (manifest["target"], manifest["call_site"]) == (MASK, SITE), manifest
    assert manifest["conditions"]["reads"].get("attn_implementation") == "eager", manifest[
        "conditions"
    ]


def test_a_forward_captured_below_applied_adapters_loads_back(tmp_path: Path) -> None:
    """A captured module whose submodules carry applied adapters (``layer-norm-unfused`` on
    BertEmbeddings.LayerNorm) is saved without their dispatch: a bound method pickles as a
    getattr of its name (``hfadapt_forward``), which the loaded module would not have."""
    from transformers import BertConfig, BertModel

    from hfadapt.adapters.registry import discover
    from hfadapt.agent.cases import capture_calls

    config = BertConfig(hidden_size=64, num_attention_heads=1, intermediate_size=64,
                        num_hidden_layers=1, vocab_size=50)  # fmt: skip
    model = BertModel(config).eval()
    handle = discover().apply(model)
    assert "forward" in vars(model.embeddings.LayerNorm), handle.names  # the dispatch is there
    path = tmp_path / "calls.pt"
    target = "transformers.models.bert.modeling_bert:BertEmbeddings.forward"
    runs = [{"input_ids": torch.randint(0, 50, (2, 9))}]
    assert capture_calls(model, runs, target, path=path) == 1
    ((module, args, kwargs),) = torch.load(path, weights_only=False)
    assert "forward" not in vars(module.LayerNorm) and "_hfadapt_stack" not in vars(
        module.LayerNorm
    )
    assert "forward" in vars(model.embeddings.LayerNorm), "the model's own adapters stay applied"
    out = stock_call(target)(module, *args, **kwargs)
    assert out.shape == (2, 9, 64), out.shape
