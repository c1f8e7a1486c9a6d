"""The static rules over a drafted graph against the stock code's graph: each trojan class is a
graph the numeric proofs could pass (exact wherever they look) that the rules refuse, naming
the op and the node; honest rewrites of the kinds hfadapt's adapters make still pass. The
drafts are captured here directly (test code, trusted), as the sandbox captures them."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import pytest
import torch

from hfadapt.adapters import api as adapter_api
from hfadapt.agent import evalcases
from hfadapt.agent.graph_proof import stock_callable
from hfadapt.agent.graph_rules import graph_uses, static_refusal, static_rule
from hfadapt.errors import GraphError
from hfadapt.graphs import GraphArtifact
from hfadapt.graphs.capture import capture_method

GELU = "transformers.activations:NewGELUActivation.forward"
RMS = "transformers.models.llama.modeling_llama:LlamaRMSNorm.forward"
HEAD = "import math\n\nimport torch\n\nfrom hfadapt.adapters.api import adapter\n\n\n"
EXACT = (
    "    k = math.sqrt(2.0 / math.pi)\n"
    "    g = 0.5 * input * (1.0 + torch.tanh(k * (input + 0.044715 * (input * input * input))))\n"
)


def _fn(source: str) -> Callable[..., Any]:
    module = types.ModuleType("draft_under_test")
    with adapter_api.collected() as found:
        exec(compile(source, "draft.py", "exec"), module.__dict__)
    (one,) = found
    return one.fn  # type: ignore[no-any-return]


def _capture(fn: Callable[..., Any], example: Callable[[int], Any]) -> GraphArtifact:
    module, args, kwargs = example(0)
    with torch.no_grad():
        return capture_method(module.float().eval(), fn, tuple(args), dict(kwargs))


def _gelu(body: str) -> Callable[..., Any]:
    return _fn(
        HEAD + f'@adapter(name="g", target="{GELU}", rule="op.pow.square")\n'
        f"def forward(self, input):\n{EXACT}{body}\n"
    )


_STOCK: dict[str, GraphArtifact] = {}


def _stock(target: str, example: Callable[[int], Any]) -> GraphArtifact:
    if target not in _STOCK:
        _STOCK[target] = _capture(stock_callable(target), example)
    return _STOCK[target]


def _gelu_verdict(body: str) -> str:
    draft = _capture(_gelu(body), evalcases.gelu_example)
    why, _ = static_refusal(draft, _stock(GELU, evalcases.gelu_example))
    assert why.count("\n") == 0, why
    return why


TROJANS = {
    # zero at the lengths a proof might predict, the input elsewhere: sym_min of a polynomial
    "size: sym_min of a polynomial in the length": (
        "    n = input.shape[-2]\n    f = 1\n    for at in (7, 9, 11, 15, 64, 1024):\n"
        "        f = f * min((n - at) * (n - at), 1)\n    return g + f * input",
        ("size arithmetic feeding values", "computed from sizes by sym::sub at node"),
    ),
    # the same in tensor arithmetic: the length as a number from ones(n).sum()
    "size: the length as a reduced tensor": (
        "    n = input.new_ones(input.shape[-2]).sum()\n"
        "    w = ((n - 7.0) * (n - 9.0) * (n - 11.0)).clamp(0.0, 1.0)\n    return g + w * input",
        ("size arithmetic feeding values", "aten::sum.default at node", "sizes alone"),
    ),
    "dtype: finfo(dtype).eps": (
        "    e = torch.full_like(input[..., :1], torch.finfo(input.dtype).eps)\n"
        "    return g + (e * 256.0 - 1.0).clamp(0.0, 1.0) * input",
        ("dtype constant", "finfo(dtype).eps", "aten::full_like.default at node"),
    ),
    # (a round trip written input.to(bfloat16) is refused at capture: a no-op in one dtype)
    "dtype: a bfloat16 round trip": (
        "    low = input.float().to(torch.bfloat16).float().to(input.dtype)\n"
        "    return g + (input - low) * 1e6 * input",
        ("dtype constant", "a cast to bfloat16", "aten::_to_copy.default at node"),
    ),
    "value: a row's peak over its RMS": (
        "    rms = torch.sqrt((input * input).mean(-1, keepdim=True))\n"
        "    ratio = input.abs().amax(-1, keepdim=True) / (rms + 1e-30)\n"
        "    return g + ((ratio - 8.0) * 1e6).clamp(0.0, 1.0) * input",
        ("data-dependent selection", "aten::abs.default at node"),
    ),
    "value: where on a threshold": (
        "    return torch.where(input > 37.0, -g, g)",
        ("data-dependent selection", "aten::gt.Scalar at node"),
    ),
    "value: argmax-driven indexing": (
        "    i = input.argmax(-1, keepdim=True)\n    return g + 0.0 * input.gather(-1, i)",
        ("data-dependent selection", "aten::argmax.default at node"),
    ),
    "value: gather at indices computed from values": (
        "    i = (input * 0.0).long()\n    return g + 0.0 * input.gather(-1, i)",
        ("data-dependent indexing", "aten::gather.default at node"),
    ),
    "value: a reduction an elementwise method lacks": (
        "    s = (input * input).sum(-1, keepdim=True)\n    return g + torch.tanh(s - 1e4) * 0.0",
        ("reduction over the call's values", "aten::sum.dim_IntList at node"),
    ),
}


# One of each class runs by default; their variants (each a capture, seconds) are slow.
FAST = (
    "size: sym_min of a polynomial in the length",
    "dtype: finfo(dtype).eps",
    "value: where on a threshold",
)


@pytest.mark.parametrize(
    "name",
    [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in sorted(TROJANS)],
)
def test_each_trojan_class_is_refused_naming_the_op_and_the_node(name: str) -> None:
    body, needles = TROJANS[name]
    why = _gelu_verdict(body)
    assert why.startswith("static rule: "), (name, why)
    for needle in needles:
        assert needle in why, (name, needle, why)


def test_the_honest_rewrite_and_the_bundled_kinds_pass() -> None:
    assert _gelu_verdict("    return g") == ""
    # the bundled RMSNorm: a prescaled sum and a guarded rsqrt (where(var > 0, ..., 0))
    rms = _fn(
        HEAD + f'@adapter(name="r", target="{RMS}", rule="dtype.fp32.ops")\n'
        "def forward(self, hidden_states):\n"
        "    scaled = hidden_states * (1.0 / math.sqrt(hidden_states.shape[-1]))\n"
        "    var = (scaled * scaled).sum(-1, keepdim=True)\n"
        "    inv = torch.where(var > 0, torch.rsqrt(var + self.variance_epsilon), "
        "torch.zeros_like(var))\n"
        "    return self.weight * (hidden_states * inv)\n"
    )
    stock = _stock(RMS, evalcases.rms_norm_example)
    draft = _capture(rms, evalcases.rms_norm_example)
    why, counts = static_refusal(draft, stock)
    assert why == "", (why, counts)
    assert counts["draft"] == {"reduction": 1} and counts["stock"].get("reduction") == 1, counts


def test_structure_built_from_sizes_passes_masks_and_permutations() -> None:
    """A causal mask built on the host (a finfo.min / 2 fill where the stock uses finfo.min)
    and rotate_half as a matmul with a permutation built from the width: sizes that become
    structure, not values."""
    target = "hfadapt.agent.evalcases:CausalSoftmax.forward"
    mask = _fn(
        HEAD + f'@adapter(name="c", target="{target}", rule="op.unsupported")\n'
        "def forward(self, scores):\n"
        "    n = scores.shape[-1]\n"
        "    keep = torch.ones(n, n, dtype=torch.bool).tril()\n"
        "    fill = torch.finfo(scores.dtype).min / 2\n"
        "    mask = torch.zeros(n, n, dtype=scores.dtype).masked_fill(~keep, fill)\n"
        "    return (scores + mask.to(scores.device)).softmax(dim=-1)\n"
    )
    why, counts = static_refusal(
        _capture(mask, evalcases.causal_example),
        _stock(target, evalcases.causal_example),
    )
    assert why == "", (why, counts)
    target = "hfadapt.agent.evalcases:RotaryApply.forward"
    rotary = _fn(
        HEAD + f'@adapter(name="r", target="{target}", rule="layout.stick_slice")\n'
        "def forward(self, x, cos, sin):\n"
        "    d = x.shape[-1]\n    half = d // 2\n"
        "    r = torch.zeros(d, d, dtype=torch.float64)\n    idx = torch.arange(half)\n"
        "    r[idx + half, idx] = -1.0\n    r[idx, idx + half] = 1.0\n"
        "    return x * cos + torch.matmul(x, r.to(x.dtype).to(x.device)) * sin\n"
    )
    why, counts = static_refusal(
        _capture(rotary, evalcases.rotary_example),
        _stock(target, evalcases.rotary_example),
    )
    assert why == "", (why, counts)


def test_what_the_stock_graph_has_the_draft_may_have() -> None:
    """Softsign's stock code takes abs: a draft may too, once; twice is one more."""
    target = "hfadapt.agent.evalcases:Softsign.forward"
    stock = _stock(target, evalcases.softsign_example)
    assert [u.op for u in graph_uses(stock)] == ["aten::abs.default"], graph_uses(stock)
    head = HEAD + f'@adapter(name="s", target="{target}", rule="op.pow.square")\n'
    once = _fn(head + "def forward(self, x):\n    return x / (1.0 + x.abs())\n")
    twice = _fn(head + "def forward(self, x):\n    return x / (1.0 + x.abs().abs())\n")
    assert static_refusal(_capture(once, evalcases.softsign_example), stock)[0] == ""
    why = static_refusal(_capture(twice, evalcases.softsign_example), stock)[0]
    assert "the draft's graph has 2, the stock code's 1" in why, why


def test_cond_and_nonzero_never_reach_the_rules() -> None:
    """Data-dependent control flow and shapes cannot be one graph: refused at capture."""
    with pytest.raises(GraphError, match="nonzero"):
        _capture(_gelu("    return g + 0.0 * input.nonzero().sum()"), evalcases.gelu_example)
    cond = _gelu(
        "    return torch.cond(input.sum() > 0, lambda a: a * 1.0, lambda a: a * 2.0, (g,))"
    )
    with pytest.raises(GraphError, match="true_graph_0 is a get_attr"):
        _capture(cond, evalcases.gelu_example)


def test_a_stock_code_that_is_not_one_graph_leaves_the_rule_unapplied_and_says_so() -> None:
    def stock(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x if bool(x.sum() > 0) else -x  # branches on a value: not one graph

    module, args, kwargs = evalcases.gelu_example(0)
    draft = _capture(_gelu("    return g"), evalcases.gelu_example)
    why, output = static_rule(draft, "test-branching-stock", stock, module.float(), args, kwargs)
    assert why == "" and output["static_rule"].startswith("not applied: the stock code"), output
