"""The agent-eval suite: failure cases, each with a reference answer (a correct draft, kept as
data in ``eval_references/<case>.txt``) and the distinctive code of that answer, which the
prompt must not contain. ``suite_case`` turns a case into a FailureCase the way a real failure
becomes one: the model runs on the simulated device and the violation it meets gives the
fingerprint, the device's text and the source to show the agent. Nothing of the case's own
description or name reaches the prompt."""

from __future__ import annotations

import copy
import pkgutil
import re
from dataclasses import dataclass
from pathlib import Path

from hfadapt.agent.cases import FailureCase, from_violation
from hfadapt.agent.defect_cases import DEFECT_MATCH
from hfadapt.errors import UsageError

_EC = "hfadapt.agent.evalcases"
REFERENCES = Path(__file__).resolve().parent / "eval_references"


@dataclass(frozen=True)
class SuiteCase:
    name: str
    target: str
    rule_id: str
    op_prefix: str  # the violating ATen op (prefix)
    example: str
    model: str
    description: str  # what the case measures: for --list-cases and people, never the prompt
    # The reference answer's distinctive code, as regular expressions over the text with its
    # whitespace removed: a prompt that matches one states the solution.
    distinctive: tuple[str, ...]
    kind: str = "method"  # what the target is: method | staticmethod | classmethod | function
    execution: str = "eager"  # the execution the case is diagnosed and judged in
    site: str = ""  # the qualified function the violation must be located in ("": any)
    match: str = "rule_op"  # how the device step knows the failure: rule_op | fingerprint
    pending: str = ""  # why the case cannot pass yet; agent-eval prints it and scores nothing
    call_site: str = ""  # kind "function": the method whose call of it the graph replaces
    # A silent device defect (match "defect"): no violation; the registry's adapters apply but
    # these, and the case is built from the defect's firings (hfadapt.agent.defect_cases).
    without: tuple[str, ...] = ()

    @property
    def reference(self) -> str:
        """The reference answer: a complete adapter file, as an agent would answer."""
        path = REFERENCES / f"{self.name}.txt"
        try:
            return path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(
                f"agent-eval case {self.name}: no reference answer {path}: {exc.strerror}"
            ) from exc

    @property
    def solution(self) -> str:
        """The reference answer (the name the drafting tests use)."""
        return self.reference


def _ev(
    name: str, cls: str, rule: str, op: str, fn: str, description: str, *marks: str
) -> SuiteCase:
    """A case on one of evalcases' modules: target ``Class.forward``, example ``fn_example``,
    model ``fn_model``."""
    return SuiteCase(
        name,
        f"{_EC}:{cls}.forward",
        rule,
        op,
        f"{_EC}:{fn}_example",
        f"{_EC}:{fn}_model",
        description,
        marks,
    )


_DEBERTA = "transformers.models.deberta_v2.modeling_deberta_v2"
_ROFORMER = "transformers.models.roformer.modeling_roformer"

