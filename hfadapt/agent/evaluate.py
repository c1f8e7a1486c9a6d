"""``hfadapt agent-eval``: run the suite against an endpoint and measure skill per case
(accepted, attempts used, tokens, a score) so endpoints and models can be compared. With
``reference=True`` each case's reference answer goes through the same pipeline instead (no
endpoint): per case, accepted or not, the step that refused, and the proof's numbers.

Every row also says whether the prompt as sent stated the case's solution, and a case whose
target kind the drafting loop cannot handle yet is reported as pending, with the reason."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from hfadapt.agent.client import AgentClient, AgentSettings, Completion
from hfadapt.agent.loop import DraftOutcome, draft_adapter
from hfadapt.agent.options import DraftOptions
from hfadapt.agent.records import Recorder
from hfadapt.agent.sandbox import SandboxLimits
from hfadapt.agent.suite import PENDING, SUITE, SuiteCase, get, solution_in, suite_case

PENDING_OUTCOME = "pending"


class ReferenceClient(AgentClient):
    """Answers with a case's reference answer (no endpoint involved)."""

    def __init__(self, solution: str, settings: AgentSettings) -> None:
        self.settings = settings
        self.solution = solution

    def complete(self, messages: list[dict[str, str]]) -> Completion:
        text = f"```python\n{self.solution}```\n"
        return Completion(
            text, sum(len(m["content"]) for m in messages) // 4, len(text) // 4, 0.0, "reference"
        )


class PromptWatch(AgentClient):
    """Passes requests to ``inner`` and keeps the first one's messages: the prompt as sent."""

    def __init__(self, inner: AgentClient) -> None:
        self.settings = inner.settings
        self.inner = inner
        self.first: list[dict[str, str]] | None = None

    def complete(self, messages: list[dict[str, str]]) -> Completion:
        if self.first is None:
            self.first = [dict(m) for m in messages]
        return self.inner.complete(messages)

    def prompt_text(self) -> str:
        return "\n".join(m["content"] for m in self.first or [])


def score(outcome: str, attempts: int, max_attempts: int) -> float:
    """A case's skill score: 0 unless accepted; 1 when the first draft was accepted, less by
    1/max_attempts for every further attempt it took."""
    if outcome != "accepted" or attempts < 1:
        return 0.0
    return round(max(0.0, (max_attempts - attempts + 1) / max_attempts), 4)


def proof_numbers(outcome: DraftOutcome) -> dict[str, float | None]:
    """The last attempt's measured numbers, step by step (None where a step did not run)."""
    last = next((a.validation for a in reversed(outcome.attempts) if a.validation), None)
    outputs = {s.step: s.output for s in last.steps} if last is not None else {}
    equivalence = outputs.get("equivalence", {})
    module = outputs.get("device", {}).get("module", {})
    e2e = outputs.get("end_to_end", {})
    return {
        "equivalence_max_rel_err": equivalence.get("max_rel_err"),
        "module_min_cosine": module.get("min_cosine"),
        "module_rel_err": module.get("relative_error"),
        "cpu_min_token_cosine": e2e.get("cpu_vs_stock_min_token_cosine"),
        "device_min_token_cosine": e2e.get("device_vs_cpu_min_token_cosine"),
        "device_rel_err": e2e.get("device_relative_error"),
        "baseline_min_token_cosine": e2e.get("baseline_device_vs_cpu_min_token_cosine"),
        "baseline_rel_err": e2e.get("baseline_device_relative_error"),
    }


@dataclass
class EvalReport:
    endpoint: str
    model: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def scored(self) -> list[dict[str, Any]]:
        """The rows that count: every case that ran and is not pending."""
        return [r for r in self.rows if not r.get("pending")]

    @property
    def accepted(self) -> int:
        return sum(1 for r in self.scored if r["outcome"] == "accepted")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / len(self.scored) if self.scored else 0.0

    def to_dict(self) -> dict[str, Any]:
        rows = self.scored
        return {
            "endpoint": self.endpoint,
            "model": self.model,
            "cases": self.rows,
            "accepted": self.accepted,
            "total": len(rows),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "score": round(sum(r["score"] for r in rows) / len(rows), 4) if rows else 0.0,
            "pending": [r["case"] for r in self.rows if r.get("pending")],
            "solution_in_prompt": [r["case"] for r in self.rows if r.get("solution_in_prompt")],
            "attempts": sum(r["attempts"] for r in rows),
            "tokens_in": sum(r["tokens_in"] for r in rows),
            "tokens_out": sum(r["tokens_out"] for r in rows),
            "seconds": round(self.seconds, 3),
        }


def _bare_row(spec: SuiteCase, outcome: str, reason: str, seconds: float) -> dict[str, object]:
    """A row for a case no draft was judged on (pending, or the case itself failed)."""
    return {
        "case": spec.name,
        "fingerprint": None,
        "execution": spec.execution,
        "outcome": outcome,
        "reason": reason,
        "pending": spec.pending or None,
        "attempts": 0,
        "tokens_in": 0,
        "tokens_out": 0,
        "score": 0.0,
        "refused_at": None,
        "numbers": {},
        "solution_in_prompt": None,
        "seconds": round(seconds, 3),
        "adapter_path": None,
        "session_id": None,
        "steps": [],
    }


def _row(
    spec: SuiteCase, outcome: DraftOutcome, watch: PromptWatch, seconds: float
) -> dict[str, object]:
    row = outcome.to_dict()
    last = outcome.attempts[-1] if outcome.attempts else None
    row.update(
        case=spec.name,
        pending=spec.pending or None,
        score=score(outcome.outcome, len(outcome.attempts), watch.settings.max_attempts),
        refused_at=None if outcome.accepted or last is None else last.failed_step,
        numbers=proof_numbers(outcome),
        solution_in_prompt=solution_in(spec, watch.prompt_text()),
        seconds=round(seconds, 3),
    )
    return row


def run_eval(
    settings: AgentSettings,
    *,
    names: Iterable[str] = (),
    reference: bool = False,
    recorder: Recorder | None = None,
    limits: SandboxLimits | None = None,
    profile: str | None = None,
    client: AgentClient | None = None,
) -> EvalReport:
    """Every suite case (or the named ones), one drafting session each; nothing is installed.
    A pending case is run only when named; otherwise its row gives the reason. A reference
    answers once: the answer it gives is its only one."""
    named = [get(n) for n in names]
    specs: list[SuiteCase] = named or [*SUITE, *PENDING]
    if reference:
        settings = replace(settings, max_attempts=1)
    report = EvalReport(settings.endpoint if not reference else "reference", settings.model)
    start = time.monotonic()
    shared = client or (None if reference else AgentClient(settings))
    for spec in specs:
        case_start = time.monotonic()
        if spec.pending and not named:
            report.rows.append(_bare_row(spec, PENDING_OUTCOME, spec.pending, 0.0))
            continue
        try:
            case = suite_case(spec, profile=profile)
        except Exception as exc:  # one broken case is a row, not the end of the evaluation
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            report.rows.append(_bare_row(spec, "case_error", reason, time.monotonic() - case_start))
            continue
        agent = ReferenceClient(spec.reference, settings) if reference else shared
        assert agent is not None
        watch = PromptWatch(agent)
        options = DraftOptions(limits=limits or SandboxLimits(), accept=False)
        outcome = draft_adapter(case, watch, options, recorder=recorder, taken_names={})
        report.rows.append(_row(spec, outcome, watch, time.monotonic() - case_start))
    report.seconds = time.monotonic() - start
    return report
