"""How a device run is judged against the CPU reference: per-token cosine of the last hidden
state over real (non-pad) tokens, the per-token norm error (cosine cannot see a row scaled as a
whole), pooled cosine with the model's own sentence-transformers pooling, max abs difference and
NaN/inf flags (docs/design.md, "Verdicts"). A token whose reference row is (near) zero has no
direction: it is judged by its absolute error, never by cosine."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import torch

from hfadapt.loading.pooling import PoolingSpec, pool

# A run passes when every real token's last hidden state keeps at least this cosine to the
# CPU fp32 reference (hf-adapters, vllm-spyre) and nothing is NaN or inf.
TOKEN_COSINE_MIN = 0.99
# Guards the cosine of an all-zero vector (it is 0 against anything, not NaN).
COSINE_EPS = 1e-12
# ... and every real token's row must keep its length along the reference within this relative
# error (| <dev, ref> / <ref, ref> - 1 |: a row scaled by s shows s; an error across the row,
# which cosine measures, hardly shows). Set by what it costs embedding users, not by one model's
# margin (docs/design.md, "What the per-token bounds buy users"): the largest norm error that,
# on every token of a fixed retrieval corpus, costs no more top-5 overlap than a tenth of the
# cosine bound's distance (cosine 0.999) does. Measured (benchmarks/bench_bound.py, the real
# all-MiniLM-L6-v2, 50 draws): 5% keeps 0.97 worst / 0.986 mean against cosine 0.999's 0.96 /
# 0.984; 7% falls to 0.96 / 0.978. The real all-MiniLM-L6-v2 on the simulated card uses a
# quarter of it (1.28% compiled); a reduced-precision statistic that scales a row, which cosine
# cannot see, shows here.
NORM_ERROR_MAX = 0.05
# A reference row whose norm is below this fraction of the median real row's norm counts as
# zero (a fully masked probe row, a padding position the model zeroes): it has no direction.
ZERO_ROW_FRACTION = 1e-4
# ... and its device row passes when its error's norm stays within this fraction of that median.
ZERO_ROW_ERROR_MAX = 0.01


def cosine_rows(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine of matching rows (last dim), in float64 so fp32 rounding cannot fake a drift."""
    a64, b64 = a.double(), b.double()
    dot = (a64 * b64).sum(dim=-1)
    norms = a64.norm(dim=-1) * b64.norm(dim=-1)
    cosine: torch.Tensor = dot / norms.clamp(min=COSINE_EPS)
    return cosine


class OutputJudgement(Protocol):
    """One output of the pipeline judged in its own metric, as ``Metrics`` reads it
    (``hfadapt.judge.output_metrics.OutputMetrics``, which builds on this module)."""

    output: str  # sentence_embedding, sparse_embedding, token_weights, token_vectors
    metric: str

    @property
    def passed(self) -> bool: ...

    def failure(self) -> str: ...

    def summary(self) -> str: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass
