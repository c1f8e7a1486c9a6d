"""The steps that run inside the sandbox worker, the only place a draft's Python ever runs: load
the draft (exactly one ``@adapter``, a method rewrite of the failing target), then capture it as
a graph of ATen ops on the case's example inputs (:mod:`hfadapt.graphs.capture`). The graph
leaves as data; the parent validates it and proves everything else. Each step returns
(status, one-line summary, output)."""

from __future__ import annotations

import base64
import pkgutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hfadapt.adapters import api as adapter_api
from hfadapt.adapters.api import Adapter
from hfadapt.agent.cases import KINDS, FailureCase, captured_example, draft_call

StepResult = tuple[str, str, dict[str, Any]]
GRAPH_FILES = ("graph.json", "constants.safetensors")


class Context:
    """What one sandbox run accumulates from step to step."""

    def __init__(self, job: dict[str, Any], emit: Callable[[dict[str, Any]], None]) -> None:
        self.job = job
        self.emit = emit
        self.case = FailureCase.from_dict(job["case"])
        self.adapter: Adapter | None = None

    @property
    def draft(self) -> Adapter:
        if self.adapter is None:
            raise RuntimeError("the draft was not loaded")
        return self.adapter


def import_draft(path: Path) -> list[Adapter]:
    """Run the draft's file (here, in the sandbox) and return the adapters it registered."""
    import types

    text = path.read_bytes().decode("utf-8")
    code = compile(text, "draft.py", "exec", dont_inherit=True)
    module = types.ModuleType("hfadapt_draft")
    with adapter_api.collected() as found:
        exec(code, module.__dict__)
    return found


def step_load(ctx: Context) -> StepResult:
    found = import_draft(Path(ctx.job["draft_path"]))
    if len(found) != 1:
        return "fail", f"the file registers {len(found)} adapters; it must register exactly one", {}
    a = found[0]
    info = {"name": a.name, "kind": a.kind, "target": a.target, "rule": a.rule}
    if a.kind != "method":
        return (
            "fail",
            f"kind {a.kind!r}: this failure is fixed by rewriting {ctx.case.target} (kind "
            "'method'); a pre-hook or attention function cannot be captured for it",
            info,
        )
    if a.target != ctx.case.target:
        return "fail", f"target {a.target!r} is not the failing code {ctx.case.target!r}", info
    kind = ctx.case.kind if ctx.case.kind in KINDS else "method"
    if kind == "function":
        pkgutil.resolve_name(a.target)  # imports the target module: a wrong target fails here
    else:
        a.target_class()  # imports the target module: a wrong target fails here, with its reason
    ctx.adapter = a
    what = "a method rewrite" if kind == "method" else f"a rewrite of the {kind}"
    return "pass", f"loaded {a.name}: {what} {a.target} (rule {a.rule})", info


def example_inputs(case: FailureCase) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The first example call (module, args, kwargs) from the case's trusted inputs: a named
    builder of hfadapt's, or calls captured from the model by the parent."""
    if case.example:
        return pkgutil.resolve_name(case.example)(0)  # type: ignore[no-any-return]
    if case.example_file:
        return captured_example(case.example_file)(0)  # type: ignore[no-any-return]
    raise RuntimeError("the case has no example inputs to capture the draft on")


def step_capture(ctx: Context) -> StepResult:
    from hfadapt.graphs.capture import capture_method
    from hfadapt.graphs.reads import record_reads

    module, args, kwargs = example_inputs(ctx.case)
    module = module.float().eval() if isinstance(module, torch.nn.Module) else module
    start = time.monotonic()
    with torch.no_grad(), record_reads(module) as reads:
        fn = draft_call(ctx.draft.fn, ctx.case.kind)
        artifact = capture_method(module, fn, tuple(args), dict(kwargs))
    folder = Path(ctx.job.get("scratch", "/tmp")) / "graph"
    artifact.write(folder)
    for name in GRAPH_FILES:
        ctx.emit({"file": name, "b64": base64.b64encode((folder / name).read_bytes()).decode()})
    output = {
        "nodes": len(artifact.nodes),
        "inputs": len(artifact.inputs),
        "symbols": {k: list(v) for k, v in artifact.symbols.items()},
        "reads": sorted(reads)[:300],
        "seconds": round(time.monotonic() - start, 3),
    }
    return (
        "pass",
        f"captured as {len(artifact.nodes)} ATen nodes on {len(artifact.inputs)} inputs",
        output,
    )


STEPS: dict[str, Callable[[Context], StepResult]] = {
    "load": step_load,
    "capture": step_capture,
}
SANDBOX_STEPS = tuple(STEPS)
