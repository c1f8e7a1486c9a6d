"""Validating a draft (docs/design.md, "Validating an adapter"), each step recorded:

1. ``policy`` (here, on the parsed source; nothing runs): a quick first look, so an answer that
   could never be accepted gets its feedback at once. Not a fence.
2. In the sandbox, the only place the draft's Python runs: ``load`` (exactly one method rewrite
   of the failing target) and ``capture`` (the rewrite as a graph of ATen ops).
3. Here, on the graph only: ``graph``, ``equivalence``, ``device``, ``end_to_end``
   (:mod:`hfadapt.agent.graph_proof`). What is proven is the graph users will run.

The first failed step's exact text is the agent's feedback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from hfadapt.agent import graph_proof
from hfadapt.agent.cases import FailureCase
from hfadapt.agent.policy import check_policy
from hfadapt.agent.sandbox import SandboxLimits, StepReport, run_sandbox
from hfadapt.errors import HfadaptError
from hfadapt.untrusted import redact

SANDBOX_STEPS = ("load", "capture")
PARENT_STEPS = graph_proof.PARENT_STEPS
STEPS = ("policy", *SANDBOX_STEPS, *PARENT_STEPS)
FEEDBACK_MAX_CHARS = 4000


@dataclass
class Validation:
    steps: list[StepReport]
    accepted: bool
    adapter: dict[str, Any] = field(default_factory=dict)  # the @adapter's literal arguments
    seconds: float = 0.0
    files: dict[str, bytes] = field(default_factory=dict)  # the graph, as the sandbox gave it
    proof: graph_proof.Proof | None = None

    def failed(self) -> StepReport | None:
        for s in self.steps:
            if s.status != "pass":
                return s
        return None

    def verdicts(self) -> dict[str, str]:
        return {s.step: s.status for s in self.steps}

    def feedback(self, secrets: Iterable[str] = ()) -> str:
        """Exactly why the draft was not accepted, for the repair prompt (secrets redacted)."""
        bad = self.failed()
        if bad is None:
            return "not every step ran"
        lines = [f"Step `{bad.step}` {bad.status}: {bad.summary}"]
        out = dict(bad.output)
        if bad.step == "policy":
            lines += [f"- {p}" for p in out.get("problems", [])]
        else:
            tb = out.pop("traceback", None) or out.pop("stderr", None)
            if out:
                lines.append("Details: " + json.dumps(out, default=str, sort_keys=True))
            if tb:
                lines.append("Traceback (last lines):\n" + str(tb))
        text = redact("\n".join(lines), secrets)
        return text if len(text) <= FEEDBACK_MAX_CHARS else text[: FEEDBACK_MAX_CHARS - 3] + "..."

    def to_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "adapter": self.adapter,
            "seconds": self.seconds,
            "steps": [s.to_dict() for s in self.steps],
        }


def _policy(
    source: str, case: FailureCase, taken_names: dict[str, str] | None
) -> tuple[StepReport, dict[str, object]]:
    policy = check_policy(source, expected_target=case.target)
    problems = list(policy.problems)
    name = policy.adapter.get("name")
    if isinstance(name, str) and taken_names and name in taken_names:
        problems.append(f"the adapter name {name!r} is taken ({taken_names[name]}); choose another")
    if not case.target:
        problems.append(
            "this failure has no method to rewrite; hfadapt drafts method rewrites only"
        )
    report = StepReport(
        "policy",
        "fail" if problems else "pass",
        f"{len(problems)} problem(s): {problems[0]}"
        if problems
        else "imports, calls and structure allowed",
        {"problems": problems},
    )
    return report, dict(policy.adapter)


def _parent_steps(
    result: Validation,
    case: FailureCase,
    reads: Any,
    proof_limits: graph_proof.ProofLimits | None = None,
) -> None:
    name = str(result.adapter.get("name") or case.name)
    rule = str(result.adapter.get("rule") or case.rule_id)
    limits = proof_limits or graph_proof.DEFAULT_LIMITS
    try:  # the graph is not built here when the steps that run it run in the child
        report, proof = graph_proof.step_graph(
            result.files, case, name, rule, reads, build=not limits.in_child
        )
    except Exception as exc:  # the graph's failure, said in one line
        report, proof = StepReport("graph", "fail", _one_line(exc)), graph_proof.Proof()
    result.steps.append(report)
    result.proof = proof
    if result.failed() is not None:
        return
    if not limits.in_child:
        result.steps.extend(graph_proof.run_steps(proof, case, PARENT_STEPS[1:], limits=limits))
        return
    # The proofs run the graph: in a child process, bounded in memory, CPU and wall time.
    job = {"files": result.files, "case": case.to_dict(), "name": name, "rule": rule}
    job["reads"] = reads
    result.steps.extend(graph_proof.prove_bounded(job, PARENT_STEPS[1:], limits))


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, HfadaptError):
        return exc.one_line()
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:600]}"


def validate(
    source: str,
    case: FailureCase,
    *,
    limits: SandboxLimits | None = None,
    secrets: list[str] | None = None,
    taken_names: dict[str, str] | None = None,
    unsafe_no_isolation: bool = False,
    proof_limits: graph_proof.ProofLimits | None = None,
) -> Validation:
    """Run every step on one draft; stop at the first that fails. A draft is accepted only when
    every step ran and passed (a case without a model to run on cannot be accepted)."""
    start = time.monotonic()
    report, adapter = _policy(source, case, taken_names)
    result = Validation([report], False, adapter)
    if report.status != "pass":
        result.seconds = time.monotonic() - start
        return result
    job = {
        "case": case.to_dict(),
        "steps": list(SANDBOX_STEPS),
        # transformers costs ~2 s to import: only when the draft or the case needs it.
        "import_transformers": "transformers" in source + json.dumps(case.to_dict()),
    }
    run = run_sandbox(source, job, limits, secrets=secrets, unsafe_no_isolation=unsafe_no_isolation)
    result.steps.extend(run.steps)
    reported = {s.step for s in run.steps}
    if result.failed() is None and reported != set(SANDBOX_STEPS):
        # The worker died between steps (or before the first): say so, with its last words.
        result.steps.append(
            StepReport(
                "sandbox",
                "error",
                f"the sandbox stopped before reporting every step: {run.killed or f'exit code {run.exit_code}'}",
                {"stderr": run.stderr_tail},
                run.seconds,
            )
        )
    if result.failed() is None:
        result.files = run.files
        capture = next(s for s in run.steps if s.step == "capture")
        _parent_steps(result, case, capture.output.get("reads"), proof_limits)
    done = {s.step for s in result.steps}
    result.accepted = all(s.status == "pass" for s in result.steps) and set(STEPS) <= done
    result.seconds = time.monotonic() - start
    return result
