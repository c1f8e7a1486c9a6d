"""The fixed agent-eval suite: failure cases with known-good solutions (docs/device-profile.md's rewrites
and the profile's unsupported ops). ``suite_case`` turns one into a FailureCase the same way a
real failure becomes one: the model runs on the simulated device and the violation it meets
gives the fingerprint, the device's text and the source to show the agent."""

from __future__ import annotations

import pkgutil
from dataclasses import dataclass

from hfadapt.agent.cases import FailureCase, from_violation
from hfadapt.errors import UsageError

_EC = "hfadapt.agent.evalcases"
_HEAD = "import math\n\nimport torch\nimport torch.nn.functional as F\n\nfrom hfadapt.adapters.api import adapter\n\n"


@dataclass(frozen=True)
class SuiteCase:
    name: str
    target: str
    rule_id: str
    op_prefix: str  # the violating ATen op (prefix)
    example: str
    model: str
    solution: str  # a known-good adapter file
    description: str


def _solution(name: str, target: str, rule: str, body: str) -> str:
    return (
        _HEAD + f'@adapter(name="{name}", target="{target}", rule="{rule}")\n' + body.strip() + "\n"
    )


SUITE: tuple[SuiteCase, ...] = (
    SuiteCase(
        "gelu-new-cube",
        "transformers.activations:NewGELUActivation.forward",
        "op.pow.square",
        "aten::pow",
        f"{_EC}:gelu_example",
        f"{_EC}:gelu_model",
        _solution(
            "eval-gelu-new-cube",
            "transformers.activations:NewGELUActivation.forward",
            "op.pow.square",
            """
def forward(self, input):
    k = math.sqrt(2.0 / math.pi)
    return 0.5 * input * (1.0 + torch.tanh(k * (input + 0.044715 * (input * input * input))))
""",
        ),
        "gelu_new's pow(x, 3.0): only pow(x, 2) lowers",
    ),
    SuiteCase(
        "rms-norm-fp32-pow",
        "transformers.models.llama.modeling_llama:LlamaRMSNorm.forward",
        "dtype.fp32.ops",
        "aten::pow",
        f"{_EC}:rms_norm_example",
        f"{_EC}:rms_norm_model",
        _solution(
            "eval-rms-norm-square",
            "transformers.models.llama.modeling_llama:LlamaRMSNorm.forward",
            "dtype.fp32.ops",
            """
def forward(self, hidden_states):
    scaled = hidden_states * (1.0 / math.sqrt(hidden_states.shape[-1]))
    var = (scaled * scaled).sum(-1, keepdim=True)
    inv = torch.where(var > 0, torch.rsqrt(var + self.variance_epsilon), torch.zeros_like(var))
    return self.weight * (hidden_states * inv)
""",
        ),
        "RMSNorm's pow(2) on fp32: pow is not among the fp32 device ops, and an fp32 mean is "
        "wrong on the card: the variance as a prescaled sum in the model dtype",
    ),
    SuiteCase(
        "masked-fill-keep-mask",
        f"{_EC}:MaskedScores.forward",
        "op.unsupported",
        "aten::masked_fill",
        f"{_EC}:masked_scores_example",
        f"{_EC}:masked_scores_model",
        _solution(
            "eval-masked-fill-keep",
            f"{_EC}:MaskedScores.forward",
            "op.unsupported",
            """
def forward(self, scores, mask):
    keep = mask.to(scores.dtype)
    return scores * keep + (1.0 - keep) * self.fill
""",
        ),
        "masked_fill is not a device op: multiply by a keep-mask",
    ),
    SuiteCase(
        "rotate-half-matmul",
        f"{_EC}:RotaryApply.forward",
        "layout.stick_slice",
        "aten::slice",
        f"{_EC}:rotary_example",
        f"{_EC}:rotary_model",
        _solution(
            "eval-rotate-half-matmul",
            f"{_EC}:RotaryApply.forward",
            "layout.stick_slice",
            """
def forward(self, x, cos, sin):
    d = x.shape[-1]
    half = d // 2
    # rotate_half(x) == x @ R, R built on the host: no slicing of the stick dimension.
    r = torch.zeros(d, d, dtype=torch.float64)
    idx = torch.arange(half)
    r[idx + half, idx] = -1.0
    r[idx, idx + half] = 1.0
    rotated = torch.matmul(x, r.to(x.dtype).to(x.device))
    return x * cos + rotated * sin
""",
        ),
        "rotate_half slices the stick dimension at an offset: write it as a matmul",
    ),
    SuiteCase(
        "causal-mask-host",
        f"{_EC}:CausalSoftmax.forward",
        "op.unsupported",
        "aten::masked_fill",
        f"{_EC}:causal_example",
        f"{_EC}:causal_model",
        _solution(
            "eval-causal-mask-host",
            f"{_EC}:CausalSoftmax.forward",
            "op.unsupported",
            """
def forward(self, scores):
    n = scores.shape[-1]
    keep = torch.ones(n, n, dtype=torch.bool).tril()
    mask = torch.zeros(n, n, dtype=scores.dtype).masked_fill(~keep, torch.finfo(scores.dtype).min / 2)
    return (scores + mask.to(scores.device)).softmax(dim=-1)
""",
        ),
        "a causal mask built with tril + masked_fill: build it on the host, finfo.min/2",
    ),
    SuiteCase(
        "head-dim-padding",
        f"{_EC}:SmallHeadAttention.forward",
        "layout.matmul_k",
        "aten::",
        f"{_EC}:small_head_example",
        f"{_EC}:small_head_model",
        _solution(
            "eval-head-dim-pad",
            f"{_EC}:SmallHeadAttention.forward",
            "layout.matmul_k",
            """
def forward(self, q, k, v):
    d = q.shape[-1]
    pad = (-d) % 64
    qp, kp, vp = (F.pad(t, (0, pad)) for t in (q, k, v))
    out = F.scaled_dot_product_attention(qp, kp, vp, scale=1.0 / math.sqrt(d))
    return out[..., :d]
""",
        ),
        "head_dim 32 is off the stick: zero-pad Q, K, V to 64 (scale kept)",
    ),
    SuiteCase(
        "token-type-one-row",
        f"{_EC}:TokenTypeAdd.forward",
        "op.unsupported",
        "aten::index",
        f"{_EC}:token_type_example",
        f"{_EC}:token_type_model",
        _solution(
            "eval-token-type-broadcast",
            f"{_EC}:TokenTypeAdd.forward",
            "op.unsupported",
            """
def forward(self, hidden_states, token_type_ids):
    # A one-row table: every id is 0, so the lookup is a broadcast add of row 0.
    return hidden_states + self.table[0]
""",
        ),
        "a one-row token-type table gathered by index: a broadcast add",
    ),
    SuiteCase(
        "l2-norm-pow-half",
        f"{_EC}:L2Normalize.forward",
        "op.pow.square",
        "aten::pow",
        f"{_EC}:l2_example",
        f"{_EC}:l2_model",
        _solution(
            "eval-l2-norm-sqrt",
            f"{_EC}:L2Normalize.forward",
            "op.pow.square",
            """
def forward(self, x):
    return x / torch.sqrt((x * x).sum(dim=-1, keepdim=True))
""",
        ),
        "pow(0.5) for a norm: sqrt",
    ),
    SuiteCase(
        "softsign-pow-reciprocal",
        f"{_EC}:Softsign.forward",
        "op.pow.square",
        "aten::pow",
        f"{_EC}:softsign_example",
        f"{_EC}:softsign_model",
        _solution(
            "eval-softsign-reciprocal",
            f"{_EC}:Softsign.forward",
            "op.pow.square",
            """
def forward(self, x):
    return x * torch.reciprocal(1.0 + x.abs())
""",
        ),
        "pow(-1): reciprocal",
    ),
    SuiteCase(
        "padding-mask-cast-host",
        f"{_EC}:PaddingMaskAdd.forward",
        "dtype.cast",
        "aten::",
        f"{_EC}:padding_mask_example",
        f"{_EC}:padding_mask_model",
        _solution(
            "eval-padding-mask-host",
            f"{_EC}:PaddingMaskAdd.forward",
            "dtype.cast",
            """
def forward(self, scores, attention_mask):
    keep = attention_mask.cpu().to(scores.dtype).to(scores.device)
    return scores + (1.0 - keep[:, None, :]) * -10000.0
""",
        ),
        "an int mask cast to float on the device: cast it on the host",
    ),
)


