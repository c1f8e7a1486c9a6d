"""The adapter-drafting agent: when a model fails on the device, a coding model behind any
OpenAI-compatible endpoint drafts an adapter, and hfadapt proves it (policy, sandbox, float64
equivalence, device, end to end) before accepting it into the user's adapters folder.

Importing this package is cheap; the parts load on use::

    from hfadapt.agent.client import AgentClient, AgentSettings
    from hfadapt.agent.loop import draft_adapter
"""

from __future__ import annotations
