"""The policy a drafted adapter must pass before any of it runs. The allowlist itself lives in
:mod:`hfadapt.adapters.policy`, because the registry checks it again every time it loads an
agent-origin file; the agent uses it at acceptance and words it for the system prompt."""

from __future__ import annotations

from hfadapt.adapters.policy import (
    ALLOWED_MODULES,
    DENIED_ATTRS,
    DENIED_NAMES,
    SAFE_BUILTINS,
    PolicyResult,
    check_policy,
    describe_policy,
)

__all__ = [
    "ALLOWED_MODULES",
    "DENIED_ATTRS",
    "DENIED_NAMES",
    "SAFE_BUILTINS",
    "PolicyResult",
    "check_policy",
    "describe_policy",
]
