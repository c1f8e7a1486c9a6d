"""A failure the agent works on: a fingerprint with its evidence, the code that raised it
(target to replace, source of the enclosing function), how to build example inputs for the
equivalence proof, and the model to judge on the device. Plain data, so it crosses into the
sandbox as JSON; everything it names to import is hfadapt's or the model library's code."""

from __future__ import annotations

import ast
import inspect
import pkgutil
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from hfadapt.spyre.lowering_report import SourceLocation, Violation


@dataclass
class FailureCase:
    name: str  # a short label: the suite case name, or the fingerprint
    fingerprint: str
    rule_id: str
    op: str
    message: str  # the device's own error text
    target: str | None = None  # "module:Class.method" the adapter should replace, if known
    kind: str = "method"
    location: str = ""  # "file:line in function"
    code_line: str = ""
    dtype: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)
    enclosing_source: str = ""
    # Inputs for the equivalence proof: a builder "pkg.mod:fn" (seed -> module, args, kwargs)
    # or a file of captured calls; else the draft's own example= is used (and says so).
    example: str | None = None
    example_file: str | None = None
    # The model to judge on the device: {"builder": "pkg.mod:fn"} (seed -> model, inputs) or
    # {"ref": model id or folder, "structural": bool}.
    model: dict[str, Any] | None = None
    profile: str | None = None
    execution: str = "eager"
    run_dtype: str = "float16"
    registry: str = "default"  # the adapters applied besides the draft: default | none
    without_adapters: list[str] = field(default_factory=list)  # left out of "default"
    # How the device step recognises this failure: by fingerprint (rule, op, dtype, call site),
    # or by rule and op alone ("rule_op") for the eval suite's one-site modules, whose call
    # site lies in hfadapt and so is attributed to whichever caller runs them.
    match: str = "fingerprint"

    def is_this(self, violation: Violation) -> bool:
        if violation.fingerprint() == self.fingerprint:
            return True
        return self.match == "rule_op" and (violation.rule_id, violation.op) == (
            self.rule_id,
            self.op,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FailureCase:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def module_name_for(file: str) -> str | None:
    """The importable module a source file is, from sys.modules or the site-packages path."""
    resolved = str(Path(file).resolve())
    for name, mod in list(sys.modules.items()):
        mod_file = getattr(mod, "__file__", None)
        if mod_file and str(Path(mod_file).resolve()) == resolved:
            return name
    short = SourceLocation(file, 0, "").short_file
    if short.endswith(".py") and "/" in short:
        return short[: -len(".py")].replace("/", ".").removesuffix(".__init__")
    return None


def _enclosing(tree: ast.Module, line: int) -> list[ast.stmt]:
    """The chain of class/function definitions around ``line``, outermost first."""
    chain: list[ast.stmt] = []
    body: list[ast.stmt] = tree.body
    while True:
        for node in body:
            defines = isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            if defines and node.lineno <= line <= (node.end_lineno or node.lineno):
                chain.append(node)
                body = node.body  # type: ignore[attr-defined]
                break
        else:
            return chain


def locate(location: SourceLocation) -> tuple[str | None, str]:
    """(target "module:Class.method" or None, source of the enclosing function)."""
    try:
        text = Path(location.file).read_text(encoding="utf-8")
        chain = _enclosing(ast.parse(text), location.line)
    except (OSError, SyntaxError, ValueError):
        return None, location.code
    if not chain:
        return None, location.code
    func = chain[-1]
    lines = text.splitlines()
    start = min([func.lineno, *(d.lineno for d in getattr(func, "decorator_list", []))])
    source = "\n".join(lines[start - 1 : func.end_lineno])
    module = module_name_for(location.file)
    names = [getattr(n, "name", "") for n in chain]
    # A method of a class is patchable; a module-level helper (rotate_half) is not by itself.
    if module and len(chain) >= 2 and isinstance(chain[-2], ast.ClassDef):
        return f"{module}:{names[-2]}.{names[-1]}", source
    return None, source


def from_violation(
    violation: Violation,
    *,
    model: dict[str, Any] | None = None,
    execution: str = "eager",
    profile: str | None = None,
    evidence: dict[str, Any] | None = None,
    example_file: str | None = None,
) -> FailureCase:
    """A case for one violation met on the device."""
    target, source = (None, "")
    if violation.location is not None:
        target, source = locate(violation.location)
    return FailureCase(
        name=violation.fingerprint(),
        fingerprint=violation.fingerprint(),
        rule_id=violation.rule_id,
        op=violation.op,
        message=violation.message,
        target=target,
        location=str(violation.location or ""),
        code_line=violation.location.code if violation.location else "",
        dtype=violation.dtype,
        evidence={
            "shapes": [list(s) for s in violation.shapes],
            "dtypes": list(violation.dtypes),
            "kind": violation.kind,
            **(evidence or {}),
        },
        enclosing_source=source,
        example_file=example_file,
        model=model,
        profile=profile,
        execution=execution,
    )


def target_source(target: str | None) -> str:
    """Source of the method a target names ("" when it cannot be found)."""
    if not target:
        return ""
    try:
        return inspect.getsource(pkgutil.resolve_name(target))
    except (ImportError, AttributeError, OSError, TypeError):
        return ""


def capture_calls(model: Any, runs: list[Any], target: str, *, per_run: int = 1, path: Path) -> int:
    """Run ``model`` on CPU on each input set of ``runs`` and save the first ``per_run`` calls of
    the target class's instances (module, args, kwargs) to ``path``, for the equivalence proof.
    Returns how many calls were captured."""
    import copy

    import torch

    module_name, _, qual = target.partition(":")
    cls = pkgutil.resolve_name(f"{module_name}:{qual.split('.')[0]}")
    captured: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    budget = [0]

    def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if budget[0] > 0:
            budget[0] -= 1
            clone = copy.deepcopy(module)
            for sub in clone.modules():  # the copy must not carry this (unpicklable) hook
                sub._forward_pre_hooks.clear()
                sub._forward_pre_hooks_with_kwargs.clear()
            captured.append((clone, copy.deepcopy(args), copy.deepcopy(kwargs)))

    handles = [
        m.register_forward_pre_hook(hook, with_kwargs=True)
        for m in model.modules()
        if isinstance(m, cls)
    ]
    try:
        with torch.no_grad():
            for inputs in runs:
                budget[0] = per_run
                model(**inputs) if isinstance(inputs, dict) else model(*inputs)
    finally:
        for h in handles:
            h.remove()
    if captured:
        torch.save(captured, path)
    return len(captured)


def captured_example(path: str) -> Any:
    """An example builder over captured calls: seed i < n replays call i; later seeds keep the
    shapes and redraw the main input with its captured mean and spread."""
    import torch

    calls = torch.load(path, weights_only=False)

    def example(seed: int) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        module, args, kwargs = calls[seed % len(calls)]
        if seed < len(calls) or not args or not isinstance(args[0], torch.Tensor):
            return module, args, kwargs
        # Only the main input (hidden states) is redrawn: masks and ids keep their meaning.
        x = args[0]
        if not x.is_floating_point() or x.numel() < 2:
            return module, args, kwargs
        g = torch.Generator().manual_seed(seed)
        std = float(x.double().std()) or 1.0
        fresh = torch.randn(x.shape, generator=g, dtype=x.dtype) * std + float(x.double().mean())
        return module, (fresh, *args[1:]), kwargs

    return example
