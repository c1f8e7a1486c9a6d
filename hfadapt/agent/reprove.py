"""Re-proving an accepted graph adapter (``hfadapt adapters verify NAME``): the same proofs the
parent ran at acceptance, on the graph as stored, from the case stored in its manifest. Nothing
drafted runs, so no sandbox is needed. The case's example inputs are rebuilt by trusted code:
hfadapt's builder, or calls captured again from the case's model (which must be available:
bundled, in the HF cache, or a local folder)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfadapt.adapters.api import Adapter
from hfadapt.adapters.graph_adapter import read_manifest
from hfadapt.agent import graph_proof
from hfadapt.agent.cases import FailureCase, capture_calls
from hfadapt.agent.sandbox import StepReport
from hfadapt.errors import AdapterError, HfadaptError


@dataclass
class GraphVerify:
    name: str
    rule: str
    steps: list[StepReport] = field(default_factory=list)
    failure: str = ""

    @property
    def ok(self) -> bool:
        return not self.failure

    def step(self, name: str) -> StepReport | None:
        return next((s for s in self.steps if s.step == name), None)

    @property
    def equivalence_text(self) -> str:
        s = self.step("equivalence")
        if s is None:
            return "n/a"
        err = s.output.get("max_rel_err")
        text = f"{err:.2e}" if isinstance(err, float) else "-"
        return f"{text} ({'ok' if s.ok else 'FAILED'})"

    @property
    def device_text(self) -> str:
        s = self.step("device")
        return "n/a" if s is None else ("gone, nothing new" if s.ok else s.summary)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rule": self.rule,
            "ok": self.ok,
            "failure": self.failure,
            "form": "graph",
            "steps": [s.to_dict() for s in self.steps],
        }


def _case(a: Adapter) -> FailureCase:
    data = read_manifest(Path(a.path)).get("case")
    if not isinstance(data, dict):
        raise AdapterError(f"{a.name}: the manifest keeps no case to re-prove on")
    case = FailureCase.from_dict(data)
    if case.target != a.target:
        raise AdapterError(f"{a.name}: the stored case is for {case.target}, not {a.target}")
    if case.example and not case.example.startswith(
        ("hfadapt.agent.evalcases:", "hfadapt.adapters.examples:")
    ):
        raise AdapterError(
            f"{a.name}: the stored example builder {case.example!r} is not one of hfadapt's"
        )
    return case


def verify_graph_adapter(a: Adapter, work: Path | None = None) -> GraphVerify:
    """Every parent proof again on ``a``'s graph (equivalence, device, end to end)."""
    from hfadapt.agent.models import case_model

    result = GraphVerify(a.name, a.rule)
    try:
        case = _case(a)
        with tempfile.TemporaryDirectory(prefix="hfadapt-verify-") as tmp:
            if not case.example:
                cm = case_model(case.model)
                path = (work or Path(tmp)) / "calls.pt"
                inputs = cm.inputs
                odd = {
                    k: v[:3, :13] if hasattr(v, "dim") and v.dim() >= 2 else v
                    for k, v in inputs.items()
                }
                if not capture_calls(cm.model, [odd, inputs], case.target or "", path=path):
                    raise AdapterError(f"{a.name}: the case's model never calls {case.target}")
                case.example_file = str(path)
            proof = graph_proof.Proof(program=a.fn.program, adapter=a)  # type: ignore[attr-defined]
            proof.host_share = proof.program.host_share() if proof.program else {}
            for step in (
                graph_proof.step_equivalence,
                graph_proof.step_device,
                graph_proof.step_end_to_end,
            ):
                report = step(proof, case)
                result.steps.append(report)
                if report.status not in ("pass", "skip"):
                    result.failure = f"{report.step}: {report.summary}"
                    break
    except HfadaptError as exc:
        result.failure = exc.one_line()
    return result


__all__ = ["GraphVerify", "verify_graph_adapter"]