def get(name: str) -> SuiteCase:
    for case in SUITE:
        if case.name == name:
            return case
    raise UsageError(f"no agent-eval case {name!r}; cases: {', '.join(c.name for c in SUITE)}")


def suite_case(
    spec: SuiteCase, *, profile: str | None = None, execution: str = "eager"
) -> FailureCase:
    """Run the case's model on the device without adapters and build the FailureCase from the
    violation it meets (rule and op as the spec says)."""
    import torch

    from hfadapt.spyre.runner import run_on_device

    model, inputs = pkgutil.resolve_name(spec.model)(0)
    # The runner moves inputs as they are: float inputs go in the run's dtype.
    inputs = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
    run = run_on_device(
        model.float().eval(),
        inputs,
        execution=execution,
        dtype=torch.float16,
        profile=profile,
        collect=True,
    )
    found = [
        v
        for v in run.report.violations
        if v.rule_id == spec.rule_id and v.op.startswith(spec.op_prefix)
    ]
    if not found:
        seen = "; ".join(str(v) for v in run.report.violations[:5]) or "none"
        raise UsageError(
            f"agent-eval case {spec.name}: the device did not report {spec.rule_id} on {spec.op_prefix}* (saw: {seen})"
        )
    case = from_violation(
        found[0],
        model={"builder": spec.model},
        execution=execution,
        profile=profile,
        evidence={"suite_case": spec.name, "description": spec.description},
    )
    case.name = spec.name
    case.target = spec.target
    case.example = spec.example
    case.registry = "none"  # the suite measures the agent, not the bundled adapters
    case.match = "rule_op"
    return case
