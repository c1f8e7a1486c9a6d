"""The agent's rows in runs.db: one ``draft_session`` per failure worked on, one
``agent_attempt`` per answer (prompt, response, endpoint model, tokens, latency, each
validation step's verdict and output, accepted or not). Every text goes through ``redact``
first, so an API key that an endpoint or a prompt echoes never lands in the database, and
through ``strip_control``: much of it comes from the endpoint, the model or a sandbox's stderr,
and none of it is stored with a control character or a terminal escape sequence (newlines and
tabs stay, for the prompts, answers, drafts and stderr tails that have lines; a CR line ending
becomes a newline). Keys of JSON columns are cleaned the same way."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import SQLModel, select

from hfadapt.db.tables import AgentAttempt, DraftSession
from hfadapt.untrusted import strip_control


def _scrub(value: object, secrets: list[str]) -> Any:
    from hfadapt.agent.client import redact

    if isinstance(value, str):
        return redact(strip_control(value), secrets)  # stripped first: no secret split by one
    if isinstance(value, (list, tuple)):
        return [_scrub(v, secrets) for v in value]
    if isinstance(value, dict):
        return {_scrub(k, secrets): _scrub(v, secrets) for k, v in value.items()}
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
        from hfadapt.db.engine import session

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
    from hfadapt.db.engine import session

    with session(engine, write=False) as s:
        rows = s.exec(select(AgentAttempt).order_by(AgentAttempt.id.desc()).limit(limit))  # type: ignore[union-attr]
        return list(rows)


def get_attempt(engine: Engine, attempt_id: int) -> tuple[AgentAttempt | None, DraftSession | None]:
    from hfadapt.db.engine import session

    with session(engine, write=False) as s:
        attempt = s.get(AgentAttempt, attempt_id)
        sess = s.get(DraftSession, attempt.session_id) if attempt and attempt.session_id else None
        return attempt, sess
