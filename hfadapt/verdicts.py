"""The stable verdict strings. Persisted verbatim: add, never rename."""

from __future__ import annotations

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

ALL = (
    PASS,
    LOWERING_FAILED,
    VERIFICATION_FAILED,
    UNSUPPORTED_MODEL,
    LOAD_FAILED,
    REFERENCE_FAILED,
    CUSTOM_CODE,
    SKIPPED,
    WORKER_CRASHED,
    WORKER_TIMEOUT,
)
