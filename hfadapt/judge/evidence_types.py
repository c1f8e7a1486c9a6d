"""The shape of a run's evidence (``Diagnosis.evidence``, stored as ``Run.evidence`` in
runs.db): one TypedDict per section, named for the phase or part that writes it, and
``Evidence``, every section in one mapping, so mypy checks each key where evidence is written
and read. The stored JSON is plain dicts of these keys; a row written before a key existed
lacks it, so every key is optional. ``tests/package/test_evidence_keys.py`` fails on a key the
package writes that is not declared here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NotRequired, TypedDict, cast

__all__ = [
    "AdapterEvidence",
    "BoundUseEvidence",
    "CachesEvidence",
    "DefectEntry",
    "DefectFiring",
    "DeviceEvidence",
    "DtypePolicy",
    "Evidence",
    "LoadEvidence",
    "LocalizeEvidence",
    "MarginEvidence",
    "MetricsEvidence",
    "NarrowedEvidence",
    "OutcomeEvidence",
    "PipelineEvidence",
    "ReferenceEvidence",
    "ReportEvidence",
    "SandboxEvidence",
    "SandboxSection",
    "SweepEvidence",
    "SweepSection",
    "TaskEvidence",
    "TaskLoRAEvidence",
    "WorkerFailureEvidence",
    "read_evidence",
]


# ---- values of the sections' keys ----------------------------------------------------------


class CachesEvidence(TypedDict, total=False):
    """What the reference and compile caches gave the run (hfadapt.judge.phases.judge)."""

    reference: str  # off | unkeyed | hit:<key> | miss:<key>
    compile: dict[str, Any] | str  # "off", or {"hits", "misses", "stored", "unkeyed", "rejected"}
    skipped: bool  # --no-cache: neither cache read nor written


class PipelineEvidence(TypedDict):
    """What the run judged of the sentence-transformers pipeline (pipeline_judging.evidence_of)."""

    source: str  # "modules.json", or "none"
    modules: list[str]
    on_device: list[str]
    left_out: list[dict[str, str]]  # {"module", "why"}
    weights: str
    decided_by: dict[str, str]  # output -> the metric that decided it
    whole: bool
    # a model with task adapters (jina v3): the tasks it declares and those judged on the
    # device; ``whole`` needs every one (pipeline_judging.with_tasks)
    tasks: NotRequired[dict[str, list[str]]]


class TaskLoRAEvidence(TypedDict):
    """The task adapters a model was judged with (hfadapt.loading.lora.TaskLoRA.describe)."""

    tasks: list[str]
    rank: int
    alpha: float
    scaling: float
    modules: int  # native weights adapted
    origin: str  # "checkpoint (...)" | "stand-ins (seed S, ...)"
    applied: str  # how: merged into the weights, one task per run


class BoundUseEvidence(TypedDict):
    """One bounded metric's worst value against its bound (hfadapt.judge.margin.BoundUse)."""

    metric: str  # "min token cosine", "sentence_embedding: max sentence norm error"
    value: float
    bound: float
    at_least: bool  # True: value >= bound passes; False: value <= bound
    share: float  # of the bound used: (1 - value) / (1 - bound), or value / bound
    headroom: float  # value - bound, or bound - value (negative: past the bound)


class MarginEvidence(TypedDict):
    """How close the run came to its bounds (hfadapt.judge.margin.Margin)."""

    share: float | None  # the largest share of a bound used; None: NaN/inf, nothing measured
    worst: str | None  # the metric that used it
    nonfinite: bool
    metrics: list[BoundUseEvidence]
    unmeasured: list[str]
    task: NotRequired[str]  # a model with task adapters: the task it is of (the widest)


class TaskEvidence(TypedDict):
    """One task's run of a model with task adapters (hfadapt.judge.task_judging)."""

    task: str
    verdict: str
    reason: str
    min_token_cosine: float | None
    max_norm_error: float | None
    pooled_cosine: float | None
    outputs: dict[str, bool]  # pipeline output -> passed in its own metric
    device_seconds: float | None
    bound_used: NotRequired[float | None]  # the task's margin share (MarginEvidence.share)
    graphs_reused: NotRequired[bool]  # ran on the previous task's graphs (LoweringReport)


class DtypePolicy(TypedDict, total=False):
    """The device dtype and the profile rule that chose it (Profile.family_dtype)."""

    rule: str
    dtype: str
    family: str | None
    source: str
    note: str
    overridden: bool  # the dtype asked for is not the family's


class DefectFiring(TypedDict):
    """One firing of a device defect: where, on which op and tensor."""

    module: str
    module_class: str
    op: str
    node: str
    shape: list[int]
    stride: list[int]
    dtype: str
    location: str | None


class DefectEntry(TypedDict):
    """One device defect that fired, with every firing (defect_evidence.defect_evidence)."""

    defect_id: str
    source: str
    effect: str
    firings: list[DefectFiring]


class SandboxEvidence(TypedDict, total=False):
    """How the sandboxed judge's process ended (hfadapt.judge.sandboxed)."""

    isolated: bool
    exit_code: int | None
    seconds: float
    stderr_tail: str  # only when it left no result