SUITE: tuple[SuiteCase, ...] = (
    _ev(
        "masked-fill-keep-mask",
        "MaskedScores",
        "op.unsupported",
        "aten::masked_fill",
        "masked_scores",
        "masked_fill is not a device op: multiply by a keep-mask",
        r"\*keep\+\(1(\.0)?-keep\)",
    ),
    _ev(
        "rotate-half-matmul",
        "RotaryApply",
        "layout.stick_slice",
        "aten::slice",
        "rotary",
        "rotate_half slices the stick dimension at an offset: write it as a matmul",
        r"\[idx\+half,idx\]=-1",
        r"torch\.matmul\(x,r",
    ),
    _ev(
        "causal-mask-host",
        "CausalSoftmax",
        "op.unsupported",
        "aten::masked_fill",
        "causal",
        "a causal mask built with tril + masked_fill: build it on the host, finfo.min/2",
        r"finfo\(scores\.dtype\)\.min/2",
    ),
    _ev(
        "head-dim-padding",
        "SmallHeadAttention",
        "layout.matmul_k",
        "aten::",
        "small_head",
        "head_dim 32 is off the stick: zero-pad Q, K, V to 64 (scale kept); keys off the stick"
        " padded to a whole one and masked (torch-spyre#3113)",
        r"F\.pad\(q,\(0,pad\)\)",
        r"F\.pad\(t,\(0,pad,0,extra\)\)",
        r"out\[\.\.\.,:d\]",
    ),
    _ev(
        "token-type-one-row",
        "TokenTypeAdd",
        "op.unsupported",
        "aten::index",
        "token_type",
        "a one-row token-type table gathered by index: a broadcast add",
        r"\+self\.table\[0\]",
    ),
    _ev(
        "l2-norm-pow-half",
        "L2Normalize",
        "op.pow.square",
        "aten::pow",
        "l2",
        "pow(0.5) for a norm: sqrt",
        r"torch\.sqrt\(\((\w+)\*\1\)\.sum\(",
    ),
    _ev(
        "softsign-pow-reciprocal",
        "Softsign",
        "op.pow.square",
        "aten::pow",
        "softsign",
        "pow(-1): reciprocal",
        r"reciprocal\(1(\.0)?\+\w+\.abs\(\)\)",
    ),
    _ev(
        "padding-mask-cast-host",
        "PaddingMaskAdd",
        "dtype.cast",
        "aten::",
        "padding_mask",
        "an int mask cast to float on the device: cast it on the host",
        r"attention_mask\.cpu\(\)\.to\(",
    ),
    # -- held-out style: what real drafting met and the harness once refused -----------------
    SuiteCase(
        "softsign-corrupted-baseline",
        f"{_EC}:Softsign.forward",
        "op.pow.square",
        "aten::pow",
        f"{_EC}:softsign_example",
        f"{_EC}:corrupted_softsign_model",
        "the model is wrong on the device without any draft (a silent exp defect elsewhere): "
        "a correct draft is judged against that baseline and accepted",
        (r"/\(1(\.0)?\+\w+\.abs\(\)\)",),
    ),
    SuiteCase(
        "deberta-embeddings-mask",
        f"{_DEBERTA}:DebertaV2Embeddings.forward",
        "dtype.cast",
        "aten::_to_copy",
        f"{_EC}:deberta_embeddings_example",
        f"{_EC}:deberta_model",
        "DeBERTa-v2 casts its int64 mask on the device in two `forward`s of one file "
        "(embeddings and attention): the draft fixes the one the prompt shows, told apart by class",
        (r"mask\.cpu\(\)\.to\(embeddings\.dtype\)",),
        site="DebertaV2Embeddings.forward",
        match="fingerprint",
    ),
    SuiteCase(
        "erf-gelu-compiled",
        f"{_EC}:ErfGELU.forward",
        "op.unsupported",
        "aten::erf",
        f"{_EC}:erf_gelu_example",
        f"{_EC}:erf_gelu_model",
        "the exact GELU written with erf: its exact rewrite, the native gelu, runs only "
        "compiled, so the case is judged compiled",
        (r"F\.gelu\(x\)",),
        execution="compile",
    ),
    SuiteCase(
        "roformer-rotary-staticmethod",
        f"{_ROFORMER}:RoFormerSelfAttention.apply_rotary_position_embeddings",
        "layout.stick_slice",
        "aten::slice",
        f"{_EC}:roformer_rotary_example",
        f"{_EC}:roformer_model",
        "RoFormer's rotary embedding is a staticmethod slicing the stick at odd offsets: "
        "constant matmuls, captured with the staticmethod's own arguments",
        (r"r\[2\*j\+1,2\*j\]=-1", r"s\[j,2\*j\]=1"),
        kind="staticmethod",
        site="RoFormerSelfAttention.apply_rotary_position_embeddings",
        match="fingerprint",
    ),
    SuiteCase(
        "masking-utility-function",
        "transformers.masking_utils:create_bidirectional_mask",
        "dtype.cast",
        "aten::_to_copy",
        f"{_EC}:roformer_mask_example",
        f"{_EC}:roformer_model",
        "a failure inside transformers' masking utilities (a module-level function, no class): "
        "the int64 mask cast on the host, the additive mask made on the device",
        (r"fill\[:,None,None,:\]\.expand\(",),
        kind="function",
        site="_preprocess_mask_arguments",
        match="fingerprint",
        call_site=f"{_ROFORMER}:RoFormerModel.forward",
    ),
    SuiteCase(
        "minilm-post-ln-handoff",
        "transformers.models.bert.modeling_bert:BertEmbeddings.forward",
        "defect.post_ln_handoff",
        "aten::",
        f"{_EC}:minilm_embeddings_example",
        f"{_EC}:minilm_like_model",
        "a silent device defect, no error: MiniLM-like BERT without post-ln-handoff-clone; the "
        "embeddings' LayerNorm output, handed to the next compiled graph, is misread there: "
        "read it on the host and send it back (a fresh tensor), judged compiled",
        (r"embeddings\.cpu\(\)\.to\(",),
        execution="compile",
        match="defect",
        without=("post-ln-handoff-clone",),
    ),
    SuiteCase(
        "gelu-new-cube",
        "transformers.activations:NewGELUActivation.forward",
        "op.pow.square",
        "aten::pow",
        f"{_EC}:gelu_example",
        f"{_EC}:gelu_model",
        "gelu_new's pow(x, 3.0): only pow(x, 2) lowers",
        (r"0\.044715\*\((\w+)\*\1\*\1\)",),
    ),
    SuiteCase(
        "rms-norm-fp32-pow",
        "transformers.models.llama.modeling_llama:LlamaRMSNorm.forward",
        "dtype.fp32.ops",
        "aten::pow",
        f"{_EC}:rms_norm_example",
        f"{_EC}:rms_norm_model",
        "RMSNorm's pow(2) on fp32: the variance as a prescaled sum in the model dtype",
        (r"\((\w+)\*\1\)\.sum\(-1,keepdim=True\)",),
    ),
)

