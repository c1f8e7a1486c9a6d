"""Planning a sweep: which crawled models are judged by a worker, which are recorded without
running (``skipped`` by the prefilter, ``custom_code``), and how the judged ones group into
units of work: one per structural signature in structural mode (the best-ranked model of a
signature is its representative), one per model in full mode. Units are ordered longest
first (estimated cost), so two workers finish together instead of one waiting on a giant."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfadapt import verdicts
from hfadapt.db.tables import HubModel
from hfadapt.errors import HfadaptError
from hfadapt.hub.config_fetch import has_shapes
from hfadapt.hub.ids import invalid_model_id
from hfadapt.judge.evidence import level_of_source
from hfadapt.judge.evidence_types import Evidence
from hfadapt.sweep.narrow import Narrowed, narrowed

__all__ = ["MODEL_KEY", "Plan", "Unit", "plan_sweep"]

MODEL_KEY = "model:"
# A unit's fixed cost (build, probes, device set-up) in multiply-adds per token: about what two
# BERT-small layers cost, so tiny models are not estimated as free.
_OVERHEAD = 5e6


@dataclass
class Unit:
    """Models judged together: the representative runs, the others share its verdict."""

    key: str  # the signature, or "model:<id>"
    signature: str | None
    members: list[str]  # best rank first; members[0] is the representative
    config: dict[str, Any] | None = None  # the crawled config.json, handed to the worker
    cost: float = 1.0  # relative estimate of the work (multiply-adds of the truncated model)
    narrow: Narrowed | None = None  # a cheaper config with the same signature (structural)

    @property
    def representative(self) -> str:
        return self.members[0]


@dataclass
class Plan:
    """Every model of the sweep, exactly once: a direct row or a member of one unit."""

    direct: list[dict[str, Any]] = field(default_factory=list)  # Run columns, no worker needed
    units: list[Unit] = field(default_factory=list)
    model_types: dict[str, str | None] = field(default_factory=dict)
    # where each model's config came from (hfadapt.judge.evidence): structural:crawl, :cache,
    # :bundled, :defaults...; None when no config could be had
    sources: dict[str, str | None] = field(default_factory=dict)
    signing_seconds: float = 0.0
    # Remote-code models judged as their native translation: model id -> evidence.translated_from
    translated: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def models(self) -> int:
        return len(self.direct) + sum(len(u.members) for u in self.units)

    @property
    def judged_models(self) -> int:
        return sum(len(u.members) for u in self.units)


def _direct(
    model: HubModel,
    verdict: str,
    reason: str,
    mode: str,
    source: str | None,
    prefilter: str | None = None,
) -> dict[str, object]:
    level = level_of_source(source)
    evidence: Evidence = {"sweep": {"role": "direct"}, "config_source": source}
    if prefilter is not None:
        evidence["prefilter"] = prefilter
    return {
        "model_id": model.id,
        "verdict": verdict,
        "reason": reason,
        "mode": mode,
        "model_type": model.model_type,
        "evidence_level": level.value if level is not None else None,
        "evidence": evidence,
    }


def _crawled_config(model: HubModel) -> dict[str, object] | None:
    """The model's own config.json as the crawl stored it; None for the listing's summary
    (model_type and architectures only: no shapes, so not this model's config) or a config
    that could not be had."""
    raw = model.config_json
    return raw if isinstance(raw, dict) and raw.get("model_type") and has_shapes(raw) else None


class _Signer:
    """Signatures, cost estimates and narrowed instances, memoized by config: 10,000 models
    have ~100 distinct configs."""

    def __init__(self, layers: int | None, narrow: bool) -> None:
        self.layers = layers
        self.narrow = narrow
        self._memo: dict[str, tuple[str, float, Narrowed | None]] = {}

    def __call__(self, raw: dict[str, object]) -> tuple[str, float, Narrowed | None]:
        blob = json.dumps(raw, sort_keys=True, default=str)
        if blob not in self._memo:
            from hfadapt.loading.structural import structural_signature

            small = narrowed(raw, layers=self.layers or 2) if self.narrow and self.layers else None
            cost = _cost(small.config if small else raw, self.layers)
            self._memo[blob] = (structural_signature(raw), cost, small)
        return self._memo[blob]


def _cost(raw: dict[str, object], layers: int | None) -> float:
    """Multiply-adds per token of the model as judged (truncated to ``layers`` in structural)."""
    from hfadapt.loading.structural import config_from_dict

    try:
        config: Any = config_from_dict(raw)
    except HfadaptError:
        config = raw

    def get(*names: str) -> int | None:
        for name in names:
            value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    hidden = get("hidden_size", "d_model", "dim", "n_embd") or 768
    inter = (
        get("intermediate_size", "hidden_dim", "ffn_dim", "d_ff", "n_inner", "mlp_dim")
        or 4 * hidden
    )
    depth = get("num_hidden_layers", "num_layers", "n_layers", "n_layer") or 12
    if layers is not None:
        depth = min(depth, layers)
    return _OVERHEAD + float(depth * hidden * (4 * hidden + 3 * inter))


def plan_sweep(
    models: list[HubModel], *, mode: str = "structural", dedupe: bool = True, narrow: bool = True
) -> Plan:
    """Group ``models`` (best rank first, prefilter-excluded ones included) into a Plan.
    ``narrow``: judge wide structural signatures on a narrowed instance (hfadapt.sweep.narrow)."""
    import time

    from hfadapt.loading.load import quiet_transformers

    start = time.perf_counter()
    planner = _Planner(mode, dedupe, narrow)
    with quiet_transformers():
        for model in models:
            planner.add(model)
    plan = planner.plan
    plan.units = sorted(planner.units.values(), key=lambda u: -u.cost)  # stable: rank on ties
    plan.signing_seconds = round(time.perf_counter() - start, 3)
    return plan


class _Planner:
    """The plan being built, one crawled model at a time."""

    def __init__(self, mode: str, dedupe: bool, narrow: bool) -> None:
        from hfadapt.loading.structural import STRUCTURAL_LAYERS

        self.plan = Plan()
        self.mode, self.dedupe = mode, dedupe
        structural = mode == "structural"
        self.signer = _Signer(
            STRUCTURAL_LAYERS if structural else None, narrow and structural and dedupe
        )
        self.units: dict[str, Unit] = {}

    def add(self, model: HubModel) -> None:
        plan, mode = self.plan, self.mode
        plan.model_types[model.id] = model.model_type
        crawled = _crawled_config(model)
        if model.excluded_reason:
            # the prefilter read the listing: its model_type, or the crawled config
            listed = "structural:crawl" if crawled else "structural:defaults"
            plan.sources[model.id] = listed
            why = model.excluded_reason
            plan.direct.append(_direct(model, verdicts.SKIPPED, why, mode, listed, prefilter=why))
            return
        bad_id = invalid_model_id(model.id)
        if bad_id:  # stored before crawls refused such ids: recorded, never looked up
            plan.sources[model.id] = None
            reason = f"not a Hub model id: {bad_id}"
            plan.direct.append(_direct(model, verdicts.LOAD_FAILED, reason, mode, None))
            return
        raw, source, error, folder = _config_of(model, crawled)
        plan.sources[model.id] = source
        native = self._native(model, raw, source)
        if native is False:
            return
        judged_as = _heads_judged(folder, model.id)
        if native is not None:
            raw, error, judged_as = native.config, None, judged_as + _judged_as(native)
        self._unit(model, raw, crawled, error, judged_as)

    def _native(self, model: HubModel, raw: dict[str, object] | None, source: str | None) -> Any:
        """For a model that needs its own code: its native translation (``Translation``), or False
        (recorded ``custom_code`` here); None for a model that needs no code of its own."""
        from hfadapt.loading.load import remote_code_reason
        from hfadapt.loading.translate import Translation, translated

        # remote code shows in the listing's summary too (auto_map, the remote config class),
        # even when it holds no shapes to judge
        listing = model.config_json if isinstance(model.config_json, dict) else None
        seen = raw if raw is not None else listing
        why = remote_code_reason(seen, model.id)
        if model.is_custom_code and not why:
            why = "the Hub marks it custom_code"
        if not why:
            return None
        native = translated(model.id, seen)
        if not isinstance(native, Translation):
            reason = f"{model.id} needs its own code: {why}; {native.one_line()}; review it, then: hfadapt diagnose {model.id} --trust-remote-code"
            self.plan.direct.append(_direct(model, verdicts.CUSTOM_CODE, reason, self.mode, source))
            return False
        self.plan.translated[model.id] = native.evidence()
        return native

    def _unit(
        self,
        model: HubModel,
        raw: dict[str, object] | None,
        crawled: dict[str, object] | None,
        error: str | None,
        judged_as: str = "",
    ) -> None:
        """The model joins the unit of its signature (or is judged alone). ``judged_as``: what
        a translation judges besides the config (``_judged_as``); models share a unit only when
        it is the same too."""
        signature: str | None = None
        cost = 1.0
        small: Narrowed | None = None
        if raw is not None:
            try:
                signature, cost, small = self.signer(raw)
            except Exception as exc:  # a config the signature cannot read: judged alone
                error = f"{type(exc).__name__}: {exc}"
        key = signature + judged_as if (signature and self.dedupe) else MODEL_KEY + model.id
        unit = self.units.get(key)
        if unit is None:
            unit = Unit(key, signature, [], crawled, cost if signature else 1.0, small)
            self.units[key] = unit
        unit.members.append(model.id)
        if error and len(unit.members) == 1:
            unit.cost = _OVERHEAD / 5  # fails at the config: cheap


def _judged_as(native: Any) -> str:
    """What a translation judges that its native config does not say: its task adapters (each
    task judged on its own) and the pooling its remote code computes. A translated model never
    shares a unit (and so a verdict) with a plain model of its native type unless both match:
    a plain EuroBERT ranked above jina-embeddings-v5-text-nano would otherwise give the nano a
    verdict judged without its tasks. "" when there is nothing besides the config."""
    extra = {"task_lora": native.task_lora, "pooling": native.pooling}
    return _key_part("+", extra) if any(extra.values()) else ""


def _heads_judged(folder: Path | None, model_id: str) -> str:
    """The heads a model's users run after its transformer, as far as the plan can see them
    (its folder's ``modules.json``, BGE-M3's head files or a repository known to ship them;
    hfadapt.loading.pipeline): a unit's representative is judged with its own heads, so models
    share a unit only when these match too (a BGE-M3 with sparse and ColBERT heads never gives
    its verdict to a plain XLM-R of its config). Pooling and Normalize do not split units. ""
    when there are no such heads."""
    from hfadapt.loading.pipeline import read_pipeline

    pipeline = read_pipeline(folder, model_id)
    heads = [
        {"kind": m.kind, "config": m.config if m.kind == "dense" else {}}
        for m in pipeline.modules
        if m.kind not in ("transformer", "pooling", "normalize")
    ]
    if not heads and not pipeline.multi_vector:
        return ""
    return _key_part("+heads:", [heads, pipeline.multi_vector])


def _key_part(prefix: str, payload: object) -> str:
    """``prefix`` and 8 hex of a stable hash of ``payload``: a suffix of a unit's key."""
    blob = json.dumps(payload, sort_keys=True, default=str)
    return prefix + hashlib.sha256(blob.encode()).hexdigest()[:8]


def _config_of(
    model: HubModel, crawled: dict[str, object] | None
) -> tuple[dict[str, object] | None, str | None, str | None, Path | None]:
    """(the config to plan with, where it came from, why there is none, the folder holding
    the model's files when the plan found one)."""
    from hfadapt.loading.structural import find_config

    if crawled is not None:
        return crawled, "structural:crawl" if crawled else None, None, None
    try:
        raw, where, folder = find_config(model.id)
    except HfadaptError as exc:
        return None, None, exc.one_line(), None
    return raw, f"structural:{where}", None, folder