class Metrics:
    """The numbers a verdict rests on. Cosines are over tokens whose device output is finite."""

    min_token_cosine: float | None
    mean_token_cosine: float | None
    pooled_cosine: float | None  # the worst sentence
    max_abs_diff: float | None
    has_nan: bool
    has_inf: bool
    tokens: int  # real tokens compared
    nonfinite_tokens: int  # real tokens whose device output holds NaN or inf
    worst_token: tuple[int, int] | None  # (sentence, position) of the min cosine
    pooling: str = "mean"
    threshold: float = TOKEN_COSINE_MIN
    # the largest | <dev, ref> / <ref, ref> - 1 | (the row's length along its reference,
    # relative) over real tokens with a non-zero reference row
    max_norm_error: float | None = None
    worst_norm_token: tuple[int, int] | None = None
    norm_threshold: float = NORM_ERROR_MAX
    # real tokens whose reference row is (near) zero: judged by absolute error, not cosine
    zero_rows: int = 0
    zero_row_error: float | None = None  # the largest error norm / median reference row norm
    zero_row_threshold: float = ZERO_ROW_ERROR_MAX
    # the pipeline's outputs (sentence, sparse, multi-vector), each judged in its metric
    # (hfadapt.judge.output_metrics.OutputMetrics); empty when only token states were judged
    outputs: Sequence[OutputJudgement] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs) and (
            not self.has_nan
            and not self.has_inf
            and (self.min_token_cosine is not None or self.zero_rows > 0)
            and (self.min_token_cosine is None or self.min_token_cosine >= self.threshold)
            and (self.max_norm_error is None or self.max_norm_error <= self.norm_threshold)
            and (self.zero_row_error is None or self.zero_row_error <= self.zero_row_threshold)
        )

    def failure(self) -> str:
        """One line saying which criterion failed, with the measured value."""
        if self.has_nan or self.has_inf:
            kinds = " and ".join(
                k for k, on in (("NaN", self.has_nan), ("inf", self.has_inf)) if on
            )
            return f"device output holds {kinds} in {self.nonfinite_tokens} of {self.tokens} real tokens"
        if self.min_token_cosine is None and not self.zero_rows:
            return "no real tokens to compare"
        if self.min_token_cosine is not None and self.min_token_cosine < self.threshold:
            where = _at(self.worst_token)
            return f"min per-token cosine {self.min_token_cosine:.6f} < {self.threshold}{where}"
        if self.max_norm_error is not None and self.max_norm_error > self.norm_threshold:
            return (
                f"max per-token norm error {self.max_norm_error:.4f} > {self.norm_threshold}"
                f"{_at(self.worst_norm_token)} (the row is scaled; its direction is right)"
            )
        if self.zero_row_error is not None and self.zero_row_error > self.zero_row_threshold:
            return (
                f"{self.zero_rows} real token(s) whose reference row is zero come out non-zero: "
                f"error {self.zero_row_error:.4f} of a typical row's norm > {self.zero_row_threshold}"
            )
        bad = next((o for o in self.outputs if not o.passed), None)
        return bad.failure() if bad is not None else "passed"

    def summary(self) -> str:
        def f(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.6f}"

        zero = f", {self.zero_rows} zero row(s)" if self.zero_rows else ""
        return (
            f"min token cos {f(self.min_token_cosine)}, mean {f(self.mean_token_cosine)}, "
            f"max norm error {f(self.max_norm_error)}, "
            f"pooled {f(self.pooled_cosine)}, max |diff| {f(self.max_abs_diff)}{zero}"
        ) + "".join(f"; {o.summary()}" for o in self.outputs)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["worst_token"] = list(self.worst_token) if self.worst_token else None
        data["worst_norm_token"] = list(self.worst_norm_token) if self.worst_norm_token else None
        data["outputs"] = [o.to_dict() for o in self.outputs]
        data["passed"] = self.passed
        return data


def _at(token: tuple[int, int] | None) -> str:
    return f" at sentence {token[0]}, token {token[1]}" if token else ""


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass
class _Rows:
    """Per-token comparison of finite real rows: cosine (non-zero reference rows only), norm
    error, and the zero-reference rows' absolute error."""

    cosine: torch.Tensor
    norm_error: torch.Tensor
    coords: torch.Tensor  # (sentence, position) of each non-zero row
    zero_rows: int
    zero_error: float | None


def _compare_rows(ref: torch.Tensor, dev: torch.Tensor, coords: torch.Tensor) -> _Rows:
    ref64, dev64 = ref.double(), dev.double()
    ref_norm = ref64.norm(dim=-1)
    typical = float(ref_norm.median()) if ref_norm.numel() else 0.0
    zero = ref_norm <= ZERO_ROW_FRACTION * typical if typical > 0 else ref_norm == 0
    zero_error = None
    if bool(zero.any()):
        err = (dev64[zero] - ref64[zero]).norm(dim=-1).max()
        # judged against a typical row (all rows zero: any non-zero output is an error of 1)
        zero_error = float(err / typical) if typical > 0 else (0.0 if float(err) == 0 else 1.0)
    keep = ~zero
    cos = cosine_rows(ref[keep], dev[keep])
    # the row's length along its reference, relative: <dev, ref> / <ref, ref> - 1. A scaled
    # row shows here whole; an error across the reference (what cosine measures) hardly does
    along = (dev64[keep] * ref64[keep]).sum(dim=-1) / (ref_norm[keep] ** 2)
    norm_error = (along - 1).abs()
    return _Rows(cos, norm_error, coords[keep], int(zero.sum()), zero_error)


