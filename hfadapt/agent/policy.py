"""A first, cheap look at a draft before it goes to the sandbox: the parsed source only (nothing
of it runs here), so that an answer which could never be accepted gets its feedback in
milliseconds. It is not a fence: no allowlist on Python source can contain Python, and the
draft runs only inside the OS sandbox whatever this says. What leaves the sandbox is a graph of
ATen ops that the parent validates and proves (docs/security.md).

Top level: a docstring, imports from ``ALLOWED_MODULES``, literal constants, and function
definitions, exactly one decorated ``@adapter(...)`` with literal arguments. Inside functions:
names are parameters, locals, the file's own imports/constants/functions or ``SAFE_BUILTINS``;
no dunder or private (``_``) attribute; an attribute of an imported module must resolve (looked
up here, in the trusted process) to a function, class or value, never to a module outside
``ALLOWED_MODULES`` or a name in ``DENIED_ATTRS``; no global/nonlocal, no import, no
try/except, no call back into the code being replaced."""

from __future__ import annotations

import ast
import importlib
import sys
import types
from dataclasses import dataclass, field
from typing import Any

# Modules a draft may import (whole module, or names from it).
ALLOWED_MODULES = frozenset(
    {
        "__future__",
        "math",
        "typing",
        "torch",
        "torch.nn",
        "torch.nn.functional",
        "torch.linalg",
        "torch.special",
        "hfadapt.adapters.api",
    }
)
# Names a draft may import from the adapter API.
API_NAMES = frozenset({"adapter"})
SAFE_BUILTINS = frozenset(
    {
        "abs",
        "all",
        "any",
        "bool",
        "dict",
        "divmod",
        "enumerate",
        "filter",
        "float",
        "frozenset",
        "int",
        "isinstance",
        "len",
        "list",
        "map",
        "max",
        "min",
        "pow",
        "range",
        "reversed",
        "round",
        "set",
        "slice",
        "sorted",
        "str",
        "sum",
        "tuple",
        "zip",
        "True",
        "False",
        "None",
        "ValueError",
        "TypeError",
        "RuntimeError",
        "NotImplementedError",
    }
)
# Attributes refused wherever they appear: files, processes, native code, operator registries.
DENIED_ATTRS = frozenset(
    {
        "os",
        "sys",
        "ctypes",
        "builtins",
        "importlib",
        "subprocess",
        "socket",
        "ops",
        "library",
        "classes",
        "utils",
        "hub",
        "jit",
        "compiler",
        "backends",
        "cuda",
        "mps",
        "distributed",
        "multiprocessing",
        "package",
        "serialization",
        "fx",
        "export",
        "onnx",
        "overrides",
        "load",
        "save",
        "from_file",
        "load_library",
        "from_pretrained",
        "save_pretrained",
        "push_to_hub",
        "storage",
        "untyped_storage",
        "tofile",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_module_forward_hook",
        "apply",
        "modules",
        "named_modules",
        "children",
        "f_globals",
        "f_locals",
        "f_back",
        "gi_frame",
        "tb_frame",
        "cr_frame",
        "func_globals",
        "original",
    }
)
# What reaches the builtins, the interpreter or the code being judged.
DENIED_NAMES = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "__import__",
        "open",
        "getattr",
        "setattr",
        "delattr",
        "hasattr",
        "globals",
        "locals",
        "vars",
        "dir",
        "type",
        "super",
        "object",
        "breakpoint",
        "input",
        "memoryview",
        "exit",
        "quit",
        "help",
        "id",
        "classmethod",
        "staticmethod",
        "property",
        "print",
    }
)

# Denied builtins a parameter may still be called (``forward(self, input)`` is common); the rest
# may not be bound at all, so no default value or nested scope can smuggle the builtin in.
UNBINDABLE = DENIED_NAMES - {"input", "id", "dir", "help", "print", "object", "property"}


def describe_policy() -> str:
    """The rules, worded for the system prompt."""
    return "\n".join(
        [
            "- Top level holds only: a docstring, imports, literal constants (NAME = 1.0), and "
            "function definitions; exactly one function carries @adapter(name=..., target=..., "
            "rule=...) with literal arguments. No classes, no `if`, no other statements.",
            f"- Import only: {', '.join(sorted(ALLOWED_MODULES - {'__future__'}))} "
            f"(from hfadapt.adapters.api only: {', '.join(sorted(API_NAMES))}).",
            "- Inside functions use parameters, local variables, the file's imports and "
            "constants, and these builtins: "
            + ", ".join(sorted(SAFE_BUILTINS - {"True", "False", "None"}))
            + ". Not: "
            + ", ".join(sorted(DENIED_NAMES))
            + ".",
            "- No attribute that starts with `_` (no dunders), none named "
            + ", ".join(sorted(DENIED_ATTRS))
            + ", and no attribute of a module that is itself a module outside the allowed imports.",
            "- No try/except, global, nonlocal, import inside a function: a failure must surface.",
            "- Never call the code being replaced (Class.method, self.method, .original()): the "
            "adapter must compute the result itself.",
        ]
    )


