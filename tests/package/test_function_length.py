"""No function of the package runs past 80 lines. A CLI command's option declarations (its
signature of ``Annotated`` options) do not count: only its body does."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hfadapt"
LIMIT = 80


def long_functions(source: str, where: str, *, body_only: bool = False) -> list[str]:
    """``where:line name (N lines)`` for every function over LIMIT lines; ``body_only``
    counts from the first line of the body (the docstring included)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0].lineno if body_only else node.lineno
            if node.decorator_list and not body_only:
                first = min(first, *(d.lineno for d in node.decorator_list))
            lines = (node.end_lineno or node.lineno) - first + 1
            if lines > LIMIT:
                found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_longer_than_80_lines() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        cli = path.relative_to(PACKAGE).parts[0] == "cli"
        where = str(path.relative_to(PACKAGE.parent))
        found += long_functions(path.read_text(), where, body_only=cli)
    assert not found, f"{len(found)} functions over {LIMIT} lines:\n" + "\n".join(found)


def test_the_count_sees_a_long_function_and_spares_a_long_signature() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    long_body = f"def f():\n{body}\n"
    assert long_functions(long_body, "m.py") == [f"m.py:1 f ({LIMIT + 1} lines)"]
    params = ",\n".join(f"    a{i}: int = {i}" for i in range(LIMIT))
    long_signature = f"def command(\n{params},\n) -> None:\n    pass\n"
    assert long_functions(long_signature, "cli.py", body_only=True) == []
    assert long_functions(long_signature, "m.py") != []
