"""The suite's own layout: a folder per part of the package, each with its conftest; shared
fixtures and helpers only in ``tests/support``; no test file imports another test file or a
conftest (what two parts share lives in support, where both can see it)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _parts() -> list[Path]:
    return sorted(
        p
        for p in TESTS.iterdir()
        if p.is_dir() and p.name not in ("support",) and not p.name.startswith((".", "__"))
    )


def test_every_test_sits_in_a_part_folder_with_its_conftest() -> None:
    top = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert top == [], f"tests outside a part folder: {top}"
    parts = _parts()
    missing = [p.name for p in parts if not (p / "conftest.py").is_file()]
    print(f"\n{len(parts)} part folders: {[p.name for p in parts]}")
    assert len(parts) >= 10 and not missing, f"part folders without a conftest: {missing}"


def imported_tests(source: str) -> list[str]:
    """The test modules and conftests ``source`` imports, by name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        found += [n for n in names if n.split(".")[-1].startswith("test_") or "conftest" in n]
    return found


def test_no_test_file_imports_another_test_file_or_a_conftest() -> None:
    bad = [
        f"{path.relative_to(TESTS)}: {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in imported_tests(path.read_text())
    ]
    assert not bad, "imports of test files or conftests:\n" + "\n".join(bad)
    sample = "from test_compile_models import TINY\nimport conftest\nfrom support.models import x\n"
    assert imported_tests(sample) == ["test_compile_models", "conftest"]
