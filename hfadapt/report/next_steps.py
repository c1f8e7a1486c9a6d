"""What to do about a recorded verdict, in one plain sentence: the step the run recorded
(``hfadapt diagnose`` writes one, :func:`hfadapt.judge.diagnosis.next_step`), else one for its
verdict. ``hfadapt show`` prints it and the report's "what it means" column shows it for every
failing model. No torch on this path."""

from __future__ import annotations

from collections.abc import Sequence

from hfadapt import verdicts
from hfadapt.judge.evidence import ADAPTABLE, without_adapters_step

__all__ = ["plain_next_step"]


def _by_verdict(model_id: str, verdict: str, fingerprints: Sequence[str]) -> str:
    diagnose = f"hfadapt diagnose {model_id}"
    if verdict == verdicts.CUSTOM_CODE:
        return f"review the repository's code, then: {diagnose} --trust-remote-code"
    if verdict == verdicts.SKIPPED:
        return "none: the prefilter excluded it (not a text embedding model hfadapt judges)"
    if verdict == verdicts.LOWERING_FAILED and fingerprints:
        return f"draft an adapter for what blocks it: hfadapt draft --fingerprint {fingerprints[0]}"
    if verdict == verdicts.LOWERING_FAILED:
        return f"find the op that does not lower: {diagnose} --mode structural"
    if verdict == verdicts.VERIFICATION_FAILED:
        return f"find the first module that diverges: {diagnose}"
    if verdict == verdicts.LOAD_FAILED:
        return f"fix the model files (or name another folder or Hub id), then: {diagnose}"
    if verdict == verdicts.REFERENCE_FAILED:
        return (
            "make the CPU reference deterministic (no dropout, no nondeterministic ops), then rerun"
        )
    if verdict == verdicts.UNSUPPORTED_MODEL:
        return "none an adapter can do: its shape breaks a device rule padding cannot fix"
    if verdict in (verdicts.WORKER_CRASHED, verdicts.WORKER_TIMEOUT):
        return f"judge it alone to see why its worker stopped: {diagnose}"
    return f"see the full evidence: {diagnose} --mode structural"


def plain_next_step(
    model_id: str,
    verdict: str,
    level: str | None,
    *,
    recorded: str = "",
    fingerprints: Sequence[str] = (),
    no_adapters: bool = False,
) -> str:
    """The next step for one model's latest run: run it with the adapters first when it was
    judged without them (``no_adapters``) and an adapter could fix it; else the run's own
    (``recorded``); else one for its verdict and evidence level."""
    if no_adapters and verdict in ADAPTABLE:
        return without_adapters_step(model_id)
    if recorded:
        return recorded
    if verdict == verdicts.PASS and level == "architecture":
        return (
            "architecture passes; this model's shapes were not checked: put its config.json in "
            f"the HF cache (or crawl --online) and sweep again, or: hfadapt diagnose {model_id} --mode full"
        )
    if verdict == verdicts.PASS:
        return f"confirm with real weights: hfadapt diagnose {model_id} --mode full"
    return _by_verdict(model_id, verdict, fingerprints)
