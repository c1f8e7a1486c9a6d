"""Helpers for the drafting-agent tests (not a test file): scripted drafts for the softsign
case, the case itself (with its model builder, so every proof runs), a client pointed at the
loopback endpoint, one drafting session, and the rows it recorded; ``hfadapt draft`` run with a
home folder of the test's (``draft_cli``); the reference self-check run in a fresh process and
read back (``run_reference_eval``: tests/agent/conftest.py runs it once per session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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


# A tiny BERT whose one failure the drafts below fix: NewGELUActivation's pow(x, 3.0).
TINY_GELU_BERT = {
    "architectures": ["BertModel"],
    "model_type": "bert",
    "hidden_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 1,
    "intermediate_size": 128,
    "hidden_act": "gelu_new",
    "vocab_size": 500,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}
GELU_TARGET = "transformers.activations:NewGELUActivation.forward"
GELU_BODY = (
    "    k = 0.7978845608028654\n"
    "    return 0.5 * input * (1.0 + torch.tanh(k * (input + 0.044715 * (input * input * input))))"
)


def gelu_draft(
    body: str = GELU_BODY,
    head: str = HEAD,
    name: str = "gelu-agent",
    kind: str = "",
    args: str = "self, input",
) -> str:
    """An endpoint's answer: a fenced draft of ``NewGELUActivation.forward`` with ``body``."""
    extra = f', kind="{kind}"' if kind else ""
    code = (
        head
        + f'@adapter(name="{name}", target="{GELU_TARGET}", rule="op.pow.square"{extra})\n'
        + f"def forward({args}):\n{body}\n"
    )
    return f"```python\n{code}```\n"


GOOD = draft("    return x * torch.reciprocal(1.0 + x.abs())")
WRONG = draft("    return x * torch.reciprocal(1.0 + x * x)")  # x / (1 + x^2): not softsign
# Softsign exactly (float64, fp16 and bf16 on the CPU alike), plus 0.3 times a term that is 0
# everywhere but on the device: an exp over 65 channels (the card's exp_unaligned_stick defect
# reads channel 64 as channel 0) sums to one more there, and channel 0 of every row moves by
# 0.3. At the module that stays within the device step's bounds; end to end it makes the model
# worse than it is without the draft.
WORSE_ON_DEVICE = draft(
    # exact in real arithmetic, nothing the stock code lacks by the static rules' categories:
    # 1 / (1 + |x|) as exp(-log(1 + |x|)), whose exp the device computes wrong past the first
    # stick of a row off the stick boundary (defect.exp_unaligned)
    "    return x * torch.exp(-torch.log(1.0 + x.abs()))"
)


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


def corrupted_softsign_case() -> FailureCase:
    """The softsign case on a model whose device run is wrong without any draft (a silent
    ``exp_unaligned_stick`` defect elsewhere): its baseline fails end to end."""
    case = softsign_case()
    case.name = "softsign-on-a-corrupted-baseline"
    case.model = {"builder": "hfadapt.agent.evalcases:corrupted_softsign_model"}
    return case


def draft_cli(
    args: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    home: Path,
) -> tuple[int, str, str]:
    """``hfadapt *args`` (a ``draft`` run, usually) through the real entry point with
    HFADAPT_HOME set to ``home``: (exit code, stdout, stderr). Afterwards the variable is unset
    and the process-wide registry reloaded, so no later test sees ``home``'s accepted drafts."""
    from hfadapt.adapters.registry import default_registry
    from support.cli_runner import run_cli

    monkeypatch.setenv("HFADAPT_HOME", str(home))
    try:
        return run_cli(args, monkeypatch, capsys)
    finally:
        monkeypatch.delenv("HFADAPT_HOME")
        default_registry(reload=True)


@dataclass(frozen=True)
class ReferenceEval:
    """``hfadapt agent-eval --reference --json`` as users run it, once: its exit code, the
    report it printed, the tail of its stderr, and the runs database it recorded into (the
    attempts, with every step's summary and numbers)."""

    code: int
    data: dict[str, Any]
    err: str
    db: Path

    def row(self, case: str) -> dict[str, Any]:
        rows = {r["case"]: r for r in self.data["cases"]}
        assert case in rows, (case, sorted(rows))
        return rows[case]

    def steps(self, case: str) -> dict[str, dict[str, Any]]:
        """The recorded steps (summary, output) of ``case``'s one attempt, by step."""
        from sqlmodel import select

        from hfadapt.db.tables import AgentAttempt

        session_id = self.row(case)["session_id"]
        with session(get_engine(str(self.db)), write=False) as s:
            (attempt,) = s.exec(select(AgentAttempt).where(AgentAttempt.session_id == session_id))
            return {st["step"]: st for st in attempt.steps or []}


_NOT_PASSED = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HFADAPT_ADAPTERS_PATH")
_HF_PATHS = {
    "HF_HOME": "",
    "HF_HUB_CACHE": "hub",
    "HF_ASSETS_CACHE": "assets",
    "HF_XET_CACHE": "xet",
    "HF_TOKEN_PATH": "token",
    "HF_STORED_TOKENS_PATH": "stored_tokens",
}


def run_reference_eval(folder: Path) -> ReferenceEval:
    """Every reference answer through the whole pipeline in a fresh process (nothing earlier
    tests left in this one: registries, caches, torch state) with its own HFADAPT_HOME and
    database under ``folder``; its HF home there too and no HF token, as every test has
    (tests/conftest.py's isolated_state, which a session's fixture runs before)."""
    hf = folder / "hf_home"
    env = {
        **{k: v for k, v in os.environ.items() if k not in _NOT_PASSED},
        "HFADAPT_HOME": str(folder / "home"),
        "HFADAPT_DB": str(folder / "reference.db"),
        **{name: str(hf / sub) if sub else str(hf) for name, sub in _HF_PATHS.items()},
    }
    db = folder / "reference.db"
    done = subprocess.run(
        [sys.executable, "-m", "hfadapt", "agent-eval", "--reference", "--json", "--db", str(db)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
        check=False,
    )
    assert done.stdout.strip(), (done.returncode, done.stderr[-4000:])
    return ReferenceEval(done.returncode, json.loads(done.stdout), done.stderr[-4000:], db)


def record_reference_eval(folder: Path, result: ReferenceEval) -> None:
    (folder / "reference.json").write_text(
        json.dumps({"code": result.code, "data": result.data, "err": result.err})
    )


def read_reference_eval(folder: Path) -> ReferenceEval:
    saved = json.loads((folder / "reference.json").read_text())
    return ReferenceEval(saved["code"], saved["data"], saved["err"], folder / "reference.db")
