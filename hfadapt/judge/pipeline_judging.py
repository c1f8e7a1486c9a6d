"""Judging what users get: the model's sentence-transformers module list read and built when it
loads (:mod:`hfadapt.loading.heads`), attached to the device copy so the device runs the whole
pipeline, its outputs judged against the CPU's in their own metrics
(:mod:`hfadapt.judge.output_metrics`), and the run's evidence saying what was judged
(``evidence["pipeline"]``: the modules run on the device, those left out and why, the metric
that decided each output, and ``whole``: judged on the whole pipeline)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from hfadapt.judge.evidence_types import PipelineEvidence
from hfadapt.judge.metrics import OutputJudgement
from hfadapt.judge.output_metrics import OutputMetrics, judge_outputs
from hfadapt.loading.heads import HEADS_MASK, BuiltHeads, attach, build_heads
from hfadapt.loading.load import LoadedModel
from hfadapt.loading.pipeline import read_pipeline
from hfadapt.loading.probes import SPECIAL_ID_FIELDS

__all__ = [
    "attach_heads",
    "evidence_of",
    "heads_for",
    "judge_heads",
    "pipeline_inputs",
    "with_heads",
    "with_tasks",
]

TOKEN_METRIC = "per-token cosine + norm error"
_NO_LIST = (
    "the model declares no sentence-transformers module list (modules.json): its token states "
    "are judged, and mean pooling is assumed on the host"
)


def heads_for(loaded: LoadedModel, seed: int = 0) -> BuiltHeads:
    """The built heads of ``loaded``, as its folder's module list declares them."""
    pipeline = read_pipeline(loaded.path, loaded.model_id)
    try:
        return build_heads(loaded, pipeline, seed=seed)
    except Exception as exc:  # a head transformers cannot build: said, never a lost verdict
        why = f"the heads could not be built: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return BuiltHeads(pipeline, None, left_out=[{"module": "heads", "why": why}])


def evidence_of(
    built: BuiltHeads, outputs: Sequence[OutputJudgement] | None = None
) -> PipelineEvidence:
    """What the run judged: ``evidence["pipeline"]``."""
    pipeline = built.pipeline
    left_out = list(built.left_out)
    if not pipeline.declared:
        left_out.append({"module": "modules.json", "why": _NO_LIST})
    transformer = [
        m.label() for m in pipeline.modules if m.kind in ("transformer", "mlm_transformer")
    ]
    decided: dict[str, str] = {"token_states": TOKEN_METRIC}
    for name in built.outputs():
        decided[name] = next((o.metric for o in outputs or [] if o.output == name), "not reached")
    return {
        "source": pipeline.source,
        "modules": [m.label() for m in pipeline.modules],
        "on_device": (transformer or ["Transformer"]) + built.built,
        "left_out": left_out,
        "weights": built.weights,
        "decided_by": decided,
        "whole": pipeline.declared and not left_out,
    }


def with_tasks(
    pipeline: PipelineEvidence, declared: Sequence[str], judged: Sequence[str]
) -> PipelineEvidence:
    """``pipeline`` of a model with task adapters (jina v3): the tasks it declares and those
    judged on the device; judged on the whole pipeline only when every task was."""
    every = bool(declared) and set(judged) >= set(declared)
    tasks = {"declared": list(declared), "judged": list(judged)}
    return {**pipeline, "tasks": tasks, "whole": pipeline["whole"] and every}


def attach_heads(model: torch.nn.Module, built: BuiltHeads | None) -> torch.nn.Module:
    """``model`` (a device or replay copy) with a copy of the heads attached, when there are any."""
    if built is not None and built.heads is not None:
        attach(model, copy.deepcopy(built.heads))
    return model


def with_heads(model: torch.nn.Module, built: BuiltHeads | None) -> torch.nn.Module:
    """A copy of the CPU model with the heads attached (the model itself when there are none):
    what localizing replays, so a fault in a head is found in the head."""
    if built is None or built.heads is None:
        return model
    return attach_heads(copy.deepcopy(model), built)


def pipeline_inputs(
    inputs: dict[str, torch.Tensor], built: BuiltHeads | None, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """The inputs of an attached model: the model's own, and the heads' mask in ``dtype``
    made here, on the host (HEADS_MASK); the inputs as they are when no heads are attached."""
    mask = inputs.get("attention_mask")
    if built is None or built.heads is None or mask is None:
        return inputs
    return {**inputs, HEADS_MASK: mask.to(dtype)}


def _special_ids(loaded: LoadedModel) -> list[int]:
    ids = set(getattr(loaded.tokenizer, "all_special_ids", None) or [])
    for name in SPECIAL_ID_FIELDS:
        value = getattr(loaded.config, name, None)
        ids.update(v for v in (value if isinstance(value, list) else [value]) if isinstance(v, int))
    return sorted(ids)


def judge_heads(
    built: BuiltHeads | None,
    loaded: LoadedModel,
    reference: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    device_outputs: object,
) -> list[OutputMetrics]:
    """The heads run on the CPU in fp32 from the reference token states, against the device's."""
    if built is None or built.heads is None or reference.dim() != 3:
        return []
    mask = inputs.get("attention_mask")
    if mask is None:
        mask = torch.ones(reference.shape[:2], dtype=torch.long)
    with torch.inference_mode():
        cpu = built.heads(reference.float(), mask)
    expected = {k: v.detach().float() for k, v in cpu.items()}
    return judge_outputs(expected, device_outputs, inputs, mask, _special_ids(loaded))
