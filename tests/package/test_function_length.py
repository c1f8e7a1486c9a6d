"""No function of the package runs past 80 lines. A CLI command's option declarations (its
signature of ``Annotated`` options) do not count: only its body does. And no code is packed by
hand to get there: ``# fmt: skip`` (or ``# fmt: off``) is left only on the few module-level
tables listed below, each with the reason its formatted form would read worse."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "hfadapt"
LIMIT = 80
FORMATTER_OFF = re.compile(r"#\s*fmt:\s*(skip|off)\b")

# Files whose module-level tables of data keep their hand layout: (file, why ruff's one item a
# line reads worse there). Only a marker on a module-level assignment is spared; one inside a
# function, a class or any other statement still fails.
TABLES_LAID_OUT_BY_HAND: tuple[tuple[str, str], ...] = ()


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


def packed_lines(source: str, where: str, *, tables_spared: bool = False) -> list[str]:
    """``where:line text`` for every ``# fmt: skip`` or ``# fmt: off`` comment (a comment, not
    text in a string); ``tables_spared`` leaves out those on a module-level assignment."""
    spared: set[int] = set()
    if tables_spared:
        for node in ast.parse(source).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                spared.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    lines = source.splitlines()
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        row = token.start[0]
        marker = token.type == tokenize.COMMENT and FORMATTER_OFF.search(token.string)
        if marker and row not in spared:
            found.append(f"{where}:{row} {lines[row - 1].strip()}")
    return found


def test_no_code_is_packed_with_fmt_skip() -> None:
    allowed = dict(TABLES_LAID_OUT_BY_HAND)
    found, stale = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE.parent))
        source = path.read_text()
        found += packed_lines(source, where, tables_spared=where in allowed)
        if where in allowed and packed_lines(source, where) == []:
            stale.append(f"{where} ({allowed[where]})")
    assert not found, (
        f"{len(found)} lines keep ruff format off (let it lay the code out; split a function "
        "that then runs long by concept, or list a module-level table in "
        "TABLES_LAID_OUT_BY_HAND with the reason):\n" + "\n".join(found)
    )
    listed = "TABLES_LAID_OUT_BY_HAND lists files with no marker left"
    assert not stale, f"{listed}:\n" + "\n".join(stale)


def test_the_scan_sees_a_marker_and_spares_only_a_listed_module_table() -> None:
    sample = (
        "TABLE = [\n"
        "    1, 2,\n"
        "]  # fmt: skip\n"
        "def f():\n"
        "    return g(1,\n"
        "             2)  # fmt:skip\n"
        "TEXT = '# fmt: skip'\n"
        "# fmt: off\n"
    )
    every = ["m.py:3 ]  # fmt: skip", "m.py:6 2)  # fmt:skip", "m.py:8 # fmt: off"]
    assert packed_lines(sample, "m.py") == every
    assert packed_lines(sample, "m.py", tables_spared=True) == every[1:]
