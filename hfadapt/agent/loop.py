"""The drafting loop: failure -> prompt -> draft -> validate -> retry with the exact failure as
feedback (the repair prompt) -> accept. It stops at the first accepted draft, at the attempt,
token or wall-time limit, when the endpoint fails, or when a draft repeats an earlier one.
Every answer is recorded as it arrives."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfadapt.agent.accept import accept_draft
from hfadapt.agent.cases import FailureCase
from hfadapt.agent.client import AgentClient, Completion
from hfadapt.agent.context import repair_prompt, system_prompt, task_prompt
from hfadapt.agent.extract import extract_code, normalized
from hfadapt.agent.records import AgentAttempt, DraftSession, Recorder
from hfadapt.agent.sandbox import SandboxLimits
from hfadapt.agent.validate import Validation, validate
from hfadapt.db.tables import utcnow
from hfadapt.errors import AdapterError, DraftError, EndpointError

ACCEPTED = "accepted"
REJECTED = "rejected"  # the attempt limit was reached
REPEATED = "repeated_draft"
ENDPOINT_ERROR = "endpoint_error"
TOKEN_BUDGET = "token_budget"
TIME_BUDGET = "time_budget"
NO_TARGET = "no_target"  # the failure has no method a graph can replace: nothing was asked
OUTCOMES = (ACCEPTED, REJECTED, REPEATED, ENDPOINT_ERROR, TOKEN_BUDGET, TIME_BUDGET, NO_TARGET)


@dataclass
class Attempt:
    number: int
    completion: Completion | None
    code: str | None = None
    validation: Validation | None = None
    feedback: str = ""
    failed_step: str | None = None
    error: str = ""
    retries: int = 0  # of a failed request (an answered one has them on its completion)
    attempt_id: int | None = None

    @property
    def accepted(self) -> bool:
        return self.validation is not None and self.validation.accepted


@dataclass
class DraftOutcome:
    case: FailureCase
    outcome: str
    reason: str
    attempts: list[Attempt] = field(default_factory=list)
    tokens_in: int = 0
    tokens_out: int = 0
    seconds: float = 0.0
    adapter_path: Path | None = None
    session_id: int | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome == ACCEPTED

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case.name,
            "fingerprint": self.case.fingerprint,
            "outcome": self.outcome,
            "reason": self.reason,
            "attempts": len(self.attempts),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "seconds": round(self.seconds, 3),
            "adapter_path": str(self.adapter_path) if self.adapter_path else None,
            "session_id": self.session_id,
            "steps": [
                a.validation.verdicts() if a.validation else {"extract": "fail"}
                for a in self.attempts
                if a.completion
            ],
        }


def draft_adapter(
    case: FailureCase,
    client: AgentClient,
    *,
    recorder: Recorder | None = None,
    limits: SandboxLimits | None = None,
    adapters_dir: Path | None = None,
    accept: bool = True,
    taken_names: dict[str, str] | None = None,
    model_id: str | None = None,
    unsafe_no_isolation: bool = False,
) -> DraftOutcome:
    """Work on one failure until a draft is accepted or a limit is reached. Refuses (raises
    IsolationUnavailableError) before contacting the endpoint when drafted code cannot run in
    an OS sandbox, unless ``unsafe_no_isolation`` is True (then recorded on every attempt)."""
    from hfadapt import isolation

    isolation.require_isolation(unsafe=unsafe_no_isolation)
    unsafe = isolation.unavailable_reason() is not None
    settings = client.settings
    recorder = recorder or Recorder(None)
    secrets = settings.secrets()
    start = time.monotonic()
    taken = _taken_names() if taken_names is None else taken_names
    row = DraftSession(
        fingerprint=case.fingerprint,
        case_name=case.name,
        rule_id=case.rule_id,
        op=case.op,
        target=case.target,
        model_id=model_id,
        endpoint=settings.endpoint,
        endpoint_model=settings.model,
        case=case.to_dict(),
    )
    recorder.save_session(row)
    result = DraftOutcome(case, REJECTED, "", session_id=row.id)
    if not case.target:
        # The case decides what a draft replaces; without a method there is nothing a graph
        # can stand in for, so the endpoint is not asked at all.
        result.outcome = NO_TARGET
        result.reason = (
            f"the failing code ({case.location or case.op}) is not a method of a model class; "
            "hfadapt drafts method rewrites only: write a Python adapter for it by hand"
        )
        row.outcome, row.reason, row.finished_at = result.outcome, result.reason, utcnow()
        recorder.save_session(row)
        return result

    system, task = system_prompt(case.profile), task_prompt(case)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    seen: dict[str, int] = {}
    for number in range(1, settings.max_attempts + 1):
        elapsed = time.monotonic() - start
        if elapsed >= settings.max_seconds:
            result.outcome, result.reason = (
                TIME_BUDGET,
                f"wall-time limit {settings.max_seconds:g} s reached after {number - 1} attempt(s)",
            )
            break
        used = result.tokens_in + result.tokens_out
        if used >= settings.max_tokens:
            result.outcome, result.reason = (
                TOKEN_BUDGET,
                f"token limit {settings.max_tokens} reached ({used} used) after {number - 1} attempt(s)",
            )
            break
        attempt = Attempt(number, None)
        result.attempts.append(attempt)
        try:
            completion = client.complete(messages)
        except EndpointError as exc:
            attempt.error, attempt.retries = exc.one_line(), exc.retries
            _record(recorder, row, attempt, case, settings, messages, unsafe)
            result.outcome, result.reason = ENDPOINT_ERROR, attempt.error
            break
        attempt.completion = completion
        result.tokens_in += completion.tokens_in
        result.tokens_out += completion.tokens_out
        previous = ""
        try:
            attempt.code = previous = extract_code(completion.text)
        except DraftError as exc:
            attempt.failed_step, attempt.feedback = "extract", exc.one_line()
        if attempt.code is not None:
            key = normalized(attempt.code)
            if key in seen:
                attempt.failed_step = "repeat"
                attempt.feedback = f"identical to the draft of attempt {seen[key]}"
                _record(recorder, row, attempt, case, settings, messages, unsafe)
                result.outcome, result.reason = (
                    REPEATED,
                    f"attempt {number} repeated the draft of attempt {seen[key]}",
                )
                break
            seen[key] = number
            attempt.validation = validate(
                attempt.code,
                case,
                limits=limits,
                secrets=secrets,
                taken_names=taken,
                unsafe_no_isolation=unsafe_no_isolation,
            )
            bad = attempt.validation.failed()
            if not attempt.validation.accepted:
                attempt.failed_step = bad.step if bad else "incomplete"
                attempt.feedback = attempt.validation.feedback(secrets)
        _record(recorder, row, attempt, case, settings, messages, unsafe)
        if attempt.accepted and attempt.code is not None and attempt.validation is not None:
            if accept:
                try:
                    result.adapter_path = accept_draft(
                        attempt.code,
                        case,
                        attempt.validation,
                        endpoint_model=completion.model or settings.model,
                        endpoint=settings.endpoint,
                        attempt_id=attempt.attempt_id,
                        folder=adapters_dir,
                    )
                except AdapterError as exc:
                    result.outcome, result.reason = REJECTED, exc.one_line()
                    break
            result.outcome = ACCEPTED
            result.reason = (
                f"attempt {number}: {attempt.validation.adapter.get('name')} passed every step"
            )
            break
        result.reason = f"attempt {number} failed at {attempt.failed_step}: {attempt.feedback.splitlines()[0] if attempt.feedback else ''}"
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": task},
            {"role": "assistant", "content": completion.text},
            {
                "role": "user",
                "content": repair_prompt(
                    attempt=number,
                    max_attempts=settings.max_attempts,
                    previous_draft=previous,
                    failed_step=attempt.failed_step or "validation",
                    failure=attempt.feedback or "not accepted",
                ),
            },
        ]
    else:
        result.reason = (
            f"no draft accepted in {settings.max_attempts} attempt(s); last: {result.reason}"
        )
    result.seconds = time.monotonic() - start
    row.outcome, row.reason = result.outcome, result.reason
    row.attempts = len(result.attempts)
    row.tokens_in, row.tokens_out = result.tokens_in, result.tokens_out
    row.seconds = round(result.seconds, 3)
    row.adapter_path = str(result.adapter_path) if result.adapter_path else None
    last = result.attempts[-1] if result.attempts else None
    row.adapter_name = (
        last.validation.adapter.get("name")
        if last and last.validation and result.accepted
        else None
    )
    row.finished_at = utcnow()
    recorder.save_session(row)
    return result


def _record(
    recorder: Recorder,
    session: DraftSession,
    attempt: Attempt,
    case: FailureCase,
    settings: Any,
    messages: list[dict[str, str]],
    unsafe: bool = False,
) -> None:
    c = attempt.completion
    row = AgentAttempt(
        session_id=session.id,
        number=attempt.number,
        fingerprint=case.fingerprint,
        endpoint=settings.endpoint,
        endpoint_model=(c.model if c else "") or settings.model,
        prompt=[dict(m) for m in messages],
        response=c.text if c else None,
        code=attempt.code,
        tokens_in=c.tokens_in if c else 0,
        tokens_out=c.tokens_out if c else 0,
        latency_s=round(c.latency_s, 4) if c else 0.0,
        retries=c.retries if c else attempt.retries,
        steps=[s.to_dict() for s in attempt.validation.steps] if attempt.validation else None,
        failed_step=attempt.failed_step,
        feedback=attempt.feedback or None,
        accepted=attempt.accepted,
        error=attempt.error or None,
        unsafe_no_isolation=unsafe,
    )
    attempt.attempt_id = recorder.save_attempt(row)


def _taken_names() -> dict[str, str]:
    """Adapter names already in the registry (a draft must not shadow one)."""
    from hfadapt.adapters.registry import discover

    return {a.name: f"{a.source} adapter {a.path or a.name}" for a in discover().adapters}
