"""``hfadapt cycle --webhook URL``: a JSON summary of a cycle's regressions POSTed to a URL (a
Slack or Teams incoming webhook, a chat bot, an alerting gateway). Best effort: the cycle is
recorded before it is sent, and a webhook that fails is one line of warning, never a lost
cycle. Webhook URLs carry their secret in the path or the query, so only the scheme and host
are ever shown."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from hfadapt.errors import UsageError
from hfadapt.service.drafting import ACCEPTED
from hfadapt.untrusted import hide_url_credentials
from hfadapt.version import __version__

if TYPE_CHECKING:
    from hfadapt.service.cycle import CycleResult
    from hfadapt.service.drafting import DraftingResult

__all__ = [
    "TIMEOUT_S",
    "check_webhook",
    "drafting_summary",
    "post_summary",
    "regression_summary",
    "shown_url",
]

TIMEOUT_S = 15.0
REGRESSIONS_SENT = 100  # the most downloaded first; ``regressions`` counts them all
REASON_CHARS = 300


def shown_url(url: str) -> str:
    """What a message may show of a webhook URL: its scheme and host, nothing after."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(a webhook URL)"
    return f"{parts.scheme}://{host}{port}/..."


def check_webhook(url: str) -> str:
    """``url`` when it is an http(s) URL with a host; UsageError otherwise (before any work)."""
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018  # a port that is no number raises here
    except ValueError:
        ok = False
    if not ok:
        raise UsageError(
            f"--webhook takes an http:// or https:// URL with a host (got {shown_url(url)})"
        )
    return url


def drafting_summary(drafted: DraftingResult | None) -> dict[str, object] | None:
    """What a webhook hears of the cycle's drafting (hfadapt.service.drafting.DraftingResult):
    its totals (new fingerprints, drafted, accepted, refused, ..., attempts and tokens spent)
    against the budget, and each accepted adapter by fingerprint, model and folder name (never
    the folder's path on this machine); None when the cycle did not draft."""
    if drafted is None:
        return None
    accepted = [
        {
            "fingerprint": r.fingerprint,
            "model_id": r.model_id,
            "adapter": Path(r.adapter_path).name if r.adapter_path else None,
        }
        for r in drafted.rows
        if r.outcome == ACCEPTED
    ]
    return {
        **drafted.summary(),
        "budget": {"attempts": drafted.budget.attempts, "tokens": drafted.budget.tokens},
        "note": " ".join(str(drafted.note).split())[:REASON_CHARS],
        "accepted_adapters": accepted,
    }


def regression_summary(
    result: CycleResult, database: str, *, limit: int = REGRESSIONS_SENT
) -> dict[str, object]:
    """The JSON a webhook receives for a cycle (hfadapt.service.cycle.CycleResult) that
    regressed: ``text`` (one line, what chat webhooks display), the cycle, its sweep and
    baseline, and the regressions, most downloaded first."""
    comp = result.comparison
    changes = sorted(comp.regressions, key=lambda c: (-c.downloads, c.model_id)) if comp else []
    names = ", ".join(c.model_id for c in changes[:5]) + (", ..." if len(changes) > 5 else "")
    drafting = drafting_summary(result.drafting)
    drafted = (
        f"; drafting: {drafting['accepted']} adapter(s) accepted for "
        f"{drafting['new_fingerprints']} new fingerprint(s)"
        if drafting
        else ""
    )
    return {
        "text": f"hfadapt cycle {result.cycle_id}: {len(changes)} model(s) that passed in cycle "
        f"{result.baseline_cycle} fail now: {names}{drafted}",
        "event": "hfadapt.cycle.regressions",
        "hfadapt": __version__,
        "database": database,
        "cycle": result.cycle_id,
        "sweep": result.sweep.sweep_id,
        "baseline_cycle": result.baseline_cycle,
        "baseline_sweep": comp.baseline_sweep if comp else None,
        "regressions": len(changes),
        "counts": comp.counts if comp else {},
        "environment_changes": comp.environment_changes if comp else [],
        "drafting": drafting,  # None: the cycle did not draft (no --draft)
        "models": [
            {
                "model_id": c.model_id,
                "before": c.before,
                "after": c.after,
                "downloads": c.downloads,
                "reason": " ".join(c.reason.split())[:REASON_CHARS],
            }
            for c in changes[:limit]
        ],
    }


def post_summary(url: str, summary: dict[str, object], *, timeout: float = TIMEOUT_S) -> str | None:
    """POST ``summary`` as JSON to ``url``; None when it answered 2xx, else the one-line
    warning to print (the URL shown as scheme and host only)."""
    body = json.dumps(summary, default=str).encode()
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Content-Type": "application/json", "User-Agent": f"hfadapt/{__version__}"},
    )
    try:
        with urllib.request.urlopen(
            request, timeout=timeout
        ) as answer:  # http(s) only: check_webhook
            status = answer.status
    except urllib.error.HTTPError as exc:
        why = f"it answered HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        why = f"it could not be reached ({type(reason).__name__}: {reason})"
    else:
        if 200 <= status < 300:
            return None
        why = f"it answered HTTP {status}"
    why = hide_url_credentials(" ".join(why.replace(url, shown_url(url)).split()))[:300]
    return (
        f"warning: the webhook at {shown_url(url)} was not notified: {why}; the cycle is "
        "recorded and its exit code stands"
    )