@dataclass
class PolicyResult:
    """The problems found (empty when the file passes) and the @adapter's literal arguments."""

    problems: list[str] = field(default_factory=list)
    adapter: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def feedback(self) -> str:
        return "\n".join(f"- {p}" for p in self.problems)


def _literal(node: ast.expr) -> bool:
    try:
        ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False
    return True


def _adapter_call(dec: ast.expr) -> ast.Call | None:
    if isinstance(dec, ast.Call) and isinstance(dec.func, ast.Name) and dec.func.id == "adapter":
        return dec
    return None


def _resolve(value: object, attr: str) -> tuple[bool, Any]:
    """The attribute of an allowed module, looked up without running any draft code."""
    try:
        return True, getattr(value, attr)
    except Exception:  # a lazy attribute that fails: refuse rather than guess
        return False, None


class _Body(ast.NodeVisitor):
    """Checks one top-level function (and what is nested in it)."""

    def __init__(self, known: dict[str, object], method: str | None, cls: str | None) -> None:
        self.problems: list[str] = []
        self.known = known  # top-level name -> module object, or None for a constant/function
        self.method, self.cls = method, cls
        self.local: set[str] = set()

    def bad(self, node: ast.AST, why: str) -> None:
        self.problems.append(f"line {getattr(node, 'lineno', '?')}: {why}")

    def check(self, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for node in ast.walk(fn):
            if isinstance(node, ast.arg):
                self.local.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                self.local.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.local.add(node.name)
        for name in sorted(self.local & UNBINDABLE):
            self.bad(fn, f"the name {name!r} may not be bound (it names a reflective builtin)")
        for stmt in fn.body:
            self.visit(stmt)
        for arg in [*fn.args.defaults, *(d for d in fn.args.kw_defaults if d is not None)]:
            self.visit(arg)

    def visit_Name(self, node: ast.Name) -> None:
        name = node.id
        if name in self.local and name not in UNBINDABLE and not name.startswith("__"):
            return
        if name in DENIED_NAMES or name.startswith("__"):
            self.bad(node, f"use of {name!r} is not allowed")
        elif name not in self.local and name not in self.known and name not in SAFE_BUILTINS:
            self.bad(node, f"name {name!r} is not a parameter, local, import or allowed builtin")

    def _chain(self, node: ast.Attribute) -> tuple[ast.expr, list[ast.Attribute]]:
        chain: list[ast.Attribute] = []
        cur: ast.expr = node
        while isinstance(cur, ast.Attribute):
            chain.append(cur)
            cur = cur.value
        return cur, chain[::-1]

    def visit_Attribute(self, node: ast.Attribute) -> None:
        root, chain = self._chain(node)
        for link in chain:
            if link.attr.startswith("_"):
                self.bad(link, f"attribute {link.attr!r} is not allowed (private or dunder)")
                return
            if link.attr in DENIED_ATTRS:
                self.bad(link, f"attribute {link.attr!r} is not allowed")
                return
        name = root.id if isinstance(root, ast.Name) else ""
        module = self.known.get(name)
        if isinstance(module, types.ModuleType) and name not in self.local:
            value: Any = module
            for link in chain:
                ok, value = _resolve(value, link.attr)
                if not ok:
                    self.bad(link, f"{ast.unparse(link)} does not resolve")
                    return
                if isinstance(value, types.ModuleType) and value.__name__ not in ALLOWED_MODULES:
                    self.bad(link, f"{ast.unparse(link)} is the module {value.__name__!r}")
                    return
        self.visit(root)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if self.method and isinstance(func, ast.Attribute) and func.attr == self.method:
            owner = func.value
            if isinstance(owner, ast.Name) and owner.id in ("self", self.cls):
                self.bad(node, f"calls the code it replaces ({ast.unparse(func)}): no fallback")
        self.generic_visit(node)

    def _refuse(self, node: ast.stmt, what: str) -> None:
        self.bad(node, f"{what} is not allowed inside an adapter")

    def visit_Try(self, node: ast.Try) -> None:
        self._refuse(node, "try/except (it can hide a failure and fall back silently)")

    visit_TryStar = visit_Try  # type: ignore[assignment]

    def visit_Global(self, node: ast.Global) -> None:
        self._refuse(node, "global")

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self._refuse(node, "nonlocal")

    def visit_Import(self, node: ast.Import) -> None:
        self._refuse(node, "import")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self._refuse(node, "import")

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._refuse(node, "a class definition")


def _import_module(name: str) -> Any:
    return sys.modules.get(name) or importlib.import_module(name)


def check_policy(source: str, *, expected_target: str | None = None) -> PolicyResult:
    """Check an agent-origin adapter's source without running any of it."""
    result = PolicyResult()
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", "?")
        result.problems.append(f"line {line}: syntax error: {getattr(exc, 'msg', exc)}")
        return result
    top = _TopLevel(result.problems)
    for i, node in enumerate(tree.body):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and i == 0:
            continue  # the docstring
        top.check(node)
    _check_decorator(result, top.decorated)
    target = result.adapter.get("target") if isinstance(result.adapter.get("target"), str) else None
    if expected_target and target and target != expected_target:
        result.problems.append(
            f"@adapter target={target!r}, but the failing code is {expected_target!r}"
        )
    qual = (target or expected_target or "").partition(":")[2]
    cls, _, method = qual.partition(".")
    for fn in top.functions:
        body = _Body(top.known, method or ("forward" if cls else None), cls or None)
        body.check(fn)
        result.problems.extend(body.problems)
    shadowing = sorted(k for k in top.known if k in DENIED_NAMES or k in SAFE_BUILTINS)
    if shadowing:
        result.problems.append(f"top-level names shadow builtins: {', '.join(shadowing)}")
    return result


def _check_decorator(
    result: PolicyResult, decorated: list[tuple[ast.FunctionDef, ast.Call]]
) -> None:
    """Exactly one ``@adapter(...)``, whose name, target and rule are literal strings."""
    if len(decorated) != 1:
        result.problems.append(
            f"the file must define exactly one @adapter(...); found {len(decorated)}"
        )
        return
    fn, call = decorated[0]
    result.adapter = {
        k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg and _literal(k.value)
    }
    result.adapter["function"] = fn.name
    for key in ("name", "target", "rule"):
        if not isinstance(result.adapter.get(key), str):
            result.problems.append(f"@adapter needs a literal string {key}=")


class _TopLevel:
    """The module level of a draft: only allowed imports, ``NAME = literal`` constants and
    function definitions (one of them decorated with ``@adapter`` and literal arguments).
    ``known`` collects the names bound there (the values of allowed modules, else None)."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        self.known: dict[str, Any] = {}
        self.constants: set[str] = set()  # module-level names bound to a literal
        self.functions: list[ast.FunctionDef] = []
        self.decorated: list[tuple[ast.FunctionDef, ast.Call]] = []

    def check(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Import):
            self._import(node)
        elif isinstance(node, ast.ImportFrom):
            self._import_from(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            self._constant(node)
        elif isinstance(node, ast.FunctionDef):
            self._function(node)
        else:
            self.problems.append(
                f"line {node.lineno}: only imports, literal constants and function definitions "
                f"at module level (found {type(node).__name__.lower()})"
            )

    def _import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name not in ALLOWED_MODULES:
                self.problems.append(f"line {node.lineno}: import of {alias.name!r} is not allowed")
                continue
            if alias.asname:
                self.known[alias.asname] = _import_module(alias.name)
            else:
                root = alias.name.partition(".")[0]
                self.known[root] = _import_module(root)

    def _import_from(self, node: ast.ImportFrom) -> None:
        where = f"line {node.lineno}"
        mod = "." * node.level + (node.module or "")
        if node.level or mod not in ALLOWED_MODULES:
            self.problems.append(f"{where}: import from {mod!r} is not allowed")
            return
        for alias in node.names:
            full = f"{mod}.{alias.name}"
            if mod == "__future__":
                continue
            if mod == "hfadapt.adapters.api":
                if alias.name not in API_NAMES:
                    self.problems.append(f"{where}: import of {full!r} is not allowed")
                self.known[alias.asname or alias.name] = None
                continue
            if full in ALLOWED_MODULES:
                self.known[alias.asname or alias.name] = _import_module(full)
                continue
            ok, value = _resolve(_import_module(mod), alias.name)
            if (
                alias.name.startswith("_")
                or alias.name in DENIED_ATTRS
                or not ok
                or (isinstance(value, types.ModuleType))
            ):
                self.problems.append(f"{where}: import of {full!r} is not allowed")
                continue
            self.known[alias.asname or alias.name] = None

    def _constant(self, node: ast.Assign | ast.AnnAssign) -> None:
        where = f"line {node.lineno}"
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not all(isinstance(t, ast.Name) and not t.id.startswith("__") for t in targets):
            self.problems.append(f"{where}: only NAME = literal constants at module level")
        elif node.value is None or not _literal(node.value):
            self.problems.append(f"{where}: a module-level value must be a literal")
            self.problems += [
                f"line {n.lineno}: use of {n.id!r} is not allowed"
                for n in ast.walk(node.value or ast.Constant(None))
                if isinstance(n, ast.Name) and n.id in DENIED_NAMES
            ]
        else:
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            self.known.update(dict.fromkeys(names))
            self.constants.update(names)

    def _function(self, node: ast.FunctionDef) -> None:
        where = f"line {node.lineno}"
        self.known[node.name] = None
        self.functions.append(node)
        for dec in node.decorator_list:
            call = _adapter_call(dec)
            if call is None:
                self.problems.append(f"{where}: the only decorator allowed is @adapter(...)")
                continue
            self.decorated.append((node, call))
            args = [*call.args, *(k.value for k in call.keywords)]
            if any(k.arg is None for k in call.keywords) or not all(
                _literal(a) or (isinstance(a, ast.Name) and a.id in self.constants) for a in args
            ):
                self.problems.append(f"{where}: @adapter(...) takes literal arguments only")
