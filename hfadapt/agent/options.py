"""How drafts are made and kept, as one frozen value: the sandbox's limits for each attempt,
whether a proven draft is accepted into the adapters folder (and which folder), and whether
drafted code may run where no OS sandbox can be had. The budgets of a session (attempts,
tokens, wall time) are the endpoint's settings (``AgentSettings``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hfadapt.agent.sandbox import SandboxLimits

__all__ = ["DraftOptions"]


@dataclass(frozen=True)
class DraftOptions:
    """See module doc. ``adapters_dir`` None: ``$HFADAPT_HOME/adapters``."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    accept: bool = True  # write an accepted draft as a graph adapter folder
    adapters_dir: Path | None = None
    unsafe_no_isolation: bool = False  # run drafted code without bubblewrap (recorded)
