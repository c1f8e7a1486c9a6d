"""Judging a whole captured ATen graph against the device profile before anything runs: every
node goes through ``checks.judge`` (mode "compile") with the FakeTensor values the capture
recorded, so one pass reports every violation with its call site in the model's source."""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx

from hfadapt import torch_internals as ti
from hfadapt.spyre.compile.native_ops import ALIASES
from hfadapt.spyre.rules.lowering_report import (
    LoweringReport,
    SourceLocation,
    Violation,
    qualname_at,
)
from hfadapt.spyre.rules.op_rules import judge
from hfadapt.spyre.rules.profile import FALLBACK, NATIVE, UNSUPPORTED, Profile

# Frames that are machinery, not model code: the innermost frame outside these is the call site.
_SKIP_PARTS = ("/torch/", "/functorch/", "/hfadapt/spyre/", "/contextlib.py", "/functools.py")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')


def op_name(target: object) -> str:
    """The profile's name for an FX call target: ``aten::addmm``, ``aten::pow.Tensor_Scalar``."""
    if isinstance(target, ti.OpOverload):
        name: str = target.name()
        return ALIASES.get(name, name)
    if isinstance(target, ti.OpOverloadPacket):
        return target._qualified_op_name
    if isinstance(target, ti.HigherOrderOperator):
        return f"higher_order::{target.name()}"
    return getattr(target, "__qualname__", str(target))


def parse_stack_trace(stack_trace: str | None) -> list[SourceLocation]:
    """Frames of an FX ``stack_trace`` (outermost first), each with its code line."""
    frames: list[SourceLocation] = []
    if not stack_trace:
        return frames
    lines = stack_trace.splitlines()
    for i, text in enumerate(lines):
        match = _FRAME.match(text)
        if not match:
            continue
        code = ""
        if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]):
            code = lines[i + 1].strip()
            if code and set(code) <= set("^~ "):  # Python 3.11 caret markers, not code
                code = ""
        frames.append(
            SourceLocation(
                file=match["file"],
                line=int(match["line"]),
                function=match["func"].strip(),
                code=code,
            )
        )
    return frames


def _is_machinery(file: str) -> bool:
    path = file.replace("\\", "/")
    return file.startswith("<") or any(part in path for part in _SKIP_PARTS)


def source_location(node: fx.Node) -> SourceLocation | None:
    """The model source line a node came from: the innermost frame of its stack trace that
    is not torch or hfadapt's own machinery."""
    frames = parse_stack_trace(node.meta.get("stack_trace"))
    for frame in reversed(frames):
        if not _is_machinery(frame.file):  # with its qualified name, as an eager run has it
            return replace(frame, qualname=qualname_at(frame.file, frame.line, frame.function))
    return frames[-1] if frames else None


def _meta(value: Any) -> Any:
    """A node's recorded value (FakeTensor, SymInt, ...) in place of the node."""
    return fx.node.map_arg(value, lambda n: n.meta.get("val"))


def _is_symbolic(value: object) -> bool:
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return True
    shape = getattr(value, "shape", None)
    return shape is not None and any(not isinstance(s, int) for s in shape)


def _first_location(node: fx.Node) -> SourceLocation | None:
    for user in node.users:
        loc = source_location(user)
        if loc is not None:
            return loc
    return None


@dataclass
class GraphCheck:
    """The verdict on one graph: the report and each call node's outcome."""

    report: LoweringReport
    outcomes: dict[fx.Node, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.report.ok


def _dynamic_violation(p: Profile, node: fx.Node) -> Violation:
    spec = p.layout["dynamic_shape"]
    value = node.meta.get("val")
    shape = list(getattr(value, "shape", ())) if hasattr(value, "shape") else [value]
    shown = [s if isinstance(s, int) else str(s) for s in shape]
    dtype = str(getattr(value, "dtype", "")).removeprefix("torch.")
    return Violation(
        rule_id=spec["rule"],
        op="graph_input",
        message=spec["text"].format(shape=shown),
        kind="layout",
        dtypes=(dtype,) if dtype else (),
        shapes=(tuple(s if isinstance(s, int) else -1 for s in shape),),
        location=_first_location(node),
    )


def check_graph(
    gm: fx.GraphModule, profile: Profile, report: LoweringReport | None = None
) -> GraphCheck:
    """Judge every node of an ATen graph (values in node.meta["val"]); collect every violation
    into ``report`` (a new one if not given), count fallbacks and ops seen."""
    if report is None:
        report = LoweringReport(
            profile_name=profile.name, profile_version=profile.version, mode="compile"
        )
    result = GraphCheck(report=report)
    dynamic = False
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if node.op == "placeholder":
            if _is_symbolic(value):
                dynamic = True
                report.add(_dynamic_violation(profile, node))
            if getattr(value, "dtype", None) == torch.int64:
                report.downcasts += 1  # moved to the device as int32
            continue
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        op = op_name(node.target)
        report.ops_seen[op] += 1
        if not dynamic and _is_symbolic(value):
            # a data-dependent size (nonzero, unique, ...) with static inputs
            dynamic = True
            report.add(
                Violation(
                    **{
                        **_dynamic_violation(profile, node).__dict__,
                        "op": op,
                        "location": source_location(node),
                    }
                )
            )
        outcome, _rule, found = judge(
            profile,
            op,
            _meta(node.args),
            _meta(node.kwargs),
            "compile",
            outputs=node.meta.get("val"),
            location=source_location(node),
        )
        result.outcomes[node] = outcome
        for violation in found:
            report.add(violation)
        if outcome == FALLBACK:
            report.fallbacks[op] += 1
    return result


__all__ = [
    "FALLBACK",
    "NATIVE",
    "UNSUPPORTED",
    "GraphCheck",
    "check_graph",
    "op_name",
    "parse_stack_trace",
    "source_location",
]
