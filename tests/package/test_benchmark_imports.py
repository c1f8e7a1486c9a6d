"""The benchmark scripts are how the README's figures are reproduced, so what they take from
hfadapt must exist: every ``from hfadapt... import name`` in benchmarks/ resolves (a renamed
function once left bench_sandbox.py failing at its first line while the README quoted it).
Speed itself is not tested."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _imports(path: Path) -> list[tuple[str, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hfadapt")
        for alias in node.names
    ]


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("bench_*.py")))
def test_every_name_a_benchmark_takes_from_hfadapt_exists(script: str) -> None:
    missing = []
    for module, name in _imports(BENCHMARKS / script):
        loaded = importlib.import_module(module)
        if not hasattr(loaded, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert not missing, f"{script} imports names hfadapt does not have: {missing}"
