"""The tables of runs.db (SQLModel). A change to a table here needs a new
migration appended in hfadapt.db.migrations (SCHEMA_VERSION follows the list)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, Index, Text, UniqueConstraint
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    return datetime.now(UTC)


class HubModel(SQLModel, table=True):
    """One Hub model as last seen by a crawl (the newest crawl wins; crawl_entry keeps history)."""

    __tablename__ = "hub_model"

    id: str = Field(primary_key=True, description="Hub repo id, e.g. BAAI/bge-small-en-v1.5")
    rank: int | None = Field(default=None, index=True)
    downloads: int = Field(default=0, sa_type=BigInteger)  # 64 bits (m007)
    likes: int = 0
    model_type: str | None = Field(default=None, index=True)
    architectures: str | None = None  # comma-separated
    config_class: str | None = None
    num_parameters: int | None = Field(default=None, sa_type=BigInteger)  # 7B models: > 2**31
    library: str | None = Field(default=None, index=True)
    pipeline_tag: str | None = None
    is_gated: bool = False
    is_moe: bool = False
    is_multimodal: bool = False
    is_custom_code: bool = False
    revision: str | None = None  # commit sha when known
    config_json: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    tags: list[Any] | None = Field(default=None, sa_column=Column(JSON))
    excluded_reason: str | None = Field(default=None, index=True)  # prefilter; None = kept
    reference_supported: bool | None = None  # hf-adapters is_supported (snapshot only)
    year: int | None = None
    source: str = "snapshot"  # "snapshot" or the endpoint URL crawled
    last_crawl_id: int | None = Field(default=None, foreign_key="crawl.id")
    crawled_at: datetime = Field(default_factory=utcnow)


class Crawl(SQLModel, table=True):
    """One crawl: when, from where, how many models it saw and kept."""

    __tablename__ = "crawl"

    id: int | None = Field(default=None, primary_key=True)
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None
    source: str = "snapshot"
    limit: int | None = None
    seen: int = 0
    kept: int = 0
    excluded: int = 0
    status: str = "running"  # running | done | failed
    error: str | None = Field(default=None, sa_column=Column(Text))


class CrawlEntry(SQLModel, table=True):
    """Which crawl saw which model, at which rank and download count."""

    __tablename__ = "crawl_entry"
    __table_args__ = (UniqueConstraint("crawl_id", "model_id"),)

    id: int | None = Field(default=None, primary_key=True)
    crawl_id: int = Field(foreign_key="crawl.id", index=True)
    model_id: str = Field(index=True)
    rank: int | None = None
    downloads: int = Field(default=0, sa_type=BigInteger)  # 64 bits (m007)
    excluded_reason: str | None = None


class Run(SQLModel, table=True):
    """One judgement of one model on the simulated device, with its full evidence.

    ``verdict`` is one of the stable strings in hfadapt.verdicts; never renamed.
    """

    __tablename__ = "run"
    __table_args__ = (Index("ix_run_sweep_model", "sweep_id", "model_id"),)

    id: int | None = Field(default=None, primary_key=True)
    model_id: str = Field(index=True)
    sweep_id: int | None = Field(default=None, index=True)
    verdict: str = Field(index=True)
    reason: str | None = Field(default=None, sa_column=Column(Text))
    mode: str = "full"  # full | structural
    execution: str = "eager"  # eager | compile
    dtype: str = "fp16"
    signature: str | None = Field(default=None, index=True)  # structural signature hash
    # what the verdict rests on: weights | config | architecture (hfadapt.options.EvidenceLevel);
    # None = unknown (rows written before m005, or a model that never loaded)
    evidence_level: str | None = Field(default=None, index=True)
    model_type: str | None = None
    revision: str | None = None
    # metrics (None when the run did not get that far)
    min_token_cosine: float | None = None
    mean_token_cosine: float | None = None
    pooled_cosine: float | None = None
    max_abs_diff: float | None = None
    has_nan: bool | None = None
    has_inf: bool | None = None
    # lists and dicts: violations, fallbacks (op -> count), adapters applied, divergent module
    violations: list[Any] | None = Field(default=None, sa_column=Column(JSON))
    fallbacks: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    adapters: list[Any] | None = Field(default=None, sa_column=Column(JSON))
    fingerprints: list[Any] | None = Field(default=None, sa_column=Column(JSON))
    divergence: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    evidence: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))  # anything else
    versions: dict[str, Any] | None = Field(
        default=None, sa_column=Column(JSON)
    )  # the environment: hfadapt.judge.environment.KEYS
    profile_version: str | None = None
    timings: dict[str, Any] | None = Field(
        default=None, sa_column=Column(JSON)
    )  # seconds per phase
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


# ---- sweeps (m003, m004) ----

RUNNING = "running"
DONE = "done"
FAILED = "failed"
INTERRUPTED = "interrupted"  # stopped by the user (Ctrl-C): resumable like a failed one


class Sweep(SQLModel, table=True):
    """One batch run over crawled models; its runs are the ``run`` rows with this ``sweep_id``."""

    __tablename__ = "sweep"

    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(index=True)  # the options that define it: a resumed sweep must match
    status: str = Field(default=RUNNING, index=True)  # running | done | failed | interrupted
    mode: str = "structural"
    execution: str = "eager"
    dtype: str = "fp16"
    top: int | None = None
    model_type: str | None = None
    dedupe: bool = True
    executor: str = "local"
    workers: int = 1
    timeout_s: float | None = None
    memory_limit_mb: int | None = None
    crawl_id: int | None = Field(default=None, foreign_key="crawl.id")
    models: int = 0  # planned rows
    units: int = 0  # distinct units of work (signatures) planned
    judged: int = 0  # units a worker ran (over every resume)
    resumes: int = 0
    seconds: float = 0.0  # wall time over every resume
    counts: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))  # verdict -> models
    options: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    host: str | None = None
    driver_pid: int | None = None  # the process driving it while running (m004)
    error: str | None = None
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


# ---- cycles (m008) ----


class Cycle(SQLModel, table=True):
    """One ``hfadapt cycle``: crawl, sweep, the comparison with the last completed cycle's
    sweep, the report. A running row with its driver's host and pid (and a heartbeat, its
    lease) is the lock that keeps two cycles from running at once on one database."""

    __tablename__ = "cycle"

    id: int | None = Field(default=None, primary_key=True)
    key: str = Field(index=True)  # the options that define it: a resumed cycle must match
    status: str = Field(default=RUNNING, index=True)  # running | done | failed | interrupted
    crawl_id: int | None = Field(default=None, foreign_key="crawl.id")
    sweep_id: int | None = Field(default=None, foreign_key="sweep.id")
    baseline_cycle_id: int | None = None
    baseline_sweep_id: int | None = None
    regressions: int = 0
    options: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    summary: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))  # the comparison
    host: str | None = None
    driver_pid: int | None = None
    heartbeat_at: datetime | None = None
    resumes: int = 0
    seconds: float = 0.0
    error: str | None = Field(default=None, sa_column=Column(Text))
    started_at: datetime = Field(default_factory=utcnow)
    finished_at: datetime | None = None


class CycleDraft(SQLModel, table=True):
    """One failure fingerprint new in a cycle and what its drafting came to (m009): accepted,
    refused, not reproduced, failed, or skipped (the cycle's budget spent, the endpoint
    down); the attempts and tokens it cost, the agent's session and the accepted adapter."""

    __tablename__ = "cycle_draft"
    __table_args__ = (UniqueConstraint("cycle_id", "fingerprint"),)

    id: int | None = Field(default=None, primary_key=True)
    cycle_id: int = Field(foreign_key="cycle.id", index=True)
    fingerprint: str = Field(index=True)
    model_id: str | None = None  # the model it was drafted on (its most downloaded)
    downloads: int = Field(default=0, sa_type=BigInteger)  # that the fingerprint blocks
    outcome: str = Field(index=True)  # see hfadapt.service.drafting.DRAFT_OUTCOMES
    agent_outcome: str | None = None  # the agent's own (hfadapt.agent.loop.OUTCOMES)
    reason: str | None = Field(default=None, sa_column=Column(Text))
    attempts: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    seconds: float = 0.0
    session_id: int | None = None  # draft_session.id
    adapter_path: str | None = None
    created_at: datetime = Field(default_factory=utcnow)


# ---- the adapter-drafting agent (m002) ----


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
    case: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
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
    prompt: list[Any] | None = Field(default=None, sa_column=Column(JSON))  # the chat messages sent
    response: str | None = Field(default=None, sa_column=Column(Text))
    code: str | None = Field(default=None, sa_column=Column(Text))
    tokens_in: int = 0
    tokens_out: int = 0
    latency_s: float = 0.0
    retries: int = 0
    steps: list[Any] | None = Field(
        default=None, sa_column=Column(JSON)
    )  # step, status, summary, output
    failed_step: str | None = None
    feedback: str | None = Field(default=None, sa_column=Column(Text))
    accepted: bool = False
    error: str | None = Field(default=None, sa_column=Column(Text))
    # the draft ran without OS isolation: only after the user's explicit --unsafe-no-isolation
    unsafe_no_isolation: bool = False
    created_at: datetime = Field(default_factory=utcnow)
