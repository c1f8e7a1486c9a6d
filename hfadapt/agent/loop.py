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
from hfadapt.agent.options import DraftOptions
from hfadapt.agent.records import Recorder
from hfadapt.agent.validate import Validation, validate
from hfadapt.db.tables import AgentAttempt, DraftSession, utcnow
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
            "execution": self.case.execution,
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
    options: DraftOptions | None = None,
    *,
    recorder: Recorder | None = None,
    taken_names: dict[str, str] | None = None,
    model_id: str | None = None,
) -> DraftOutcome:
    """Work on one failure until a draft is accepted or a limit is reached. Refuses (raises
    IsolationUnavailableError) before contacting the endpoint when drafted code cannot run in
    an OS sandbox, unless ``options.unsafe_no_isolation`` (then recorded on every attempt).
    ``taken_names``: adapter names a draft may not take (None: the registry's)."""
    from hfadapt import isolation

    options = options or DraftOptions()
    isolation.require_isolation(unsafe=options.unsafe_no_isolation)
    taken = _taken_names() if taken_names is None else taken_names
    session = _Session(case, client, options, recorder or Recorder(None), taken, model_id)
    if not case.target:
        return session.nothing_to_ask()
    for number in range(1, client.settings.max_attempts + 1):
        if session.over_budget(number) or session.attempt(number):
            break
    else:
        session.result.reason = (
            f"no draft accepted in {client.settings.max_attempts} attempt(s); last: "
            f"{session.result.reason}"
        )
    return session.finish()


