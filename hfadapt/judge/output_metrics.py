"""How the outputs users get are judged, each in its own metric (docs/design.md, "Verdicts"):
a sentence embedding by cosine and norm error; a sparse (SPLADE, BGE-M3 lexical) vector by
the overlap of its top-k vocabulary ids, the relative error of its top weights and its cosine;
multi-vector (ColBERT) token vectors by per-token cosine and by the late-interaction (max-sim)
score of every probe pair, as query and document. Device against the CPU fp32 reference."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from hfadapt.judge.metrics import NORM_ERROR_MAX, TOKEN_COSINE_MIN, cosine_rows

__all__ = [
    "MAXSIM_ERROR_MAX",
    "SPARSE_COSINE_MIN",
    "SPARSE_OVERLAP_MIN",
    "SPARSE_TOP_K",
    "SPARSE_WEIGHT_ERROR_MAX",
    "Check",
    "OutputMetrics",
    "judge_outputs",
    "lexical_weights",
]

# A sentence embedding: the token states' own bars (its cosine to the reference, its length).
SENTENCE_COSINE_MIN = TOKEN_COSINE_MIN
SENTENCE_NORM_ERROR_MAX = NORM_ERROR_MAX
# A sparse vector's k heaviest terms decide what it retrieves (SPLADE queries keep ~20-40
# terms, documents ~100-200): the device's top 32 ids must share 90% (29) with the CPU's; three
# may swap with near-ties at the k-th weight (fp16 moves a weight by ~1e-3 relative, a zeroed
# half of the vocabulary leaves ~50%).
SPARSE_TOP_K = 32
SPARSE_OVERLAP_MIN = 0.9
# The reference's top-k weights, relative L2 error: a sparse score is linear in them, so this is
# the score's error bound; the token states may be off by NORM_ERROR_MAX, and log1p(relu(x))
# only shrinks a relative error (d log1p(x) = dx / (1 + x)), so the same budget.
SPARSE_WEIGHT_ERROR_MAX = NORM_ERROR_MAX
SPARSE_COSINE_MIN = TOKEN_COSINE_MIN
# Max-sim is a sum over query tokens of cosines (unit vectors): the per-token cosine's own
# budget (1 - 0.99) as a relative score error. Top-1 agreement over the probe pairs is recorded,
# not judged: twelve probe sentences are not a retrieval corpus.
MAXSIM_ERROR_MAX = 1.0 - TOKEN_COSINE_MIN


@dataclass
class Check:
    """One measured value against its bound."""

    name: str
    value: float | None
    bound: float
    at_least: bool  # True: value >= bound passes; False: value <= bound

    @property
    def passed(self) -> bool:
        if self.value is None:
            return False
        return self.value >= self.bound if self.at_least else self.value <= self.bound

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Check:
        """A check as ``OutputMetrics.to_dict`` writes it (its ``passed`` is recomputed)."""
        value = data.get("value")
        return cls(
            name=str(data["name"]),
            value=None if value is None else float(value),
            bound=float(data["bound"]),
            at_least=bool(data["at_least"]),
        )

    def text(self) -> str:
        shown = "n/a" if self.value is None else f"{self.value:.6f}"
        return f"{self.name} {shown} ({'>=' if self.at_least else '<='} {self.bound:g})"


@dataclass
class OutputMetrics:
    """One output of the pipeline, judged in its metric."""

    output: str  # sentence_embedding, sparse_embedding, token_weights, token_vectors
    metric: str  # "dense cosine", "sparse top-k", "max-sim"
    checks: list[Check] = field(default_factory=list)
    nonfinite: int = 0  # rows (or tokens) of the device output holding NaN or inf
    info: dict[str, Any] = field(default_factory=dict)  # recorded, not judged

    @property
    def passed(self) -> bool:
        return self.nonfinite == 0 and all(c.passed for c in self.checks)

    def failure(self) -> str:
        if self.nonfinite:
            return f"{self.output} holds NaN or inf in {self.nonfinite} row(s) on the device"
        bad = next((c for c in self.checks if not c.passed), None)
        return f"{self.output} ({self.metric}): {bad.text()}" if bad else "passed"

    def summary(self) -> str:
        return f"{self.output} ({self.metric}): " + ", ".join(c.text() for c in self.checks)

    @classmethod
    def from_dict(cls, data: object) -> OutputMetrics:
        """An output judged in another process (``to_dict``'s form, e.g. the sandboxed judge's
        result), checked: TypeError or KeyError on a value out of shape."""
        if not isinstance(data, dict):
            raise TypeError(f"an output's metrics are {type(data).__name__}, not an object")
        checks, info = data.get("checks", []), data.get("info") or {}
        if not isinstance(checks, list) or not all(isinstance(c, dict) for c in checks):
            raise TypeError(
                f"the checks of output {data.get('output')!r} are not a list of objects"
            )
        if not isinstance(info, dict):
            raise TypeError(f"the info of output {data.get('output')!r} is not an object")
        return cls(
            output=str(data["output"]),
            metric=str(data["metric"]),
            checks=[Check.from_dict(c) for c in checks],
            nonfinite=int(data.get("nonfinite", 0)),
            info=dict(info),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "metric": self.metric,
            "checks": [{**vars(c), "passed": c.passed} for c in self.checks],
            "nonfinite": self.nonfinite,
            "info": self.info,
            "passed": self.passed,
        }


def _rows_finite(t: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(t.reshape(t.shape[0], -1)).all(dim=1)


def dense_metrics(reference: torch.Tensor, device: torch.Tensor) -> OutputMetrics:
    """Sentence embeddings [batch, dim]: min cosine and max norm error over the sentences."""
    ref, dev = reference.double(), device.double()
    ok = _rows_finite(dev)
    result = OutputMetrics("sentence_embedding", "dense cosine", nonfinite=int((~ok).sum()))
    cos = cosine_rows(ref[ok], dev[ok]) if bool(ok.any()) else torch.zeros(0)
    norms = ref[ok].norm(dim=-1) ** 2
    along = ((dev[ok] * ref[ok]).sum(dim=-1) / norms.clamp(min=1e-30) - 1).abs()
    result.checks = [
        Check(
            "min sentence cosine",
            float(cos.min()) if cos.numel() else None,
            SENTENCE_COSINE_MIN,
            True,
        ),
        Check(
            "max sentence norm error",
            float(along.max()) if along.numel() else None,
            SENTENCE_NORM_ERROR_MAX,
            False,
        ),
    ]
    return result


def sparse_metrics(reference: torch.Tensor, device: torch.Tensor, output: str) -> OutputMetrics:
    """Sparse vectors [batch, vocab]: top-k id overlap, top-k weight error, cosine (worst row)."""
    ref, dev = reference.double(), device.double()
    ok = _rows_finite(dev)
    result = OutputMetrics(output, "sparse top-k", nonfinite=int((~ok).sum()))
    overlaps, errors, empty = [], [], 0
    for r, d in zip(ref[ok], dev[ok], strict=True):
        k = min(SPARSE_TOP_K, int((r > 0).sum()))
        if k == 0:
            empty += 1
            continue
        top_ref = r.topk(k).indices
        top_dev = d.topk(k).indices
        overlaps.append(len(set(top_ref.tolist()) & set(top_dev.tolist())) / k)
        errors.append(float((d[top_ref] - r[top_ref]).norm() / r[top_ref].norm()))
    cos = cosine_rows(ref[ok], dev[ok]) if bool(ok.any()) else torch.zeros(0)
    result.checks = [
        Check(
            f"min overlap@{SPARSE_TOP_K}",
            min(overlaps) if overlaps else None,
            SPARSE_OVERLAP_MIN,
            True,
        ),
        Check(
            "max top-k weight error",
            max(errors) if errors else None,
            SPARSE_WEIGHT_ERROR_MAX,
            False,
        ),
        Check(
            "min sparse cosine", float(cos.min()) if cos.numel() else None, SPARSE_COSINE_MIN, True
        ),
    ]
    result.info = {
        "mean_nonzero_terms": float((ref > 0).sum(dim=1).double().mean()),
        "empty_reference_rows": empty,
    }
    return result


def _maxsim(
    q: torch.Tensor, q_mask: torch.Tensor, docs: torch.Tensor, d_mask: torch.Tensor
) -> torch.Tensor:
    """ColBERT late interaction of one query [Lq, D] against every document [B, Ld, D], over
    real tokens only: padded positions are dropped on the host (FlagEmbedding, PyLate), so
    whatever the device left there (0/0 = NaN where fp16 normalizes a masked zero vector) is
    selected away, never multiplied by 0."""
    sims = torch.einsum("qd,bld->bql", q[q_mask], docs)
    return sims.masked_fill(~d_mask.unsqueeze(1), float("-inf")).amax(dim=-1).sum(dim=-1)


def multi_vector_metrics(
    reference: torch.Tensor, device: torch.Tensor, mask: torch.Tensor
) -> OutputMetrics:
    """Token vectors [batch, seq, dim] over real tokens: min per-token cosine, and the max-sim
    score of every probe (as query) against every probe (as document), relative error."""
    ref, dev, real = reference.double(), device.double(), mask.bool()
    tok_ok = torch.isfinite(dev[real]).all(dim=-1)
    result = OutputMetrics("token_vectors", "max-sim", nonfinite=int((~tok_ok).sum()))
    cos = cosine_rows(ref[real][tok_ok], dev[real][tok_ok])
    rows = [i for i in range(ref.shape[0]) if bool(real[i].any())]
    errors, agree = [], 0
    if not result.nonfinite and rows:
        idx = torch.tensor(rows)
        for i in rows:
            s_ref = _maxsim(ref[i], real[i], ref[idx], real[idx])
            s_dev = _maxsim(dev[i], real[i], dev[idx], real[idx])
            errors.append(float(((s_dev - s_ref).abs() / s_ref.abs().clamp(min=1e-12)).max()))
            agree += int(int(s_ref.argmax()) == int(s_dev.argmax()))
    result.checks = [
        Check(
            "min token cosine", float(cos.min()) if cos.numel() else None, TOKEN_COSINE_MIN, True
        ),
        # torch's max, not Python's: a NaN error is the worst, never skipped by its position
        Check(
            "max max-sim error",
            float(torch.tensor(errors).max()) if errors else None,
            MAXSIM_ERROR_MAX,
            False,
        ),
    ]
    result.info = {"pairs": len(rows) ** 2, "top1_agreement": f"{agree}/{len(rows)}"}
    return result


def lexical_weights(
    weights: torch.Tensor,
    input_ids: torch.Tensor,
    mask: torch.Tensor,
    special: list[int],
    vocab: int,
) -> torch.Tensor:
    """BGE-M3's lexical vector [batch, vocab] from its token weights [batch, seq]: each id's
    largest weight, pads and special tokens left out (FlagEmbedding's host-side step)."""
    keep = mask.bool().clone()
    for sid in special:
        keep &= input_ids != sid
    w = torch.where(keep, weights.double(), torch.zeros((), dtype=torch.float64))
    out = torch.zeros(weights.shape[0], vocab, dtype=torch.float64)
    return out.scatter_reduce(1, input_ids.long(), w, reduce="amax", include_self=True)


def judge_outputs(
    reference: dict[str, torch.Tensor],
    device: object,
    inputs: dict[str, torch.Tensor],
    mask: torch.Tensor,
    special: list[int],
) -> list[OutputMetrics]:
    """Each output of ``reference`` (the CPU heads' outputs) against the device run's, in its
    metric. An output the device run lacks fails (NaN rows: all of them)."""
    judged = []
    for name, ref in reference.items():
        dev = getattr(device, name, None)
        if dev is None and isinstance(device, dict):
            dev = device.get(name)
        if not isinstance(dev, torch.Tensor) or dev.shape != ref.shape:
            missing = OutputMetrics(name, "absent", nonfinite=int(ref.shape[0]))
            missing.info = {"why": "the device run did not return this output with its shape"}
            judged.append(missing)
            continue
        dev = dev.detach().float().cpu()
        if name == "sentence_embedding":
            judged.append(dense_metrics(ref, dev))
        elif name == "sparse_embedding":
            judged.append(sparse_metrics(ref, dev, name))
        elif name == "token_weights":
            ids = inputs["input_ids"]
            vocab = int(ids.max()) + 1
            judged.append(
                sparse_metrics(
                    lexical_weights(ref, ids, mask, special, vocab),
                    lexical_weights(dev.nan_to_num(nan=float("inf")), ids, mask, special, vocab),
                    name,
                )
            )
        elif name == "token_vectors":
            offset = mask.shape[1] - ref.shape[1]  # BGE-M3 drops the CLS token
            judged.append(multi_vector_metrics(ref, dev, mask[:, offset:]))
    return judged
