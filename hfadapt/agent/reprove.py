"""Re-proving an accepted graph adapter (``hfadapt adapters verify NAME``): the same proofs the
parent ran at acceptance, on the graph as stored, from the case stored in its manifest. Nothing
drafted runs, so no sandbox is needed. The case's example inputs are rebuilt by trusted code:
hfadapt's builder, or calls captured again from the case's model (which must be available:
bundled, in the HF cache, or a local folder).

The proofs run in a child process under :data:`hfadapt.agent.graph_proof.DEFAULT_LIMITS`, on the
folder as stored, against the baseline it was accepted on (the adapters its case left out stay
out, and the adapter itself is not part of the baseline). A folder that passes is recorded as
proven on this machine (:mod:`hfadapt.graphs.proven`): what lets the registry apply a graph
folder that was copied, shared or edited."""

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


REPROVE_STEPS = ("equivalence", "device", "end_to_end")


def verify_graph_adapter(
    a: Adapter,
    work: Path | None = None,
    *,
    limits: graph_proof.ProofLimits | None = None,
    record: bool = True,
) -> GraphVerify:
    """Every parent proof again on ``a``'s graph (equivalence, device, end to end); when all
    pass and ``record``, the folder (exactly as proven) is recorded as proven here."""
    from hfadapt.agent.models import case_model
    from hfadapt.graphs.proven import content_digest, record_proven

    limits = limits or graph_proof.DEFAULT_LIMITS
    result = GraphVerify(a.name, a.rule)
    try:
        folder = Path(a.path)
        before = content_digest(folder)
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
            if limits.in_child:
                job = {"folder": str(folder), "case": case.to_dict()}
                reports = graph_proof.prove_bounded(job, REPROVE_STEPS, limits, skip_ok=True)
            else:
                program = a.fn.program  # type: ignore[attr-defined]
                proof = graph_proof.Proof(program=program, adapter=a)
                proof.host_share = program.host_share()
                reports = graph_proof.run_steps(
                    proof, case, REPROVE_STEPS, skip_ok=True, limits=limits
                )
        result.steps.extend(reports)
        bad = next((r for r in reports if r.status not in ("pass", "skip")), None)
        if bad is not None:
            result.failure = f"{bad.step}: {bad.summary}"
        elif len(reports) != len(REPROVE_STEPS):
            result.failure = "not every proof reported"
        elif record:
            if content_digest(folder) != before:
                raise AdapterError(f"{a.name}: the folder changed while it was proven")
            record_proven(folder, a.name, "verified")
    except HfadaptError as exc:
        result.failure = exc.one_line()
    return result


__all__ = ["GraphVerify", "verify_graph_adapter"]
