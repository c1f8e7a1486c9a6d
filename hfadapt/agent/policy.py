"""The AST policy a drafted adapter must pass before any of it runs: only allowed imports; no
file, process or network access; no eval/exec/compile/__import__/open or reflective escapes;
no try/except that could fall back silently; no call back into the code it replaces.

Checked on the parsed source only; nothing of the draft is executed here."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

# Import roots a draft may use (and these exact modules of packages otherwise closed).
ALLOWED_IMPORTS = (
    "__future__",
    "math",
    "typing",
    "typing_extensions",
    "functools",
    "collections.abc",
    "torch",
    "transformers",
    "hfadapt.adapters.api",
)
# Submodules of allowed roots that reach files, processes or the network.
DENIED_IMPORTS = (
    "torch.hub",
    "torch.utils.cpp_extension",
    "torch.utils.data",
    "torch.multiprocessing",
    "torch.distributed",
    "torch.package",
    "torch.serialization",
    "torch.testing",
    "transformers.utils.hub",
    "transformers.file_utils",
    "transformers.dynamic_module_utils",
    "transformers.pipelines",
    "transformers.trainer",
    "transformers.commands",
)
DENIED_NAMES = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "__import__",
        "open",
        "breakpoint",
        "globals",
        "locals",
        "vars",
        "exit",
        "quit",
        "__builtins__",
        "__loader__",
        "__spec__",
        "memoryview",
    }
)
# Attributes that load or save files, reach the network, spawn processes or compile code.
DENIED_ATTRS = frozenset(
    {
        "load",
        "save",
        "hub",
        "from_file",
        "load_library",
        "cpp_extension",
        "multiprocessing",
        "distributed",
        "from_pretrained",
        "save_pretrained",
        "push_to_hub",
        "DataLoader",
        "system",
        "popen",
        "_getframe",
        "f_globals",
        "f_locals",
        "f_back",
        "gi_frame",
        "tb_frame",
    }
)
ALLOWED_DUNDERS = frozenset({"__name__", "__qualname__", "__doc__", "__future__"})
REFLECTIVE = frozenset({"getattr", "setattr", "delattr", "hasattr"})
DENIED_REFLECT_TARGETS = frozenset({"builtins", "__builtins__", "os", "sys", "torch", "math"})


def describe_policy() -> str:
    """The rules, worded for the system prompt."""
    return "\n".join(
        [
            f"- Import only from: {', '.join(ALLOWED_IMPORTS)} (not {', '.join(DENIED_IMPORTS)}).",
            "- No file, process or network access; no "
            + ", ".join(sorted(n for n in DENIED_NAMES if not n.startswith("__")))
            + ", __import__.",
            "- No attribute named " + ", ".join(sorted(DENIED_ATTRS)) + ", and no dunder "
            "attributes other than __name__/__qualname__/__doc__.",
            "- getattr/setattr/hasattr only with a literal attribute name, never on a module.",
            "- No try/except: a failure must surface, never fall back silently to the original.",
            "- Never call the code being replaced (Class.method, super(), type(self).method, "
            "self.method): the adapter must compute the result itself.",
            "- At module level only imports, constants, functions, classes and the @adapter.",
            "- Exactly one @adapter(...) per file, with literal name=, target= and rule=.",
        ]
    )


@dataclass
class PolicyResult:
    """The problems found (empty when the draft passes) and the @adapter's literal arguments."""

    problems: list[str] = field(default_factory=list)
    adapter: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def feedback(self) -> str:
        return "\n".join(f"- {p}" for p in self.problems)


def _module_allowed(name: str) -> bool:
    if any(name == d or name.startswith(d + ".") for d in DENIED_IMPORTS):
        return False
    return any(name == a or name.startswith(a + ".") for a in ALLOWED_IMPORTS)


def _decorator_args(dec: ast.expr) -> dict[str, Any] | None:
    """The literal keyword arguments of an ``@adapter(...)`` decorator, else None."""
    if not isinstance(dec, ast.Call):
        return None
    func = dec.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name != "adapter":
        return None
    out: dict[str, Any] = {}
    for kw in dec.keywords:
        if kw.arg and isinstance(kw.value, ast.Constant):
            out[kw.arg] = kw.value.value
    return out


