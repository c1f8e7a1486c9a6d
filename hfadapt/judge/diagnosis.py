"""The result of diagnosing one model (``Diagnosis``), the next step it suggests, what is
captured while it runs (phase timings, versions, device warnings), and how it is recorded as
one ``Run`` row in runs.db with the full evidence (docs/design.md, "Evidence")."""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hfadapt import verdicts
from hfadapt.db.tables import Run, utcnow
from hfadapt.judge.adapter_effect import sentence as ineffective_sentence
from hfadapt.judge.evidence import ADAPTABLE, without_adapters_step
from hfadapt.judge.evidence_types import Evidence
from hfadapt.judge.localize import Divergence
from hfadapt.judge.metrics import Metrics
from hfadapt.spyre.rules.lowering_report import LoweringReport

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from hfadapt.loading.load import LoadedModel

__all__ = [
    "Diagnosis",
    "Phases",
    "device_warnings_recorded",
    "next_step",
    "report_of_error",
    "run_row",
    "versions_of",
    "write_run",
]


@dataclass
class Diagnosis:
    """One model judged on the simulated device: the verdict and everything it rests on."""

    model_id: str
    verdict: str
    reason: str
    mode: str  # full | structural
    execution: str  # eager | compile
    dtype: str  # fp16 | bf16
    structural: bool
    metrics: Metrics | None = None
    report: LoweringReport | None = None
    divergence: Divergence | None = None
    adapters: list[str] = field(default_factory=list)
    # the environment: hfadapt.judge.environment.KEYS (packages, profile, numeric path)
    versions: dict[str, str] = field(default_factory=dict)
    profile_name: str | None = None
    profile_version: str | None = None
    revision: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase
    next_step: str = ""
    signature: str | None = None
    signature_fields: dict[str, Any] | None = None
    model_type: str | None = None
    # where the model (or its config) came from, and the evidence level that gives
    # (hfadapt.judge.evidence); None until the model loads
    config_source: str | None = None
    evidence_level: str | None = None
    error: str | None = None  # the error class that decided a load_failed / custom_code verdict
    exit_code: int = 1  # 0 pass, 1 the model fails, 2 bad input
    evidence: Evidence = field(default_factory=lambda: Evidence())
    run_id: int | None = None
    started_at: datetime = field(default_factory=utcnow)
    finished_at: datetime | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == verdicts.PASS

    def set_signature(self, loaded: LoadedModel) -> None:
        from hfadapt.loading.signature import signature_fields, structural_signature

        source = getattr(loaded, "raw_config", None) or loaded.config
        try:
            self.signature = structural_signature(source)
            self.signature_fields = signature_fields(source)
        except Exception as exc:  # a strange config must not cost the verdict
            self.evidence["signature_error"] = f"{type(exc).__name__}: {exc}"

    def finished(self) -> None:
        self.finished_at = utcnow()
        self.timings["total"] = round((self.finished_at - self.started_at).total_seconds(), 4)

    def to_run_row(self) -> Run:
        """This diagnosis as one unsaved ``Run`` row of runs.db (no id, no sweep yet)."""
        return run_row(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what ``hfadapt diagnose --json`` prints."""
        data: dict[str, Any] = _clean(
            {
                "model_id": self.model_id,
                "verdict": self.verdict,
                "reason": self.reason,
                "exit_code": self.exit_code,
                "mode": self.mode,
                "structural": self.structural,
                "execution": self.execution,
                "dtype": self.dtype,
                "model_type": self.model_type,
                "evidence_level": self.evidence_level,
                "config_source": self.config_source,
                "revision": self.revision,
                "signature": self.signature,
                "signature_fields": self.signature_fields,
                "metrics": self.metrics.to_dict() if self.metrics else None,
                "report": self.report.to_dict() if self.report else None,
                "divergence": self.divergence.to_dict() if self.divergence else None,
                "adapters": self.adapters,
                "versions": self.versions,
                "timings": self.timings,
                "next_step": self.next_step,
                "error": self.error,
                "evidence": self.evidence,
                "run_id": self.run_id,
                "started_at": self.started_at.isoformat(),
                "finished_at": self.finished_at.isoformat() if self.finished_at else None,
            }
        )
        return data


def _clean(value: object) -> Any:
    """NaN/inf become None: JSON has no spelling for them, and SQLite would store NULL anyway."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def next_step(diag: Diagnosis) -> str:
    """One sentence: what to do about this verdict."""
    v = diag.verdict
    model = diag.model_id
    broken = diag.evidence.get("adapters_ineffective")
    if broken and v != verdicts.PASS:
        return ineffective_sentence(broken)
    if diag.evidence.get("no_adapters") and v in ADAPTABLE:
        return without_adapters_step(model)
    if v == verdicts.PASS:
        if diag.evidence_level == "architecture":
            return (
                "architecture passes; this model's shapes were not checked: put its config.json in "
                f"the HF cache (or crawl --online) and rerun, or confirm: hfadapt diagnose {model} --mode full"
            )
        if diag.structural:
            return f"the structure lowers and verifies; confirm with real weights: hfadapt diagnose {model} --mode full"
        fallbacks = sum(diag.report.fallbacks.values()) if diag.report else 0
        if fallbacks:
            ops = (
                ", ".join(op for op, _ in diag.report.fallbacks.most_common(3))
                if diag.report
                else ""
            )
            return f"none needed: it runs; {fallbacks} op call(s) fall back to the CPU ({ops}), which an adapter could keep on the device"
        return "none needed: it runs on the device as is"
    if v == verdicts.CUSTOM_CODE:
        return f"review the model repository's code, then rerun: hfadapt diagnose {model} --trust-remote-code"
    if v == verdicts.LOAD_FAILED:
        return "fix the model files named above (or pass another folder / Hub id) and rerun"
    if v == verdicts.REFERENCE_FAILED:
        return "make the CPU reference deterministic (model.eval(), no dropout, no nondeterministic ops), then rerun"
    if v == verdicts.UNSUPPORTED_MODEL:
        return "no adapter can help: the model's shape breaks a device rule that padding cannot fix (see the reason)"
    if v == verdicts.LOWERING_FAILED:
        first = diag.report.violations[0] if diag.report and diag.report.violations else None
        if first is None:
            return "find the op that does not lower (see the reason) and write an adapter for it"
        where = f" at {first.location}" if first.location else ""
        return (
            f"write (or have the agent draft) an adapter for {first.op} [{first.rule_id}]{where}; "
            f"fingerprint {first.fingerprint()}"
        )
    if v == verdicts.VERIFICATION_FAILED:
        m, d = diag.metrics, diag.divergence
        if m is not None and (m.has_nan or m.has_inf) and diag.dtype == "fp16":
            tail = f" (first diverges in {d.display_name})" if d else ""
            return f"fp16 overflows{tail}: rerun with --dtype bf16, or adapt that module to keep fp32 where it overflows"
        if d is not None and d.defects:
            ids = ", ".join(sorted({x["defect_id"] for x in d.defects}))
            return (
                f"look at {d.display_name} ({d.module_class}): the device defect {ids} fires there; "
                "an adapter that avoids its trigger fixes it (docs/device-profile-rules.md, Defects)"
            )
        if d is not None:
            return f"look at {d.display_name} ({d.module_class}): an adapter that keeps its arithmetic in fp32 may fix it"
        fired = [e["defect_id"] for e in diag.evidence.get("defects", [])]
        if fired:
            return f"device defect(s) fired: {', '.join(fired)}; write an adapter that avoids the trigger"
        return f"compare module outputs by hand: the divergence could not be localized in {diag.execution} mode"
    return ""


def run_row(diag: Diagnosis) -> Run:
    """The diagnosis as one unsaved ``Run`` row: every column, the evidence in full."""
    m, report, d = diag.metrics, diag.report, diag.divergence
    evidence = diag.evidence.copy()
    if m is not None:
        evidence.update(
            {
                "tokens": m.tokens,
                "nonfinite_tokens": m.nonfinite_tokens,
                "worst_token": m.worst_token,
                "pooling": m.pooling,
                "threshold": m.threshold,
                "max_norm_error": m.max_norm_error,
                "worst_norm_token": m.worst_norm_token,
                "norm_threshold": m.norm_threshold,
                "zero_rows": m.zero_rows,
                "zero_row_error": m.zero_row_error,
            }
        )
    if report is not None:
        evidence.update(
            {
                "report_summary": report.summary(),
                "downcasts": report.downcasts,
                "graph_count": report.graph_count,
                "ops_seen": len(report.ops_seen),
            }
        )
    evidence.update(
        {
            "next_step": diag.next_step,
            "error": diag.error,
            "exit_code": diag.exit_code,
            "signature_fields": diag.signature_fields,
            "config_source": diag.config_source,
        }
    )
    return Run(
        model_id=diag.model_id,
        verdict=diag.verdict,
        reason=diag.reason,
        mode=diag.mode,
        execution=diag.execution,
        dtype=diag.dtype,
        signature=diag.signature,
        evidence_level=diag.evidence_level,
        model_type=diag.model_type,
        revision=diag.revision,
        min_token_cosine=_clean(m.min_token_cosine) if m else None,
        mean_token_cosine=_clean(m.mean_token_cosine) if m else None,
        pooled_cosine=_clean(m.pooled_cosine) if m else None,
        max_abs_diff=_clean(m.max_abs_diff) if m else None,
        has_nan=m.has_nan if m else None,
        has_inf=m.has_inf if m else None,
        violations=[v.to_dict() for v in report.violations] if report else None,
        fallbacks=dict(report.fallbacks) if report else None,
        adapters=list(diag.adapters),
        fingerprints=report.fingerprints() if report else None,
        divergence=_clean(d.to_dict()) if d else None,
        evidence=_clean(evidence),
        versions=dict(diag.versions),
        profile_version=diag.profile_version,
        timings=dict(diag.timings),
        started_at=diag.started_at,
        finished_at=diag.finished_at,
    )


def write_run(diag: Diagnosis, engine: Engine) -> int | None:
    """Insert the diagnosis as one Run row (``engine`` from ``hfadapt.db.engine.get_engine``)."""
    from hfadapt.db import engine as store

    row = run_row(diag)
    with store.session(engine) as sess:
        sess.add(row)
        sess.flush()
        return row.id


# ---- capturing evidence during a run ------------------------------------------------------


class Phases:
    """Wall time per phase, in seconds."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - start, 4)


def versions_of(profile: object) -> dict[str, str]:
    """What a verdict depends on besides the model: the run's environment
    (hfadapt.judge.environment: hfadapt, the device profile, python, every package that can
    move a verdict, the device's numeric path), the one source every recorded run uses."""
    from hfadapt.judge.environment import environment

    return environment(profile)


@contextlib.contextmanager
def device_warnings_recorded(diag: Diagnosis) -> Iterator[None]:
    """Device warnings go into the evidence, not onto the terminal: per-call fallback / int64
    warnings are dropped (the report counts every one; a BERT forward raises hundreds), others
    (graph breaks in compiled mode...) are kept once each in ``evidence["device_warnings"]``."""
    from hfadapt.spyre.rules.tracking import SpyreDowncastWarning, SpyreFallbackWarning

    counted: tuple[type[Warning], ...] = (SpyreFallbackWarning, SpyreDowncastWarning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield
        finally:
            kept = diag.evidence.setdefault("device_warnings", [])
            for w in caught:
                text = " ".join(str(w.message).split())
                if not issubclass(w.category, counted) and text not in kept:
                    kept.append(text)
            if not kept:
                del diag.evidence["device_warnings"]


def report_of_error(exc: object, diag: Diagnosis) -> LoweringReport:
    """A report for an eager op error that carries only its violations (SpyreOpError)."""
    report = LoweringReport(diag.profile_name or "", diag.profile_version or "", diag.execution)
    for violation in getattr(exc, "violations", ()):
        report.add(violation)
    return report
