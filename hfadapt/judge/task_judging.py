"""Judging a model with task adapters (jina-embeddings-v3's task LoRA, hfadapt.loading.lora)
the way users run it: once per task they can select, with that task's adapters merged into the
weights, each task's device run against that task's own CPU reference. The run records every
task's verdict and numbers (``evidence["tasks"]``); the model's verdict, metrics, report and
localization are the worst task's, and it is judged on the whole pipeline only when every
declared task reached the device."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from hfadapt import verdicts
from hfadapt.errors import HfadaptError
from hfadapt.judge.diagnosis import Diagnosis
from hfadapt.judge.evidence_types import Evidence, TaskEvidence, TaskLoRAEvidence
from hfadapt.judge.margin import Margin, read_margin, widest
from hfadapt.judge.metrics import Metrics
from hfadapt.judge.pipeline_judging import with_tasks
from hfadapt.loading.load import LoadedModel
from hfadapt.loading.lora import TaskLoRA, task_lora_of
from hfadapt.spyre.runner import shared_graphs

__all__ = ["Outcome", "judge_each_task", "task_adapters", "worst"]

Outcome = tuple[str, str, BaseException | None]  # verdict, reason, the error that decided it

# Which task's outcome is the model's: the worst verdict, then the lowest token cosine.
_SEVERITY: dict[str, int] = {
    verdicts.PASS: 0,
    verdicts.VERIFICATION_FAILED: 1,
    verdicts.LOWERING_FAILED: 2,
    verdicts.UNSUPPORTED_MODEL: 3,
    verdicts.REFERENCE_FAILED: 4,
}
# Verdicts decided before the device ran: the task was not judged on the device.
_NOT_ON_DEVICE = (verdicts.REFERENCE_FAILED, verdicts.LOAD_FAILED)
# Verdicts decided by the graph alone: every task runs the same graph (only the weights
# differ), so the tasks after one the device refused are not run again.
_SAME_GRAPH = (verdicts.LOWERING_FAILED, verdicts.UNSUPPORTED_MODEL)


@dataclass
class _TaskRun:
    """One task judged: its outcome, and the diagnosis fields its phases wrote."""

    task: str
    outcome: Outcome
    metrics: Metrics | None
    report: Any
    divergence: Any
    adapters: list[str]
    evidence: Evidence

    def rank(self) -> tuple[int, float]:
        cosine = self.metrics.min_token_cosine if self.metrics is not None else None
        return _SEVERITY.get(self.outcome[0], len(_SEVERITY)), -(
            cosine if cosine is not None else 1.0
        )

    def margin(self) -> Margin | None:
        """This task's margin (its numbers phase recorded it), named for the task."""
        found = read_margin(self.evidence.get("margin"))
        return dataclasses.replace(found, task=self.task) if found is not None else None

    def to_evidence(self) -> TaskEvidence:
        m = self.metrics
        margin = self.margin()
        return {
            "task": self.task,
            "verdict": str(self.outcome[0]),
            "reason": self.outcome[1],
            "min_token_cosine": m.min_token_cosine if m is not None else None,
            "max_norm_error": m.max_norm_error if m is not None else None,
            "pooled_cosine": m.pooled_cosine if m is not None else None,
            "outputs": {o.output: o.passed for o in m.outputs} if m is not None else {},
            "device_seconds": self.evidence.get("device_seconds"),
            "bound_used": margin.share if margin is not None else None,
            "graphs_reused": bool(getattr(self.report, "graphs_reused", False)),
        }


def task_adapters(diag: Diagnosis, loaded: LoadedModel) -> tuple[TaskLoRA | None, Outcome | None]:
    """(the task adapters to judge ``loaded`` with, or None; a verdict when its checkpoint's
    adapters cannot be read). A model that declares tasks but has no adapters to merge says
    why in ``evidence["task_lora_note"]`` (every task then computes the base weights)."""
    try:
        lora, note = task_lora_of(loaded)
    except HfadaptError as exc:
        return None, (verdicts.LOAD_FAILED, exc.one_line(), exc)
    if note:
        diag.evidence["task_lora_note"] = note
    return lora, None