# Written ahead of the drafting loop: each names why it cannot pass yet. agent-eval prints the
# reason in its row and scores nothing; ``--case NAME`` runs one anyway, to see how far it gets.
# None is pending now.
PENDING: tuple[SuiteCase, ...] = ()


def get(name: str) -> SuiteCase:
    for case in SUITE + PENDING:
        if case.name == name:
            return case
    known = ", ".join(c.name for c in SUITE + PENDING)
    raise UsageError(f"no agent-eval case {name!r}; cases: {known}")


def solution_in(spec: SuiteCase, text: str) -> str | None:
    """The first piece of ``text`` that states the case's reference solution (a match of one
    of its distinctive patterns, whitespace ignored), with some context; None when none does."""
    flat = re.sub(r"\s+", "", text)
    for pattern in spec.distinctive:
        found = re.search(pattern, flat)
        if found:
            return flat[max(0, found.start() - 40) : found.end() + 40]
    return None


def suite_case(
    spec: SuiteCase, *, profile: str | None = None, execution: str | None = None
) -> FailureCase:
    """Run the case's model on the device without adapters and build the FailureCase from the
    violation it meets (rule, op and, when the case names one, the site as the spec says)."""
    import torch

    from hfadapt.errors import SpyreLoweringError
    from hfadapt.spyre.runner import run_on_device

    run_as = execution or spec.execution
    if spec.match == DEFECT_MATCH:
        return _defect_case(spec, profile=profile, execution=run_as)
    model, inputs = pkgutil.resolve_name(spec.model)(0)
    # The runner moves inputs as they are: float inputs go in the run's dtype.
    inputs = {k: v.half() if v.is_floating_point() else v for k, v in inputs.items()}
    try:
        run = run_on_device(
            model.float().eval(),
            inputs,
            execution=run_as,
            dtype=torch.float16,
            profile=profile,
            collect=True,
        )
        violations = run.report.violations
    except SpyreLoweringError as exc:  # compiled: the graph does not lower; its report says why
        if exc.report is None:
            raise
        violations = exc.report.violations
    found = [
        v
        for v in violations
        if v.rule_id == spec.rule_id
        and v.op.startswith(spec.op_prefix)
        and (not spec.site or (v.location is not None and v.location.qualname == spec.site))
    ]
    if not found:
        seen = "; ".join(str(v) for v in violations[:5]) or "none"
        where = f" in {spec.site}" if spec.site else ""
        raise UsageError(
            f"agent-eval case {spec.name}: the device did not report {spec.rule_id} on "
            f"{spec.op_prefix}*{where} (saw: {seen})"
        )
    case = from_violation(
        found[0], model={"builder": spec.model}, execution=run_as, profile=profile
    )
    case.name = spec.name
    case.target = spec.target
    case.kind = spec.kind
    case.example = spec.example
    case.registry = "none"  # the suite measures the agent, not the bundled adapters
    case.match = spec.match
    case.call_site = spec.call_site or None
    return case


def _defect_case(spec: SuiteCase, *, profile: str | None, execution: str) -> FailureCase:
    """A silent defect's case as ``hfadapt draft`` makes one: the model on the device with the
    registry's adapters but ``spec.without``, the defect's firings from the run's report, the
    case from them (hfadapt.agent.defect_cases), the one whose target the spec names."""
    import torch

    from hfadapt.adapters.registry import Registry, discover
    from hfadapt.agent.defect_cases import defect_cases
    from hfadapt.judge.defect_evidence import defect_evidence
    from hfadapt.spyre.runner import run_on_device

    model, inputs = pkgutil.resolve_name(spec.model)(0)
    model = model.float().eval()
    stock = copy.deepcopy(model)
    registry = Registry(adapters=[a for a in discover().adapters if a.name not in spec.without])
    registry.apply(model)
    run = run_on_device(
        model, inputs, execution=execution, dtype=torch.float16, profile=profile, collect=True
    )
    fired = [f for f in run.report.defects if f.defect_id == spec.rule_id]
    base = {"model": {"builder": spec.model}, "execution": execution, "profile": profile}
    cases = defect_cases({"defects": defect_evidence(run.report)}, stock, base=base)
    found = [c for c in cases if c.rule_id == spec.rule_id and c.target == spec.target]
    if not fired or not found:
        seen = ", ".join(sorted({f"{f.defect_id} in {f.module}" for f in run.report.defects}))
        raise UsageError(
            f"agent-eval case {spec.name}: the device did not fire {spec.rule_id} with "
            f"{spec.target} as its target (fired: {seen or 'none'}; {run.report.summary()})"
        )
    case = found[0]
    case.name = spec.name
    case.example = spec.example
    case.registry = "default"  # the defect shows only where the other adapters let it lower
    case.without_adapters = list(spec.without)
    return case
