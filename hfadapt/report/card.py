"""One model at a glance: its latest recorded run as a plain dict (verdict, evidence level,
where its config came from, adapters applied, violations with their source lines, metrics, the
next step, the environment it ran in), read from runs.db without judging anything again. ``hfadapt show`` prints it. No
torch, no transformers on this path: it answers in well under two seconds."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from hfadapt import verdicts
from hfadapt.db.engine import describe
from hfadapt.errors import NotFoundError, UsageError, did_you_mean
from hfadapt.judge.evidence import describe_source, level_label, pass_note
from hfadapt.judge.margin import read_margin
from hfadapt.report.models import hub_url, judged_model_ids, latest_run
from hfadapt.report.next_steps import plain_next_step

__all__ = ["model_card"]

_METRICS = ("min_token_cosine", "mean_token_cosine", "pooled_cosine", "max_abs_diff")


# Stored rows are read as they are: a value of the wrong type (an old row, a hand-edited or
# hostile database) is shown as absent, never raised on.
def _dict(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _texts(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _dicts(value: object) -> list[dict[str, object]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _violation(v: dict[str, object]) -> dict[str, Any]:
    loc = _dict(v.get("location"))
    site = ""
    if _text(loc.get("file")):
        parts = str(loc["file"]).replace("\\", "/").split("/")
        anchor = next(
            (i for i, p in enumerate(parts) if p in ("site-packages", "dist-packages")), None
        )
        path = "/".join(parts[anchor + 1 :]) if anchor is not None else str(loc["file"])
        line = loc.get("line") if isinstance(loc.get("line"), int) else "?"
        site = f"{path}:{line} in {_text(loc.get('function')) or '?'}"
    return {
        "rule_id": _text(v.get("rule_id")),
        "op": _text(v.get("op")),
        "message": _text(v.get("message")),
        "fingerprint": _text(v.get("fingerprint")),
        "site": site,
        "code": _text(loc.get("code")),
    }


def model_card(engine: Engine, model_id: str) -> dict[str, Any]:
    """The latest run of ``model_id`` as a dict; UsageError naming ``model_id`` when the
    database holds no run of it."""
    if not model_id or not model_id.strip():
        raise UsageError("model_id must name a model, e.g. sentence-transformers/all-MiniLM-L6-v2")
    run, hub = latest_run(engine, model_id.strip())
    if run is None:
        hint = did_you_mean(model_id.strip(), judged_model_ids(engine))
        raise NotFoundError(
            f"no run of {model_id} in {describe(engine)}{hint}: run `hfadapt sweep` or "
            f"`hfadapt diagnose {model_id}` first"
        )
    evidence = _dict(run.evidence)
    sweep_ev = _dict(evidence.get("sweep"))
    source = _text(evidence.get("config_source"))
    level = run.evidence_level
    shared = sweep_ev.get("role") == "member"
    margin = read_margin(evidence.get("margin"))
    return {
        "model_id": run.model_id,
        "run_id": run.id,
        "sweep_id": run.sweep_id,
        "verdict": run.verdict,
        "reason": run.reason or "",
        "evidence_level": level_label(level),
        "pass_means": pass_note(level) if run.verdict == verdicts.PASS else None,
        "config_source": source,
        "config_from": describe_source(source),
        "model_type": run.model_type or (hub.model_type if hub else None),
        "rank": hub.rank if hub else None,
        "downloads": hub.downloads if hub else None,
        "hub_url": hub_url(run.model_id),
        "mode": run.mode,
        "execution": run.execution,
        "dtype": run.dtype,
        "signature": run.signature,
        "shared_with": _text(sweep_ev.get("representative")) if shared else None,
        "representative_run": _int(sweep_ev.get("representative_run")) if shared else None,
        "adapters": _texts(run.adapters),
        # applied adapters whose own rule still fired in the code they rewrite (did nothing)
        "adapters_ineffective": [
            {k: str(v) for k, v in d.items()} for d in _dicts(evidence.get("adapters_ineffective"))
        ],
        "violations": [_violation(v) for v in _dicts(run.violations)],
        "fallbacks": {str(op): n for op, n in _dict(run.fallbacks).items() if isinstance(n, int)},
        "metrics": {k: getattr(run, k) for k in _METRICS if getattr(run, k) is not None},
        # how close the numbers came to their bounds (hfadapt.judge.margin); None for a run
        # recorded before margins or judged before numbers
        "bound_used": margin.share if margin is not None else None,
        "margin": {**margin.to_dict(), "text": margin.text()} if margin is not None else None,
        "next_step": plain_next_step(
            run.model_id,
            run.verdict,
            level,
            recorded=_text(evidence.get("next_step")) or "",
            fingerprints=_texts(run.fingerprints),
            no_adapters=evidence.get("no_adapters") is True,
        ),
        # what the run rested on (hfadapt.judge.environment.KEYS); {} for a row that recorded none
        "versions": {str(k): str(v) for k, v in _dict(run.versions).items()},
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }
