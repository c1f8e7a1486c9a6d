"""The drafting agent: endpoint client, prompts, policy, sandbox, the loop, containment. The shared
fixtures this part's tests use, from tests/support."""

from __future__ import annotations

from support.device import spyre
from support.timing import sleeps

__all__ = ["sleeps", "spyre"]