class _Session:
    """One failure worked on: the session row, the conversation so far, the drafts seen."""

    def __init__(
        self,
        case: FailureCase,
        client: AgentClient,
        options: DraftOptions,
        recorder: Recorder,
        taken: dict[str, str],
        model_id: str | None,
    ) -> None:
        from hfadapt import isolation

        self.case, self.client, self.options, self.recorder = case, client, options, recorder
        self.agent = client.settings
        self.taken = taken
        self.unsafe = isolation.unavailable_reason() is not None
        self.secrets = self.agent.secrets()
        self.start = time.monotonic()
        self.row = DraftSession(
            fingerprint=case.fingerprint,
            case_name=case.name,
            rule_id=case.rule_id,
            op=case.op,
            target=case.target,
            model_id=model_id,
            endpoint=self.agent.endpoint,
            endpoint_model=self.agent.model,
            case=case.to_dict(),
        )
        recorder.save_session(self.row)
        self.result = DraftOutcome(case, REJECTED, "", session_id=self.row.id)
        self.system = system_prompt(case.profile, target=case.target)
        self.task = task_prompt(case, taken=taken)
        self.messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.task},
        ]
        self.seen: dict[str, int] = {}  # normalized draft -> the attempt that made it
        self.history: list[tuple[int, str, str, str]] = []  # every refused draft, in order

    def nothing_to_ask(self) -> DraftOutcome:
        """The case decides what a draft replaces; without a method there is nothing a graph
        can stand in for, so the endpoint is not asked at all."""
        case, result = self.case, self.result
        result.outcome = NO_TARGET
        result.reason = (
            f"the failing code ({case.location or case.op}) is not a method of a model class; "
            "hfadapt drafts method rewrites only: write a Python adapter for it by hand"
        )
        self.row.outcome, self.row.reason, self.row.finished_at = NO_TARGET, result.reason, utcnow()
        self.recorder.save_session(self.row)
        return result

    def over_budget(self, number: int) -> bool:
        """Whether the wall-time or token limit is reached before attempt ``number``."""
        agent, result = self.agent, self.result
        elapsed = time.monotonic() - self.start
        if elapsed >= agent.max_seconds:
            result.outcome = TIME_BUDGET
            result.reason = (
                f"wall-time limit {agent.max_seconds:g} s reached after {number - 1} attempt(s)"
            )
            return True
        used = result.tokens_in + result.tokens_out
        if used >= agent.max_tokens:
            result.outcome = TOKEN_BUDGET
            result.reason = (
                f"token limit {agent.max_tokens} reached ({used} used) after "
                f"{number - 1} attempt(s)"
            )
            return True
        return False

    def _record(self, attempt: Attempt) -> None:
        _record(self.recorder, self.row, attempt, self.case, self.agent, self.messages, self.unsafe)

    def attempt(self, number: int) -> bool:
        """Ask once, validate what came back; True when the session ends here."""
        result = self.result
        attempt = Attempt(number, None)
        result.attempts.append(attempt)
        try:
            completion = self.client.complete(self.messages)
        except EndpointError as exc:
            attempt.error, attempt.retries = exc.one_line(), exc.retries
            self._record(attempt)
            result.outcome, result.reason = ENDPOINT_ERROR, attempt.error
            return True
        attempt.completion = completion
        result.tokens_in += completion.tokens_in
        result.tokens_out += completion.tokens_out
        try:
            attempt.code = extract_code(completion.text)
        except DraftError as exc:
            attempt.failed_step, attempt.feedback = "extract", exc.one_line()
        if attempt.code is not None and self._repeated(attempt):
            return True
        if attempt.code is not None:
            self._validate(attempt)
        self._record(attempt)
        if attempt.accepted:
            return self._accept(attempt, completion)
        feedback = attempt.feedback.splitlines()[0] if attempt.feedback else ""
        result.reason = f"attempt {number} failed at {attempt.failed_step}: {feedback}"
        self._ask_for_repair(attempt, completion)
        return False

    def _repeated(self, attempt: Attempt) -> bool:
        """A draft seen before ends the session: asking again would only repeat it."""
        assert attempt.code is not None
        key = normalized(attempt.code)
        first = self.seen.setdefault(key, attempt.number)
        if first == attempt.number:
            return False
        attempt.failed_step = "repeat"
        attempt.feedback = f"identical to the draft of attempt {first}"
        self._record(attempt)
        self.result.outcome = REPEATED
        self.result.reason = f"attempt {attempt.number} repeated the draft of attempt {first}"
        return True

    def _validate(self, attempt: Attempt) -> None:
        assert attempt.code is not None
        attempt.validation = validate(
            attempt.code,
            self.case,
            limits=self.options.limits,
            secrets=self.secrets,
            taken_names=self.taken,
            unsafe_no_isolation=self.options.unsafe_no_isolation,
        )
        if not attempt.validation.accepted:
            bad = attempt.validation.failed()
            attempt.failed_step = bad.step if bad else "incomplete"
            attempt.feedback = attempt.validation.feedback(self.secrets)

    def _accept(self, attempt: Attempt, completion: Completion) -> bool:
        result = self.result
        assert attempt.code is not None and attempt.validation is not None
        if self.options.accept:
            try:
                result.adapter_path = accept_draft(
                    attempt.code,
                    self.case,
                    attempt.validation,
                    endpoint_model=completion.model or self.agent.model,
                    endpoint=self.agent.endpoint,
                    attempt_id=attempt.attempt_id,
                    folder=self.options.adapters_dir,
                )
            except AdapterError as exc:
                result.outcome, result.reason = REJECTED, exc.one_line()
                return True
        result.outcome = ACCEPTED
        name = attempt.validation.adapter.get("name")
        result.reason = f"attempt {attempt.number}: {name} passed every step"
        return True

    def _ask_for_repair(self, attempt: Attempt, completion: Completion) -> None:
        """The next request: the task, this answer, and exactly how it failed."""
        repair = repair_prompt(
            attempt=attempt.number,
            max_attempts=self.agent.max_attempts,
            previous_draft=attempt.code or "",
            failed_step=attempt.failed_step or "validation",
            failure=attempt.feedback or "not accepted",
            history=list(self.history),
        )
        self.history.append(
            (
                attempt.number,
                attempt.failed_step or "validation",
                attempt.feedback or "not accepted",
                attempt.code or "",
            )
        )
        self.messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.task},
            {"role": "assistant", "content": completion.text},
            {"role": "user", "content": repair},
        ]

    def finish(self) -> DraftOutcome:
        """Close the session row with the outcome and its totals."""
        result, row = self.result, self.row
        result.seconds = time.monotonic() - self.start
        row.outcome, row.reason = result.outcome, result.reason
        row.attempts = len(result.attempts)
        row.tokens_in, row.tokens_out = result.tokens_in, result.tokens_out
        row.seconds = round(result.seconds, 3)
        row.adapter_path = str(result.adapter_path) if result.adapter_path else None
        last = result.attempts[-1].validation if result.attempts else None
        accepted = last is not None and result.accepted
        row.adapter_name = last.adapter.get("name") if last is not None and accepted else None
        row.finished_at = utcnow()
        self.recorder.save_session(row)
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
