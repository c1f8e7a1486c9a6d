"""Drafting inside a cycle (``hfadapt cycle --draft``): after the comparison, the failure
fingerprints this cycle's sweep has and the last completed cycle's had not are drafted for,
most downloads blocked first, one at a time (``hfadapt.agent.workflows.plan_drafts`` for the
fingerprint, then ``draft_targets``: its model diagnosed as its run was judged, the endpoint
asked, a draft accepted only when proven), until the cycle's budget is spent:

- ``attempts``: drafts asked of the endpoint in the whole cycle; each fingerprint gets at most
  the endpoint settings' ``max_attempts`` and never more than what is left;
- ``tokens``: prompt + completion tokens in the whole cycle; each fingerprint's session is
  limited to what is left. The agent checks its limit before each attempt, so the cycle can
  go past the budget by at most what its last request cost.

Every new fingerprint gets a ``cycle_draft`` row: accepted (the adapter's folder, in
``$HFADAPT_HOME/adapters`` unless told otherwise), refused (the agent's outcome says why),
not reproduced (the model's diagnosis now does not show it), error (drafting it raised),
skipped for budget, or skipped because the endpoint failed. A resumed cycle keeps the rows
it has and drafts only the fingerprints still skipped, with what is left of the budget. The
first cycle on a database has nothing to compare with: no fingerprint is new, nothing is
drafted (``hfadapt draft --top K`` drafts for the backlog)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine
from sqlmodel import col, select

from hfadapt.db.engine import session
from hfadapt.db.tables import CycleDraft
from hfadapt.errors import UsageError, option
from hfadapt.service.compare import CycleComparison
from hfadapt.untrusted import hide_url_credentials, one_line, redact

if TYPE_CHECKING:  # the agent (openai, its HTTP client) is imported when a cycle drafts
    from hfadapt.agent.client import AgentClient, AgentSettings
    from hfadapt.judge.options import JudgeOptions

__all__ = [
    "ACCEPTED",
    "DRAFT_OUTCOMES",
    "CycleDrafting",
    "DraftBudget",
    "DraftingResult",
    "draft_new_fingerprints",
]

ACCEPTED = "accepted"
REFUSED = "refused"  # drafted, no draft proven (the agent's outcome says why)
NOT_REPRODUCED = "not_reproduced"  # its model's diagnosis now does not show it
ERROR = "error"  # planning or drafting it raised (the model would not load, ...)
SKIPPED_BUDGET = "skipped_budget"
SKIPPED_ENDPOINT = "skipped_endpoint"  # the endpoint failed before its turn
DRAFT_OUTCOMES = (ACCEPTED, REFUSED, NOT_REPRODUCED, ERROR, SKIPPED_BUDGET, SKIPPED_ENDPOINT)
_SKIPPED = (SKIPPED_BUDGET, SKIPPED_ENDPOINT)  # a resumed cycle tries these again

ATTEMPTS = (1, 1_000)  # bounds of a cycle's attempt budget
TOKENS = (1_000, 100_000_000)  # of its token budget
DEFAULT_ATTEMPTS = 8
DEFAULT_TOKENS = 200_000


@dataclass(frozen=True)
class DraftBudget:
    """What drafting may spend in one cycle (module doc); checked on creation."""

    attempts: int = DEFAULT_ATTEMPTS
    tokens: int = DEFAULT_TOKENS

    def __post_init__(self) -> None:
        for name, value, (low, high) in (
            ("draft_attempts", self.attempts, ATTEMPTS),
            ("draft_tokens", self.tokens, TOKENS),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise UsageError(
                    f"{option(name)} must be a whole number from {low:,} to {high:,} (got {value!r})"
                )


@dataclass(frozen=True)
class CycleDrafting:
    """Drafting in a cycle: the endpoint (``hfadapt draft``'s settings: ``max_attempts`` is
    per fingerprint), the cycle's budget, whether drafted code may run without bubblewrap, and
    where accepted drafts go (None: ``$HFADAPT_HOME/adapters``)."""

    settings: AgentSettings
    budget: DraftBudget = field(default_factory=DraftBudget)
    unsafe_no_isolation: bool = False
    adapters_dir: Path | None = None

    def home(self) -> Path:
        from hfadapt.adapters.registry import user_adapters_dir

        return self.adapters_dir or user_adapters_dir()


@dataclass
class DraftingResult:
    """The cycle's drafting: one row per new fingerprint (``cycle_draft``), and the totals."""

    budget: DraftBudget
    endpoint: str
    adapters_dir: Path
    rows: list[CycleDraft] = field(default_factory=list)
    note: str = ""  # why nothing was drafted (the first cycle), or the endpoint's failure
    seconds: float = 0.0

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.rows if r.outcome == outcome)

    @property
    def drafted(self) -> int:
        """Fingerprints the agent worked on (accepted or refused)."""
        return self.count(ACCEPTED) + self.count(REFUSED)

    @property
    def attempts(self) -> int:
        return sum(r.attempts for r in self.rows)

    @property
    def tokens(self) -> int:
        return sum(r.tokens_in + r.tokens_out for r in self.rows)

    def summary(self) -> dict[str, int]:
        return {
            "new_fingerprints": len(self.rows),
            "drafted": self.drafted,
            "accepted": self.count(ACCEPTED),
            "refused": self.count(REFUSED),
            "not_reproduced": self.count(NOT_REPRODUCED),
            "errors": self.count(ERROR),
            "skipped_budget": self.count(SKIPPED_BUDGET),
            "skipped_endpoint": self.count(SKIPPED_ENDPOINT),
            "attempts": self.attempts,
            "tokens": self.tokens,
        }

    def to_dict(self) -> dict[str, Any]:
        keys = (
            "fingerprint",
            "model_id",
            "downloads",
            "outcome",
            "agent_outcome",
            "reason",
            "attempts",
            "tokens_in",
            "tokens_out",
            "seconds",
            "session_id",
            "adapter_path",
        )
        return {
            **self.summary(),
            "budget": {"attempts": self.budget.attempts, "tokens": self.budget.tokens},
            "endpoint": self.endpoint,
            "adapters_dir": str(self.adapters_dir),
            "note": self.note,
            "seconds": round(self.seconds, 3),
            "fingerprints": [{k: getattr(r, k) for k in keys} for r in self.rows],
        }


