"""Every key the package writes into a run's evidence is declared in
``hfadapt.judge.evidence_types`` (mypy checks the writes through typed names; this scan also
catches writes through untyped row dicts): a new free-form key fails here."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_type_hints, is_typeddict

from hfadapt.judge.evidence_types import Evidence

PACKAGE = Path(__file__).resolve().parents[2] / "hfadapt"
# The agent's records also call a field ``evidence``: a FailureCase's (what the agent is shown)
# and an accepted draft's provenance. They are not a run's evidence (the agent only reads that).
OTHER_RECORDS = ("agent/",)


def _named_evidence(node: ast.expr) -> bool:
    """``evidence``, ``x.evidence`` or ``x["evidence"]``."""
    if isinstance(node, ast.Name):
        return node.id == "evidence"
    if isinstance(node, ast.Attribute):
        return node.attr == "evidence"
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "evidence"
    return False


def _literal_keys(value: ast.expr | None, line: int) -> list[tuple[tuple[str, ...], int]]:
    """The keys of a dict display (``**`` spreads add none); a computed key is ``<expr>``."""
    if not isinstance(value, ast.Dict):
        return []
    keys = []
    for key in value.keys:
        if key is None:
            continue
        name = key.value if isinstance(key, ast.Constant) else f"<{ast.unparse(key)}>"
        keys.append(((str(name),), line))
    return keys


def _subscript_path(target: ast.expr) -> tuple[str, ...] | None:
    """``("a", "b")`` for ``evidence["a"]["b"]``; None when no ``evidence`` is at its root."""
    path: list[str] = []
    node = target
    while isinstance(node, ast.Subscript) and not _named_evidence(node):
        key = node.slice
        path.insert(0, str(key.value) if isinstance(key, ast.Constant) else f"<{ast.unparse(key)}>")
        node = node.value
    return tuple(path) if path and _named_evidence(node) else None


def written_keys(source: str) -> list[tuple[tuple[str, ...], int]]:
    """(key path, line) for every evidence key ``source`` writes: subscript assignments and
    deletions, dict displays assigned to or given as ``evidence``, ``update``/``setdefault``."""
    found: list[tuple[tuple[str, ...], int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                path = _subscript_path(target)
                if path:
                    found.append((path, node.lineno))
                if _named_evidence(target):
                    found += _literal_keys(node.value, node.lineno)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "evidence":
                    found += _literal_keys(value, node.lineno)
        elif isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "evidence":
                    found += _literal_keys(kw.value, node.lineno)
            func = node.func
            if isinstance(func, ast.Attribute) and _named_evidence(func.value):
                if func.attr == "update":
                    found += [((kw.arg,), node.lineno) for kw in node.keywords if kw.arg]
                    found += _literal_keys(node.args[0] if node.args else None, node.lineno)
                if func.attr == "setdefault" and node.args:
                    first = node.args[0]
                    name = first.value if isinstance(first, ast.Constant) else "<computed>"
                    found.append(((str(name),), node.lineno))
    return found


def undeclared(path: tuple[str, ...]) -> str | None:
    """Why ``path`` is not a declared key of ``Evidence`` (None when it is)."""
    hints: dict[str, object] = get_type_hints(Evidence)
    for depth, key in enumerate(path):
        if key not in hints:
            where = "Evidence" if depth == 0 else f"the section under {path[:depth]}"
            return f"{key!r} is not a key of {where}"
        inner = hints[key]
        if depth + 1 < len(path):
            if not is_typeddict(inner):
                return None  # a free-form value (a dict of the model's own fields, ...)
            hints = get_type_hints(inner)
    return None


def test_every_evidence_key_written_is_declared() -> None:
    problems, seen = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith(OTHER_RECORDS):
            continue
        for keys, line in written_keys(path.read_text()):
            seen += 1
            why = undeclared(keys)
            if why:
                problems.append(f"hfadapt/{where}:{line} evidence{list(keys)}: {why}")
    assert seen >= 40, f"the scan found only {seen} evidence writes: it no longer sees them"
    assert not problems, (
        f"{len(problems)} of {seen} evidence writes use keys hfadapt.judge.evidence_types does "
        "not declare (declare them in a section):\n" + "\n".join(problems)
    )


def test_the_scan_sees_each_kind_of_write() -> None:
    source = """
evidence["a"] = 1
diag.evidence["b"]["c"] = 2
row["evidence"] = {"d": 1, **old}
x = {"evidence": {"e": 1}}
f(evidence={"f": 1})
diag.evidence.update({"g": 1}, )
evidence.update(h=1)
diag.evidence.setdefault("i", [])
evidence[name] = 3
"""
    keys = sorted(k for k, _ in written_keys(source))
    expected = [("<name>",), ("a",), ("b", "c"), ("d",), ("e",), ("f",), ("g",), ("h",), ("i",)]
    assert keys == expected, f"the scan found {keys}"


def test_an_undeclared_key_is_named() -> None:
    assert undeclared(("sweep", "role")) is None
    assert undeclared(("pipeline", "whole")) is None
    assert undeclared(("translated_from", "family")) is None  # a free-form dict
    assert undeclared(("free_form",)) == "'free_form' is not a key of Evidence"
    assert undeclared(("sweep", "nope")) == "'nope' is not a key of the section under ('sweep',)"