def compare(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    attention_mask: torch.Tensor,
    pooling: PoolingSpec | None = None,
    *,
    threshold: float = TOKEN_COSINE_MIN,
) -> Metrics:
    """Judge ``candidate`` (device) against ``reference`` (CPU fp32), both [batch, seq, hidden],
    or both [batch, hidden] for models whose output is one vector per sequence (DPR's encoders
    return only their pooler output): judged as sequences of one token."""
    if reference.dim() == 2 and candidate.dim() == 2 and reference.shape == candidate.shape:
        reference, candidate = reference.unsqueeze(1), candidate.unsqueeze(1)
        attention_mask = torch.ones(reference.shape[:2], dtype=torch.bool)
    if reference.shape != candidate.shape:
        raise ValueError(
            f"shape mismatch: reference {tuple(reference.shape)} vs device {tuple(candidate.shape)}"
        )
    spec = pooling or PoolingSpec()
    ref = reference.detach().float().cpu()
    dev = candidate.detach().float().cpu()
    real = attention_mask.detach().cpu().bool()
    ref_tok, dev_tok = ref[real], dev[real]  # [tokens, hidden]
    has_nan = bool(torch.isnan(dev_tok).any())
    has_inf = bool(torch.isinf(dev_tok).any())
    finite = torch.isfinite(dev_tok).all(dim=-1)
    tokens = int(ref_tok.shape[0])

    min_cos = mean_cos = max_diff = max_norm = None
    worst: tuple[int, int] | None = None
    worst_norm: tuple[int, int] | None = None
    rows = None
    if bool(finite.any()):
        coords = real.nonzero()[finite]  # (sentence, position) of each compared token
        rows = _compare_rows(ref_tok[finite], dev_tok[finite], coords)
        max_diff = float((ref_tok[finite] - dev_tok[finite]).abs().max())
        if rows.cosine.numel():
            min_cos, mean_cos = float(rows.cosine.min()), float(rows.cosine.mean())
            worst = tuple(int(v) for v in rows.coords[int(rows.cosine.argmin())])  # type: ignore[assignment]
            max_norm = float(rows.norm_error.max())
            worst_norm = tuple(int(v) for v in rows.coords[int(rows.norm_error.argmax())])  # type: ignore[assignment]

    pooled_cos = None
    rows_ok = torch.isfinite(dev.masked_fill(~real.unsqueeze(-1), 0.0)).all(dim=(1, 2))
    if bool(rows_ok.any()):
        pr = pool(ref[rows_ok], real[rows_ok], spec)
        pd = pool(dev[rows_ok], real[rows_ok], spec)
        pooled_cos = _finite_or_none(float(cosine_rows(pr, pd).min()))

    return Metrics(
        min_token_cosine=min_cos,
        mean_token_cosine=mean_cos,
        pooled_cosine=pooled_cos,
        max_abs_diff=max_diff,
        has_nan=has_nan,
        has_inf=has_inf,
        tokens=tokens,
        nonfinite_tokens=int((~finite).sum()),
        worst_token=worst,
        pooling=spec.describe(),
        threshold=threshold,
        max_norm_error=max_norm,
        worst_norm_token=worst_norm,
        zero_rows=rows.zero_rows if rows is not None else 0,
        zero_row_error=rows.zero_error if rows is not None else None,
    )


def last_hidden(outputs: Any) -> torch.Tensor:
    """The last hidden state of a transformers output (ModelOutput, tuple or tensor); a model
    that returns one vector per sequence (DPR) gives [batch, 1, hidden]."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    value = getattr(outputs, "last_hidden_state", None)
    if value is None and isinstance(outputs, dict):
        value = outputs.get("last_hidden_state")
    if value is None and (isinstance(outputs, (tuple, list)) or hasattr(outputs, "to_tuple")):
        value = outputs[0]
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"model output {type(outputs).__name__} holds no last hidden state")
    return value.unsqueeze(1) if value.dim() == 2 else value


def token_mask(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The mask of ``hidden``'s real tokens: the attention mask, or all true when the model
    gives one vector per sequence (``last_hidden`` made it [batch, 1, hidden])."""
    if hidden.dim() == 3 and hidden.shape[1] == 1 and attention_mask.shape[1] != 1:
        return torch.ones(hidden.shape[:2], dtype=torch.bool)
    return attention_mask.bool()