def _ranked(engine: Engine, comparison: CycleComparison) -> list[tuple[str, str | None, int]]:
    """(fingerprint, its most downloaded model, downloads blocked) of the new fingerprints,
    most downloads blocked first (the failure census of the cycle's sweep)."""
    from hfadapt.db.census import failures

    new = set(comparison.new_fingerprints)
    ranked = [
        (e.fingerprint, e.models[0] if e.models else None, e.downloads)
        for e in failures(engine, sweep_id=comparison.current_sweep)
        if e.fingerprint in new
    ]
    seen = {f for f, _, _ in ranked}
    return ranked + [(f, None, 0) for f in sorted(new - seen)]


def _recorded(engine: Engine, cycle_id: int) -> dict[str, CycleDraft]:
    with session(engine, write=False) as sess:
        stmt = select(CycleDraft).where(col(CycleDraft.cycle_id) == cycle_id)
        return {r.fingerprint: r for r in sess.exec(stmt)}


def _save(engine: Engine, row: CycleDraft) -> CycleDraft:
    with session(engine) as sess:
        merged = sess.merge(row)
        sess.flush()
        return merged


class _Drafter:
    """One cycle's drafting, fingerprint by fingerprint, against what is left of the budget."""

    def __init__(
        self,
        engine: Engine,
        drafting: CycleDrafting,
        judge: JudgeOptions,
        note: Callable[[str], None],
    ) -> None:
        self.engine, self.drafting, self.judge, self.note = engine, drafting, judge, note
        self.attempts = self.tokens = 0
        self.endpoint_down: str | None = None
        self.checked = False

    def spent(self) -> str | None:
        """Why the budget allows no further draft, or None."""
        budget = self.drafting.budget
        if self.attempts >= budget.attempts:
            return f"attempt budget spent ({self.attempts} of {budget.attempts})"
        if self.tokens >= budget.tokens:
            return f"token budget spent ({self.tokens:,} of {budget.tokens:,})"
        return None

    def _check_endpoint(self, client: AgentClient) -> None:
        from hfadapt.errors import AgentError

        if self.checked:
            return
        self.checked = True
        try:
            client.check()
        except AgentError as exc:
            self.endpoint_down = exc.one_line()

    def draft(self, row: CycleDraft) -> None:
        """Plan and draft ``row``'s fingerprint, filling the row in."""
        from hfadapt.agent.client import AgentClient
        from hfadapt.agent.loop import ACCEPTED as AGENT_ACCEPTED
        from hfadapt.agent.loop import ENDPOINT_ERROR
        from hfadapt.agent.options import DraftOptions
        from hfadapt.agent.records import Recorder
        from hfadapt.agent.workflows import draft_targets, plan_drafts

        d, budget = self.drafting, self.drafting.budget
        settings = replace(
            d.settings,
            max_attempts=min(d.settings.max_attempts, budget.attempts - self.attempts),
            max_tokens=min(d.settings.max_tokens, budget.tokens - self.tokens),
        )
        client = AgentClient(settings)
        self._check_endpoint(client)
        if self.endpoint_down is not None:
            row.outcome, row.reason = SKIPPED_ENDPOINT, self.endpoint_down
            return
        heard: list[str] = []

        def hear(text: str) -> None:
            heard.append(text)
            self.note(text)

        started = time.monotonic()
        try:
            targets = plan_drafts(self.engine, self.judge, fingerprint=row.fingerprint)
            outcomes = draft_targets(
                targets,
                client,
                DraftOptions(
                    unsafe_no_isolation=d.unsafe_no_isolation, adapters_dir=d.adapters_dir
                ),
                recorder=Recorder(self.engine, settings.secrets()),
                db=self.engine,
                note=hear,
            )
        except Exception as exc:  # one fingerprint's failure is its row, not the cycle's end
            row.outcome, row.seconds = ERROR, time.monotonic() - started
            text = hide_url_credentials(one_line(f"{type(exc).__name__}: {exc}", 500))
            row.reason = redact(text, settings.secrets())  # no key in a row
            return
        row.seconds = time.monotonic() - started
        if targets:
            row.model_id = targets[0].model
        mine = [o for o in outcomes if o.case.fingerprint == row.fingerprint] or outcomes
        if not mine:
            row.outcome = NOT_REPRODUCED
            row.reason = one_line("; ".join(heard) or "its model shows it no more", 500)
            return
        for outcome in mine:
            row.attempts += len(outcome.attempts)
            row.tokens_in += outcome.tokens_in
            row.tokens_out += outcome.tokens_out
        self.attempts += row.attempts
        self.tokens += row.tokens_in + row.tokens_out
        last = mine[-1]
        row.agent_outcome, row.session_id = last.outcome, last.session_id
        row.reason = one_line(last.reason, 500) if last.reason else None
        if last.outcome == AGENT_ACCEPTED:
            row.outcome = ACCEPTED
            row.adapter_path = str(last.adapter_path) if last.adapter_path else None
        else:
            row.outcome = REFUSED
        if last.outcome == ENDPOINT_ERROR:
            self.endpoint_down = (
                f"the endpoint failed while drafting {row.fingerprint}: {last.reason}"
            )


