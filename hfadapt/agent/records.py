"""The agent's rows in runs.db: one ``draft_session`` per failure worked on, one
``agent_attempt`` per answer (prompt, response, endpoint model, tokens, latency, each
validation step's verdict and output, accepted or not). Every text goes through ``redact``
first, so an API key that an endpoint or a prompt echoes never lands in the database."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Column, Text
from sqlalchemy.engine import Engine
from sqlmodel import Field, SQLModel, select

from hfadapt.tables import utcnow


class DraftSession(SQLModel, table=True):
    """One failure the agent worked on, and how it ended."""

    __tablename__ = "draft_session"

    id: int | None = Field(default=None, primary_key=True)
    fingerprint: str = Field(index=True)
    case_name: str = ""
    rule_id: str = ""
    op: str = ""
    target: str | None = None
    model_id: str | None = Field(default=None, index=True)
    endpoint: str = ""  # base URL without credentials
    endpoint_model: str = ""
    outcome: str = Field(default="running", index=True)  # see hfadapt.agent.loop.OUTCOMES
    reason: str | None = Field(default=None, sa_column=Column(Text))
    attempts: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    seconds: float = 0.0
    adapter_name: str | None = None
    adapter_path: str | None = None
    case: dict | None = Field(default=None, sa_column=Column(JSON))
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class AgentAttempt(SQLModel, table=True):
    """One answer of the endpoint and what validation made of it."""

    __tablename__ = "agent_attempt"

    id: int | None = Field(default=None, primary_key=True)
    session_id: int | None = Field(default=None, foreign_key="draft_session.id", index=True)
    number: int = 1
    fingerprint: str = Field(default="", index=True)
    endpoint: str = ""
    endpoint_model: str = ""
    prompt: list | None = Field(default=None, sa_column=Column(JSON))  # the chat messages sent
    response: str | None = Field(default=None, sa_column=Column(Text))
    code: str | None = Field(default=None, sa_column=Column(Text))
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    retries: int = 0
    steps: list | None = Field(
        default=None, sa_column=Column(JSON)
    )  # step, status, summary, output
    failed_step: str | None = None
    feedback: str | None = Field(default=None, sa_column=Column(Text))
    accepted: bool = False
    error: str | None = Field(default=None, sa_column=Column(Text))
    created_at: datetime = Field(default_factory=utcnow)


def _scrub(value: Any, secrets: list[str]) -> Any:
    from hfadapt.agent.client import redact

    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, list):
        return [_scrub(v, secrets) for v in value]
    if isinstance(value, dict):
        return {k: _scrub(v, secrets) for k, v in value.items()}
    return value


class Recorder:
    """Writes sessions and attempts as they happen (nothing waits for the end: a crash or a
    dead endpoint loses no attempt). ``engine=None`` records nothing."""

    def __init__(self, engine: Engine | None, secrets: list[str] | None = None) -> None:
        self.engine = engine
        self.secrets = [s for s in (secrets or []) if s]

    def _save(self, row: SQLModel) -> int | None:
        if self.engine is None:
            return None
        from hfadapt.store import session

        for name, value in row.__dict__.items():
            if not name.startswith("_"):
                setattr(row, name, _scrub(value, self.secrets))
        with session(self.engine) as s:
            s.add(row)
            s.flush()
            return row.id  # type: ignore[attr-defined,no-any-return]

    def save_session(self, row: DraftSession) -> int | None:
        row.id = self._save(row)
        return row.id

    def save_attempt(self, row: AgentAttempt) -> int | None:
        row.id = self._save(row)
        return row.id


def list_attempts(engine: Engine, limit: int = 50) -> list[AgentAttempt]:
    from hfadapt.store import session

    with session(engine, write=False) as s:
        rows = s.exec(select(AgentAttempt).order_by(AgentAttempt.id.desc()).limit(limit))  # type: ignore[union-attr]
        return list(rows)


def get_attempt(engine: Engine, attempt_id: int) -> tuple[AgentAttempt | None, DraftSession | None]:
    from hfadapt.store import session

    with session(engine, write=False) as s:
        attempt = s.get(AgentAttempt, attempt_id)
        sess = s.get(DraftSession, attempt.session_id) if attempt and attempt.session_id else None
        return attempt, sess


def list_sessions(engine: Engine, limit: int = 50) -> list[DraftSession]:
    from hfadapt.store import session

    with session(engine, write=False) as s:
        return list(s.exec(select(DraftSession).order_by(DraftSession.id.desc()).limit(limit)))  # type: ignore[union-attr]