def worst(runs: list[_TaskRun]) -> _TaskRun:
    """The task whose outcome is the model's: the worst verdict, then the lowest cosine."""
    return max(runs, key=_TaskRun.rank)


def judge_each_task(
    diag: Diagnosis,
    loaded: LoadedModel,
    lora: TaskLoRA,
    judge_one: Callable[[LoadedModel], Outcome],
) -> Outcome:
    """Judge ``loaded`` once per task of ``lora`` (``judge_one``: the reference, adapters,
    device and numbers phases on a model), each task's adapters merged into a copy of its
    weights; ``diag`` ends holding the worst task's fields, and every task's in its evidence."""
    runs = _run_tasks(diag, loaded, lora, judge_one)
    chosen = worst(runs)
    diag.metrics, diag.report, diag.divergence = chosen.metrics, chosen.report, chosen.divergence
    diag.adapters, diag.evidence = chosen.adapters, chosen.evidence
    diag.evidence["task_lora"] = cast(TaskLoRAEvidence, lora.describe())
    # the model's margin: its closest task's (none when the model's verdict came before numbers)
    closest = widest(r.margin() for r in runs) if chosen.margin() is not None else None
    if closest is not None:
        diag.evidence["margin"] = closest.to_dict()
    diag.evidence["tasks"] = [r.to_evidence() for r in runs] + [
        _not_run(t, runs[-1].task) for t in lora.spec.tasks[len(runs) :]
    ]
    judged = [r.task for r in runs if r.outcome[0] not in _NOT_ON_DEVICE]
    if "pipeline" in diag.evidence:
        diag.evidence["pipeline"] = with_tasks(diag.evidence["pipeline"], lora.spec.tasks, judged)
    return _model_outcome(chosen, runs, len(lora.spec.tasks))


def _run_tasks(
    diag: Diagnosis,
    loaded: LoadedModel,
    lora: TaskLoRA,
    judge_one: Callable[[LoadedModel], Outcome],
) -> list[_TaskRun]:
    """Each task judged in turn until one's graph is refused. The tasks differ only in their
    weights: a compiled task after the first runs on the graphs compiled for the one before
    where Dynamo's guards accept it (hfadapt.spyre.runner.shared_graphs; its report and the
    task's evidence say ``graphs_reused``)."""
    base = copy.copy(diag.evidence)
    runs: list[_TaskRun] = []
    with shared_graphs():
        for task in lora.spec.tasks:
            diag.evidence = copy.copy(base)
            diag.metrics, diag.report, diag.divergence, diag.adapters = None, None, None, []
            merged = dataclasses.replace(loaded, model=lora.merged(loaded.model, task))
            outcome = judge_one(merged)
            del merged  # one task's weights at a time
            runs.append(_task_run(diag, task, outcome))
            if outcome[0] in _SAME_GRAPH:
                break
    return runs


def _task_run(diag: Diagnosis, task: str, outcome: Outcome) -> _TaskRun:
    """The task's outcome with what its phases left in ``diag``."""
    fields = (diag.metrics, diag.report, diag.divergence, list(diag.adapters), diag.evidence)
    return _TaskRun(task, outcome, *fields)


def _not_run(task: str, refused: str) -> TaskEvidence:
    why = f"not run: the device refused task {refused!r}'s graph, which every task shares"
    return {
        "task": task,
        "verdict": "not run",
        "reason": why,
        "min_token_cosine": None,
        "max_norm_error": None,
        "pooled_cosine": None,
        "outputs": {},
        "device_seconds": None,
    }


def _model_outcome(chosen: _TaskRun, runs: list[_TaskRun], declared: int) -> Outcome:
    """The worst task's outcome, its reason saying which tasks fail (or that every one passes)."""
    verdict, reason, error = chosen.outcome
    failing = [r.task for r in runs if r.outcome[0] != verdicts.PASS]
    if len(runs) < declared:
        return verdict, f"task {chosen.task!r} (the graph every task shares): {reason}", error
    if failing:
        which = f"{len(failing)} of {declared} tasks fail: {', '.join(failing)}"
        return verdict, f"task {chosen.task!r} ({which}): {reason}", error
    return verdict, f"every task of {declared} passes; worst {chosen.task!r}: {reason}", error
