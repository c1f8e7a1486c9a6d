"""The package's imports follow hfadapt.layers: no cycle, no import up a layer, no import
between sibling parts. Parsed from the source (function-level imports included, imports under
``if TYPE_CHECKING:`` excluded), so the test fails on a cycle that only a call would close."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from hfadapt.layers import LAYERS, layer_of

PACKAGE = Path(__file__).resolve().parents[1] / "hfadapt"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if hasattr(sub, "lineno"):
                        lines.add(sub.lineno)
    return lines


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports (resolved to modules, not names in them)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_lines(tree)
    found: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("hfadapt"):
                    found.add(_longest_known(alias.name, known))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if not target.startswith("hfadapt"):
                continue
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in known else _longest_known(target, known))
    found.discard(module)
    return found


def _longest_known(name: str, known: set[str]) -> str:
    parts = name.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts)


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in state:
                cycle = visit(dep)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def layering_violations(
    graph: dict[str, set[str]], packages: frozenset[str] = frozenset()
) -> list[str]:
    """Imports up a layer or between sibling parts. A package front (its ``__init__``, named in
    ``packages``) may import the modules inside its own package."""
    bad = []
    for module, deps in sorted(graph.items()):
        here, here_prefix = layer_of(module)
        for dep in sorted(deps):
            if module in packages and dep.startswith(module + "."):
                continue
            there, there_prefix = layer_of(dep)
            if there > here:
                bad.append(f"{module} (layer {here}) imports {dep} (layer {there}): up a layer")
            elif there == here and here_prefix != there_prefix:
                bad.append(
                    f"{module} imports its sibling part {dep} ({here_prefix} vs {there_prefix})"
                )
    return bad


def test_every_module_has_a_layer() -> None:
    missing = []
    for name in _modules():
        try:
            layer_of(name)
        except KeyError:
            missing.append(name)
    assert not missing, f"modules in no layer of hfadapt.layers: {missing}"


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _packages() -> frozenset[str]:
    return frozenset(name for name, path in _modules().items() if path.name == "__init__.py")


def test_no_import_runs_up_a_layer() -> None:
    bad = layering_violations(import_graph(), _packages())
    assert not bad, f"{len(bad)} imports break the layering:\n" + "\n".join(bad)


def test_the_checker_fails_on_a_cycle_and_an_upward_import() -> None:
    # The checks themselves can fail: a two-module loop and a db -> cli import are caught.
    cycle = find_cycle({"hfadapt.a": {"hfadapt.b"}, "hfadapt.b": {"hfadapt.a"}})
    assert cycle == ["hfadapt.a", "hfadapt.b", "hfadapt.a"], cycle
    bad = layering_violations({"hfadapt.db.engine": {"hfadapt.cli"}, "hfadapt.cli": set()})
    assert len(bad) == 1 and "up a layer" in bad[0], bad
    # a package front reaches inside its package, but only there
    front = {"hfadapt.spyre": {"hfadapt.spyre.eager.device", "hfadapt.judge.load"}}
    got = layering_violations(front, frozenset({"hfadapt.spyre"}))
    assert len(got) == 1 and got[0].startswith("hfadapt.spyre (layer "), got
    assert "imports hfadapt.judge.load" in got[0] and "up a layer" in got[0], got
    sibling = layering_violations(
        {"hfadapt.sweep.run": {"hfadapt.agent.loop"}, "hfadapt.agent.loop": set()}
    )
    assert len(sibling) == 1 and "sibling" in sibling[0], sibling


def test_layers_name_real_modules() -> None:
    modules = set(_modules())
    listed = [prefix for layer in LAYERS for prefix in layer]
    stale = [p for p in listed if not any(m == p or m.startswith(p + ".") for m in modules)]
    assert not stale, f"layers that name no module: {stale}"


def test_import_hfadapt_does_not_import_torch() -> None:
    code = "import sys, hfadapt, hfadapt.options, hfadapt.errors; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"import hfadapt imported torch: {out.stdout!r}"


@pytest.mark.parametrize("layer", range(len(LAYERS)))
def test_layers_are_listed_once(layer: int) -> None:
    others = [p for i, prefixes in enumerate(LAYERS) if i != layer for p in prefixes]
    assert not set(LAYERS[layer]) & set(others), LAYERS[layer]