class SweepEvidence(TypedDict, total=False):
    """A sweep row's place in its sweep: direct, a unit's representative, or a member."""

    role: str  # direct | representative | member
    judged_in: str  # "sandbox": judged with its own code (sweep --trust-remote-code)
    representative: str
    representative_run: int
    unit: str
    models: int
    planned_signature: str | None  # the plan's, when the run computed another
    worker_pid: int | None
    worker_host: str | None
    worker_node: str | None
    seconds: float
    worker_peak_rss_mb: float | None


class NarrowedEvidence(TypedDict, total=False):
    """A unit first judged on a narrowed config (hfadapt.sweep.narrow), and what that gave."""

    changes: dict[str, Any] | None  # field -> (real, narrowed)
    verdict: str
    reason: str
    confirmed_at_full_width: bool


# ---- the sections: top-level keys, by who writes them ---------------------------------------


class LoadEvidence(TypedDict, total=False):
    """The load and probes phases: what was loaded, from where, and how it runs."""

    source: str | None  # the config source (hfadapt.judge.evidence)
    notes: list[str]
    pooling: str  # the pooling described at load; the recorded row holds Metrics.pooling
    path: str
    translated_from: dict[str, Any]  # a remote-code model judged as its native translation
    signature_error: str
    dtype_policy: DtypePolicy
    probes: str
    pipeline: PipelineEvidence
    task_lora: TaskLoRAEvidence  # the task adapters judged, one task per run
    tasks: list[TaskEvidence]  # each task's verdict and numbers; the model's is the worst's
    task_lora_note: str  # why a model declaring task adapters was judged without them


class ReferenceEvidence(TypedDict, total=False):
    """The reference phase, and the caches the run used."""

    reference: str
    caches: CachesEvidence


class AdapterEvidence(TypedDict, total=False):
    """The adapters phase: left out, failed to load, applied without effect."""

    without_adapters: list[str]
    no_adapters: bool  # judged without the registry's adapters (--no-adapters)
    adapter_errors: list[str]
    adapters_ineffective: list[dict[str, str]]  # adapter_effect.Ineffective.to_dict()
    adapters_ineffective_error: str


class DeviceEvidence(TypedDict, total=False):
    """The device phase: the rule that refused the model, defects that fired, warnings, time."""

    rule_id: str | None
    defects: list[DefectEntry]
    device_seconds: float
    device_warnings: list[str]


class LocalizeEvidence(TypedDict, total=False):
    """Localizing a numeric failure to its first divergent module."""

    localize_execution: str
    localize_error: str


class SandboxSection(TypedDict, total=False):
    sandbox: SandboxEvidence


class MetricsEvidence(TypedDict, total=False):
    """The Metrics a row records beyond its columns (diagnosis.run_row)."""

    tokens: int
    nonfinite_tokens: int
    worst_token: Sequence[int] | None  # (sentence, position); a list once stored
    threshold: float
    max_norm_error: float | None
    worst_norm_token: Sequence[int] | None
    norm_threshold: float
    zero_rows: int
    zero_row_error: float | None
    margin: MarginEvidence  # how close it came to its bounds (hfadapt.judge.margin)


class ReportEvidence(TypedDict, total=False):
    """The lowering report a row records beyond its columns (diagnosis.run_row)."""

    report_summary: str
    downcasts: int
    graph_count: int
    ops_seen: int


class OutcomeEvidence(TypedDict, total=False):
    """The diagnosis fields a row records beyond its columns (diagnosis.run_row)."""

    next_step: str
    error: str | None  # the error class that decided the verdict (also a failed sweep unit's)
    exit_code: int
    signature_fields: dict[str, Any] | None
    config_source: str | None


class SweepSection(TypedDict, total=False):
    """What a sweep adds to a row (hfadapt.sweep): its place, narrowing, the prefilter."""

    sweep: SweepEvidence
    narrowed: NarrowedEvidence
    prefilter: str  # why the prefilter skipped the model


class WorkerFailureEvidence(TypedDict, total=False):
    """A sweep unit whose worker died, hung, raised or ran out of memory (sweep.worker.crashed)."""

    error: str | None  # the error class of a unit that did not load
    exit: str  # how the worker process ended
    timeout_s: float | None
    traceback: str
    out_of_memory: bool
    memory_limit_mb: int | None
    allocator: str  # the allocator's own words
    judged_as: str  # the verdict the judge gave before it was seen to be out of memory


class Evidence(
    LoadEvidence,
    ReferenceEvidence,
    AdapterEvidence,
    DeviceEvidence,
    LocalizeEvidence,
    SandboxSection,
    MetricsEvidence,
    ReportEvidence,
    OutcomeEvidence,
    SweepSection,
    WorkerFailureEvidence,
    total=False,
):
    """A run's evidence: every section's keys in one mapping."""


def read_evidence(value: object) -> Evidence:
    """A stored or received evidence value as ``Evidence`` (a copy): ``{}`` for None (rows
    written before evidence) or anything that is not a JSON object."""
    return cast(Evidence, dict(value)) if isinstance(value, dict) else {}