def draft_new_fingerprints(
    engine: Engine,
    cycle_id: int,
    comparison: CycleComparison | None,
    drafting: CycleDrafting,
    judge: JudgeOptions,
    *,
    note: Callable[[str], None] = lambda _: None,
    beat: Callable[[], None] = lambda: None,
) -> DraftingResult:
    """Draft for the fingerprints new in cycle ``cycle_id`` (``comparison``'s), within the
    budget, recording each (module doc). ``judge``: the JudgeOptions drafts are proven with
    (``plan_drafts``'s; the recorded run's mode and execution win); ``note`` hears what is
    being done; ``beat`` is called after each fingerprint (the cycle's lease)."""
    started = time.monotonic()
    result = DraftingResult(drafting.budget, drafting.settings.endpoint, drafting.home())
    if comparison is None:
        result.note = "first cycle on this database: no fingerprint is new, nothing drafted"
        return result
    recorded = _recorded(engine, cycle_id)
    drafter = _Drafter(engine, drafting, judge, note)
    for row in recorded.values():  # a resumed cycle: what its earlier drafts spent
        drafter.attempts += row.attempts
        drafter.tokens += row.tokens_in + row.tokens_out
    for fingerprint, model, downloads in _ranked(engine, comparison):
        earlier = recorded.get(fingerprint)
        if earlier is not None and earlier.outcome not in _SKIPPED:
            result.rows.append(earlier)
            continue
        row = earlier or CycleDraft(cycle_id=cycle_id, fingerprint=fingerprint, outcome=ERROR)
        row.model_id, row.downloads, row.reason = model, downloads, None
        spent = drafter.spent()
        if spent is not None:
            row.outcome, row.reason = SKIPPED_BUDGET, spent
        else:
            drafter.draft(row)
        result.rows.append(_save(engine, row))
        beat()
    result.note = drafter.endpoint_down or ""
    result.seconds = time.monotonic() - started
    return result