class _Checker(ast.NodeVisitor):
    def __init__(self, method: str | None, cls: str | None) -> None:
        self.problems: list[str] = []
        self.method, self.cls = method, cls

    def bad(self, node: ast.AST, why: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {why}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not _module_allowed(alias.name):
                self.bad(node, f"import of {alias.name!r} is not allowed")
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        mod = node.module or ""
        if node.level or not _module_allowed(mod):
            self.bad(node, f"import from {'.' * node.level + mod!r} is not allowed")
        for alias in node.names:
            full = f"{mod}.{alias.name}"
            if (
                alias.name in DENIED_NAMES
                or alias.name in DENIED_ATTRS
                or (any(full == d or full.startswith(d + ".") for d in DENIED_IMPORTS))
            ):
                self.bad(node, f"import of {full!r} is not allowed")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in DENIED_NAMES:
            self.bad(node, f"use of {node.id!r} is not allowed")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if attr in DENIED_ATTRS:
            self.bad(node, f"attribute {attr!r} is not allowed (file, process or network access)")
        elif attr.startswith("__") and attr.endswith("__") and attr not in ALLOWED_DUNDERS:
            self.bad(node, f"dunder attribute {attr!r} is not allowed")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in REFLECTIVE:
            literal = len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
            on_module = bool(node.args) and (
                isinstance(node.args[0], ast.Name) and node.args[0].id in DENIED_REFLECT_TARGETS
            )
            if not literal or on_module:
                self.bad(node, f"{func.id}() needs a literal attribute name on a non-module object")
        if self.method and isinstance(func, ast.Attribute) and func.attr == self.method:
            owner = func.value
            calls_stock = (isinstance(owner, ast.Name) and owner.id in ("self", self.cls)) or (
                isinstance(owner, ast.Call)
                and isinstance(owner.func, ast.Name)
                and owner.func.id in ("super", "type")
            )
            if calls_stock:
                self.bad(node, f"calls the code it replaces ({ast.unparse(func)}): no fallback")
        if isinstance(func, ast.Attribute) and func.attr == "original":
            self.bad(node, "calls .original(): an adapter must not fall back to the stock code")
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        if node.handlers:
            self.bad(
                node, "try/except is not allowed: it can hide a failure and fall back silently"
            )
        self.generic_visit(node)

    visit_TryStar = visit_Try  # type: ignore[assignment]

    def visit_Global(self, node: ast.Global) -> None:
        self.bad(node, "global is not allowed")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.bad(node, "nonlocal is not allowed")


_TOP_LEVEL_OK = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
    ast.If,  # if TYPE_CHECKING:
)


def check_policy(source: str, *, expected_target: str | None = None) -> PolicyResult:
    """Check a draft's source without running it."""
    result = PolicyResult()
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        result.problems.append(f"line {exc.lineno}: syntax error: {exc.msg}")
        return result

    decorators = [
        (fn, args)
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for dec in fn.decorator_list
        if (args := _decorator_args(dec)) is not None
    ]
    if len(decorators) != 1:
        result.problems.append(
            f"the file must define exactly one @adapter(...); found {len(decorators)}"
        )
    else:
        result.adapter = dict(decorators[0][1])
        result.adapter["function"] = decorators[0][0].name
        for key in ("name", "target", "rule"):
            if not isinstance(result.adapter.get(key), str):
                result.problems.append(f"@adapter needs a literal string {key}=")
    target = result.adapter.get("target") if isinstance(result.adapter.get("target"), str) else None
    if expected_target and target and target != expected_target:
        result.problems.append(
            f"@adapter target={target!r}, but the failing code is {expected_target!r}"
        )

    qual = (target or expected_target or "").partition(":")[2]
    cls, _, method = qual.partition(".")
    for node in tree.body:
        is_doc = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        type_checking = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        allowed = isinstance(node, _TOP_LEVEL_OK) and (
            not isinstance(node, ast.If) or type_checking
        )
        if not (allowed or is_doc):
            result.problems.append(
                f"line {node.lineno}: only imports, constants, functions and classes at module level"
            )
    checker = _Checker(method or ("forward" if cls else None), cls or None)
    checker.visit(tree)
    result.problems.extend(checker.problems)
    return result
