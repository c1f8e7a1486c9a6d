"""Validating a draft (docs/design.md, "Validating an adapter"), each step recorded: the AST policy
here, in this process, without running anything; then, in the sandbox, loading it, float64
equivalence with negative controls, the fingerprint gone on the device with no new violation,
and the end-to-end cosines. The first failed step's exact text is the agent's feedback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from hfadapt.agent import end_to_end, outputs
from hfadapt.agent.cases import FailureCase
from hfadapt.agent.policy import check_policy
from hfadapt.agent.sandbox import SandboxLimits, SandboxRun, StepReport, run_sandbox

SANDBOX_STEPS = ("load", "equivalence", "device", "end_to_end")
ALL_STEPS = ("policy", *SANDBOX_STEPS)
FEEDBACK_MAX_CHARS = 4000


@dataclass
class Validation:
    steps: list[StepReport]
    accepted: bool
    adapter: dict[str, Any] = field(default_factory=dict)  # the @adapter's literal arguments
    seconds: float = 0.0

    def failed(self) -> StepReport | None:
        for s in self.steps:
            if s.status not in ("pass", "skip"):
                return s
        return None

    def verdicts(self) -> dict[str, str]:
        return {s.step: s.status for s in self.steps}

    def feedback(self) -> str:
        """Exactly why the draft was not accepted, for the repair prompt."""
        bad = self.failed()
        if bad is None:
            skipped = [s.step for s in self.steps if s.status == "skip"]
            return f"steps not run or skipped: {', '.join(skipped) or 'none'}"
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
        text = "\n".join(lines)
        return text if len(text) <= FEEDBACK_MAX_CHARS else text[: FEEDBACK_MAX_CHARS - 3] + "..."

    def to_dict(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "adapter": self.adapter,
            "seconds": self.seconds,
            "steps": [s.to_dict() for s in self.steps],
        }


def _judge_outputs(
    steps: list[StepReport], case: FailureCase, run: SandboxRun, job: dict[str, Any]
) -> None:
    """The parent's own verdict on the draft's outputs (it never imported the draft): a passed
    ``equivalence`` step of the sandbox stands only if these numbers pass too."""
    eq = next((s for s in steps if s.step == "equivalence" and s.status == "pass"), None)
    if eq is None:
        return
    data = run.files.get(outputs.FILE)
    if not data:
        eq.output["parent_proof"] = "not run: the sandbox wrote no outputs (only method adapters)"
        return
    example = trusted_example(case)
    if example is None:
        eq.output["parent_proof"] = "not run: the case has no trusted example inputs"
        return
    from safetensors.torch import load

    try:
        produced = load(data)
    except Exception as exc:  # untrusted bytes: a malformed file is the draft's failure
        eq.status, eq.summary = "fail", f"the sandbox's outputs do not read as safetensors: {exc}"
        return
    from hfadapt.adapters.equivalence import DEFAULT_SEEDS

    seeds = list(job.get("seeds") or DEFAULT_SEEDS)
    original = stock_callable(case.target or "")
    status, summary, numbers = outputs.judge(
        original, example, seeds, produced, getattr(torch, case.run_dtype)
    )
    eq.output["parent_proof"] = numbers
    if status != "pass":
        eq.status, eq.summary = "fail", f"parent proof: {summary}"
    else:
        eq.summary = f"{eq.summary}; parent proof: {summary}"


def _judge_end_to_end(steps: list[StepReport], case: FailureCase, run: SandboxRun) -> None:
    """The parent's own end-to-end cosines on the sandbox's outputs (``parent_check`` in the
    step's output): a passed ``end_to_end`` step stands only if these pass too."""
    e2e = next((s for s in steps if s.step == "end_to_end" and s.status == "pass"), None)
    if e2e is None:
        return
    data = run.files.get(end_to_end.FILE)
    if not data:
        e2e.status, e2e.summary = "fail", "the sandbox passed end to end but wrote no outputs"
        return
    status, summary, numbers = end_to_end.judge(case.model or {}, data)
    e2e.output["parent_check"] = numbers or summary
    if status == "fail":
        e2e.status, e2e.summary = "fail", f"parent check: {summary}"
    elif status == "pass":
        e2e.summary = f"{e2e.summary}; parent check: {summary}"


def trusted_example(case: FailureCase) -> Any:
    """The case's example builder (captured calls or a named builder), never the draft's."""
    from hfadapt.agent.cases import captured_example, resolve_ref

    if case.example:
        return resolve_ref(case.example)
    if case.example_file:
        return captured_example(case.example_file)
    return None


def stock_callable(target: str) -> Any:
    """The stock code at ``module:Class.method``, imported here (trusted code, not the draft)."""
    import importlib

    module_name, _, qual = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def validate(
    source: str,
    case: FailureCase,
    *,
    limits: SandboxLimits | None = None,
    secrets: list[str] | None = None,
    steps: Iterable[str] = SANDBOX_STEPS,
    allow_skip: Iterable[str] = (),
    taken_names: dict[str, str] | None = None,
    seeds: Iterable[int] | None = None,
    unsafe_no_isolation: bool = False,
) -> Validation:
    """Run every step on one draft; stop at the first that fails."""
    start = time.monotonic()
    wanted = [s for s in SANDBOX_STEPS if s in set(steps)]
    policy = check_policy(source, expected_target=case.target)
    problems = list(policy.problems)
    name = policy.adapter.get("name")
    if isinstance(name, str) and taken_names and name in taken_names:
        problems.append(f"the adapter name {name!r} is taken ({taken_names[name]}); choose another")
    report = StepReport(
        "policy",
        "fail" if problems else "pass",
        f"{len(problems)} problem(s): {problems[0]}"
        if problems
        else "imports, calls and structure allowed",
        {"problems": problems},
    )
    result = Validation([report], False, policy.adapter)
    if problems or not wanted:
        result.seconds = time.monotonic() - start
        result.accepted = not problems and not wanted
        return result

    job = {
        "case": case.to_dict(),
        "steps": wanted,
        "seeds": list(seeds) if seeds else None,
        # transformers costs ~2 s to import: only when the draft or the case needs it.
        "import_transformers": "transformers" in source + json.dumps(case.to_dict())
        or bool(case.model and "ref" in case.model),
    }
    run = run_sandbox(source, job, limits, secrets=secrets, unsafe_no_isolation=unsafe_no_isolation)
    result.steps.extend(run.steps)
    _judge_outputs(result.steps, case, run, job)
    _judge_end_to_end(result.steps, case, run)
    reported = {s.step for s in run.steps}
    if not any(s.status not in ("pass", "skip") for s in run.steps) and reported != set(wanted):
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
    skippable = set(allow_skip)
    result.accepted = all(
        s.status == "pass" or (s.status == "skip" and s.step in skippable) for s in result.steps
    ) and (reported == set(wanted))
    result.seconds = time.monotonic() - start
    return result
