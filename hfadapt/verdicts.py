"""The stable verdicts. Persisted verbatim: add, never rename. ``Verdict`` members are strings
(``Verdict.PASS == "pass"``), so stored rows, JSON and comparisons need no conversion; the
module constants (``verdicts.PASS``) are the same members."""

from __future__ import annotations

from enum import StrEnum

__all__ = [
    "ALL",
    "CUSTOM_CODE",
    "LOAD_FAILED",
    "LOWERING_FAILED",
    "PASS",
    "REFERENCE_FAILED",
    "SKIPPED",
    "UNSUPPORTED_MODEL",
    "VERIFICATION_FAILED",
    "WORKER_CRASHED",
    "WORKER_TIMEOUT",
    "Verdict",
]


class Verdict(StrEnum):
    """What judging one model concluded (docs/design.md, "Verdicts")."""

    PASS = "pass"
    LOWERING_FAILED = "lowering_failed"
    VERIFICATION_FAILED = "verification_failed"
    UNSUPPORTED_MODEL = "unsupported_model"
    LOAD_FAILED = "load_failed"
    REFERENCE_FAILED = "reference_failed"
    CUSTOM_CODE = "custom_code"
    SKIPPED = "skipped"
    WORKER_CRASHED = "worker_crashed"
    WORKER_TIMEOUT = "worker_timeout"


PASS = Verdict.PASS
LOWERING_FAILED = Verdict.LOWERING_FAILED
VERIFICATION_FAILED = Verdict.VERIFICATION_FAILED
UNSUPPORTED_MODEL = Verdict.UNSUPPORTED_MODEL
LOAD_FAILED = Verdict.LOAD_FAILED
REFERENCE_FAILED = Verdict.REFERENCE_FAILED
CUSTOM_CODE = Verdict.CUSTOM_CODE
SKIPPED = Verdict.SKIPPED
WORKER_CRASHED = Verdict.WORKER_CRASHED
WORKER_TIMEOUT = Verdict.WORKER_TIMEOUT

ALL: tuple[Verdict, ...] = tuple(Verdict)
