"""``hfadapt agent-eval``: run the fixed suite against an endpoint and measure it: acceptance
rate, attempts, tokens and time per case, so endpoints and models can be compared. With
``reference=True`` the known-good solutions are replayed instead (no endpoint): a self-check
that every case is solvable and that the validation accepts a right answer."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hfadapt.agent.client import AgentClient, AgentSettings, Completion
from hfadapt.agent.loop import draft_adapter
from hfadapt.agent.options import DraftOptions
from hfadapt.agent.records import Recorder
from hfadapt.agent.sandbox import SandboxLimits
from hfadapt.agent.suite import SUITE, SuiteCase, get, suite_case


class ReferenceClient(AgentClient):
    """Answers with a case's known-good solution (no endpoint involved)."""

    def __init__(self, solution: str, settings: AgentSettings) -> None:
        self.settings = settings
        self.solution = solution

    def complete(self, messages: list[dict[str, str]]) -> Completion:
        text = f"```python\n{self.solution}```\n"
        return Completion(
            text, sum(len(m["content"]) for m in messages) // 4, len(text) // 4, 0.0, "reference"
        )


@dataclass
class EvalReport:
    endpoint: str
    model: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def accepted(self) -> int:
        return sum(1 for r in self.rows if r["outcome"] == "accepted")

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / len(self.rows) if self.rows else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "model": self.model,
            "cases": self.rows,
            "accepted": self.accepted,
            "total": len(self.rows),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "attempts": sum(r["attempts"] for r in self.rows),
            "tokens_in": sum(r["tokens_in"] for r in self.rows),
            "tokens_out": sum(r["tokens_out"] for r in self.rows),
            "seconds": round(self.seconds, 3),
        }


def _error_row(name: str, reason: str, seconds: float) -> dict[str, Any]:
    return {
        "case": name,
        "fingerprint": None,
        "outcome": "case_error",
        "reason": reason,
        "attempts": 0,
        "tokens_in": 0,
        "tokens_out": 0,
        "seconds": round(seconds, 3),
        "adapter_path": None,
        "session_id": None,
        "steps": [],
    }


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
    """Every suite case (or the named ones), one drafting session each; nothing is installed."""
    specs: list[SuiteCase] = [get(n) for n in names] or list(SUITE)
    report = EvalReport(settings.endpoint if not reference else "reference", settings.model)
    start = time.monotonic()
    shared = client or (None if reference else AgentClient(settings))
    for spec in specs:
        case_start = time.monotonic()
        try:
            case = suite_case(spec, profile=profile)
        except Exception as exc:  # one broken case is a row, not the end of the evaluation
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
            report.rows.append(_error_row(spec.name, reason, time.monotonic() - case_start))
            continue
        agent = ReferenceClient(spec.solution, settings) if reference else shared
        assert agent is not None
        options = DraftOptions(limits=limits or SandboxLimits(), accept=False)
        outcome = draft_adapter(case, agent, options, recorder=recorder, taken_names={})
        row = outcome.to_dict()
        row["case"] = spec.name
        row["seconds"] = round(time.monotonic() - case_start, 3)
        report.rows.append(row)
    report.seconds = time.monotonic() - start
    return report
