"""Helpers for the drafting-agent tests (not a test file): scripted drafts for the softsign
case, the case itself (with its model builder, so every proof runs), a client pointed at the
loopback endpoint, one drafting session, and the rows it recorded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hfadapt.agent.cases import FailureCase
from hfadapt.agent.client import AgentClient, AgentSettings
from hfadapt.agent.loop import DraftOutcome, draft_adapter
from hfadapt.agent.options import DraftOptions
from hfadapt.agent.records import AgentAttempt, DraftSession, Recorder
from hfadapt.agent.sandbox import SandboxLimits
from hfadapt.db.engine import get_engine, session

TARGET = "hfadapt.agent.evalcases:Softsign.forward"
HEAD = "import torch\n\nfrom hfadapt.adapters.api import adapter\n\n\n"


def source(body: str, name: str = "softsign-agent", head: str = HEAD, kind: str = "") -> str:
    """A draft's Python: ``head``, one ``@adapter`` on the softsign target, ``body``."""
    extra = f', kind="{kind}"' if kind else ""
    return (
        head
        + f'@adapter(name="{name}", target="{TARGET}", rule="op.pow.square"{extra})\n'
        + f"def forward(self, x):\n{body}\n"
    )


def draft(body: str, name: str = "softsign-agent", head: str = HEAD, kind: str = "") -> str:
    """An endpoint's answer holding :func:`source` in a python block."""
    return f"```python\n{source(body, name, head, kind)}```\n"


GOOD = draft("    return x * torch.reciprocal(1.0 + x.abs())")
WRONG = draft("    return x * torch.reciprocal(1.0 + x * x)")  # x / (1 + x^2): not softsign


def softsign_case() -> FailureCase:
    return FailureCase(
        name="softsign-pow-reciprocal",
        fingerprint="500d13657104",
        rule_id="op.pow.square",
        op="aten::pow.Tensor_Scalar",
        message="Unsupported: Spyre backend does not support: pow with exponent -1.0",
        target=TARGET,
        example="hfadapt.agent.evalcases:softsign_example",
        model={"builder": "hfadapt.agent.evalcases:softsign_model"},
        registry="none",
        match="rule_op",
    )


def client_for(
    url: str, *, attempts: int = 3, key: str = "sk-test-key-0000", **kw: Any
) -> AgentClient:
    settings = AgentSettings(
        model="scripted-model",
        base_url=url,
        api_key=key,
        max_attempts=attempts,
        max_retries=2,
        timeout_s=10,
        **kw,
    )
    return AgentClient(settings)


def run(
    server_url: str,
    tmp_path: Path,
    *,
    attempts: int = 3,
    limits: SandboxLimits | None = None,
    case: FailureCase | None = None,
    **kw: Any,
) -> tuple[DraftOutcome, Any]:
    engine = get_engine(str(tmp_path / "runs.db"))
    client = client_for(server_url, attempts=attempts)
    options = DraftOptions(
        limits=limits or SandboxLimits(), adapters_dir=tmp_path / "adapters", **kw
    )
    outcome = draft_adapter(
        case or softsign_case(),
        client,
        options,
        recorder=Recorder(engine, client.settings.secrets()),
        taken_names={},
    )
    return outcome, engine


def rows(engine: Any) -> tuple[list[DraftSession], list[AgentAttempt]]:
    from sqlmodel import select

    with session(engine, write=False) as s:
        return list(s.exec(select(DraftSession))), list(
            s.exec(select(AgentAttempt).order_by(AgentAttempt.id))  # type: ignore[arg-type]
        )
