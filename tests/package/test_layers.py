"""The package's imports follow hfadapt.layers: no cycle, no import up a layer, no import
between sibling parts, and no private name (``_x``) reached across parts. Parsed from the
source (function-level imports and string imports such as ``importlib.import_module("...")``
included, imports under ``if TYPE_CHECKING:`` excluded), so the test fails on a cycle that
only a call would close."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from hfadapt.layers import LAYERS, layer_of

PACKAGE = Path(__file__).resolve().parents[2] / "hfadapt"


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


# Calls that import a module named by a string: the layer test reads their literal argument.
STRING_IMPORTS = ("import_module", "__import__", "resolve_name", "find_spec")


def string_import(node: ast.AST) -> str | None:
    """The module a call such as ``importlib.import_module("hfadapt.x")`` or
    ``pkgutil.resolve_name("hfadapt.x:attr")`` imports, when its first argument is a literal."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    first = node.args[0]
    if name not in STRING_IMPORTS or not isinstance(first, ast.Constant):
        return None
    if not isinstance(first.value, str):
        return None
    return first.value.partition(":")[0]


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """The package modules ``module`` imports (resolved to modules, not names in them)."""
    return _imports_in(module, path.read_text(), known, path.name == "__init__.py")


def _imports_in(module: str, source: str, known: set[str], is_package: bool) -> set[str]:
    tree = ast.parse(source)
    skip = _type_checking_lines(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        target = string_import(node)
        if target is not None and target.startswith("hfadapt"):
            found.add(_longest_known(target, known))
        elif isinstance(node, ast.Import):
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


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_reaches(module: str, source: str, known: set[str]) -> list[str]:
    """The private names ``module`` takes from another part: ``from hfadapt.x import _y``, a
    private module of another part, or ``mod._y`` on another part's module imported by name."""
    here = layer_of(module)[1]
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> the package module it is bound to
    bad: list[str] = []

    def other_part(target: str) -> bool:
        return layer_of(_longest_known(target, known) or "hfadapt")[1] != here

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level:
            target = node.module or ""
            if not target.startswith("hfadapt"):
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if full in known:
                    modules[alias.asname or alias.name] = full
                names = [*target.split("."), alias.name]
                if other_part(target) and any(_is_private(n) for n in names):
                    bad.append(f"{module}:{node.lineno} from {target} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if not alias.name.startswith("hfadapt"):
                    continue
                if alias.asname and alias.name in known:
                    modules[alias.asname] = alias.name
                private = any(_is_private(n) for n in alias.name.split("."))
                if private and other_part(alias.name):
                    bad.append(f"{module}:{node.lineno} import {alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _is_private(node.attr)
            and other_part(modules[node.value.id])
        ):
            bad.append(f"{module}:{node.lineno} {modules[node.value.id]}.{node.attr}")
    return bad


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
    front = {"hfadapt.spyre": {"hfadapt.spyre.eager.device", "hfadapt.loading.load"}}
    got = layering_violations(front, frozenset({"hfadapt.spyre"}))
    assert len(got) == 1 and got[0].startswith("hfadapt.spyre (layer "), got
    assert "imports hfadapt.loading.load" in got[0] and "up a layer" in got[0], got
    sibling = layering_violations(
        {"hfadapt.sweep.run": {"hfadapt.agent.loop"}, "hfadapt.agent.loop": set()}
    )
    assert len(sibling) == 1 and "sibling" in sibling[0], sibling


# The simulated device's parts, by role, lowest first: numerics that take plain parameters,
# the rules as data and their judges, what both halves share (and the package front), the two
# halves, the runner over both.
DEVICE_PARTS = (
    ("hfadapt.spyre.numerics",),
    ("hfadapt.spyre.rules",),
    ("hfadapt.spyre",),
    ("hfadapt.spyre.eager", "hfadapt.spyre.compile"),
    ("hfadapt.spyre.runner",),
)
# the modules directly in hfadapt/spyre/: shared by both halves, or above them
DEVICE_SHARED = frozenset(
    {
        "hfadapt.spyre",
        "hfadapt.spyre.decompositions",
        "hfadapt.spyre.frames",
        "hfadapt.spyre.heap",
        "hfadapt.spyre.host_constants",
        "hfadapt.spyre.runner",
    }
)


def test_the_device_subpackages_are_layered_by_role() -> None:
    placed = [[layer_of(prefix) for prefix in part] for part in DEVICE_PARTS]
    pairs = [
        (prefix, got)
        for part, layers in zip(DEVICE_PARTS, placed, strict=True)
        for prefix, got in zip(part, layers, strict=True)
    ]
    own = [(prefix, got) for prefix, got in pairs if got[1] != prefix]
    assert not own, f"device parts without a layer of their own: {own}"
    order = [{index for index, _ in layers} for layers in placed]
    assert all(len(indices) == 1 for indices in order), f"a part split over layers: {placed}"
    indices = [next(iter(i)) for i in order]
    assert indices == sorted(set(indices)), f"device layers out of order: {placed}"


def test_every_device_module_is_in_a_part_by_role() -> None:
    parts = ("numerics", "rules", "eager", "compile")
    subpackages = tuple(f"hfadapt.spyre.{part}." for part in parts)
    device = [m for m in _modules() if m == "hfadapt.spyre" or m.startswith("hfadapt.spyre.")]
    loose = sorted(
        m
        for m in device
        if m not in DEVICE_SHARED
        and not m.startswith(subpackages)
        and m.removesuffix(".__init__") + "." not in subpackages
    )
    assert len(device) > 40 and not loose, f"{len(device)} device modules; loose: {loose}"


def test_the_device_numerics_reach_no_other_device_part() -> None:
    # numerics take plain parameters: no import (even through other modules) of the rules,
    # the halves or the front, and no name of the profile in their source
    graph = import_graph()
    numerics = sorted(m for m in graph if m.startswith("hfadapt.spyre.numerics"))
    reached = {m: sorted(d for d in reachable(graph, m) if _other_device_part(d)) for m in numerics}
    assert len(numerics) >= 10 and not any(reached.values()), reached
    modules = _modules()
    profile_names = {m: _profile_names(modules[m].read_text()) for m in numerics}
    assert not any(profile_names.values()), profile_names


def _other_device_part(module: str) -> bool:
    inside = module.startswith("hfadapt.spyre.numerics")
    return module.startswith("hfadapt.spyre") and not inside


def _profile_names(source: str) -> list[str]:
    """The names of the device profile a source uses (``Profile``, ``load_profile``)."""
    names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    return sorted(names & {"Profile", "load_profile"})


def test_the_checker_refuses_numerics_that_import_the_rules() -> None:
    graph = {
        "hfadapt.spyre.numerics.kernels": {"hfadapt.spyre.rules.profile"},
        "hfadapt.spyre.rules.profile": {"hfadapt.spyre.numerics.dl16"},
        "hfadapt.spyre.numerics.dl16": set(),
    }
    bad = layering_violations(graph)
    assert len(bad) == 1 and bad[0].startswith("hfadapt.spyre.numerics.kernels"), bad
    assert "up a layer" in bad[0], bad


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


def test_no_private_name_is_reached_across_parts() -> None:
    modules = _modules()
    known = set(modules)
    bad = [
        reach
        for name, path in sorted(modules.items())
        for reach in private_reaches(name, path.read_text(), known)
    ]
    assert not bad, f"{len(bad)} private names reached from another part:\n" + "\n".join(bad)


def test_the_checker_sees_private_reaches_and_string_imports() -> None:
    known = {"hfadapt.judge.diagnosis", "hfadapt.adapters.api", "hfadapt.sweep.worker"}
    known |= {"hfadapt.adapters.registry", "hfadapt.judge", "hfadapt.adapters", "hfadapt.sweep"}
    source = (
        "from hfadapt.judge.diagnosis import _row, Diagnosis\n"
        "from hfadapt.adapters import api as adapter_api\n"
        "adapter_api._COLLECTOR = []\n"
        "adapter_api.collected()\n"
    )
    bad = private_reaches("hfadapt.sweep.worker", source, known)
    assert [b.split(" ", 1)[1] for b in bad] == [
        "from hfadapt.judge.diagnosis import _row",
        "hfadapt.adapters.api._COLLECTOR",
    ], bad
    # inside its own part a private name is fine
    assert private_reaches("hfadapt.judge.diagnose", source.splitlines()[0], known) == []
    found = _imports_in(
        "hfadapt.judge.diagnose",
        "import importlib\nimportlib.import_module('hfadapt.adapters.registry')\n",
        known,
        False,
    )
    assert found == {"hfadapt.adapters.registry"}, found
    graph = {"hfadapt.judge.diagnose": found, "hfadapt.adapters.registry": set()}
    assert layering_violations(graph) == []  # judge may import adapters: it is lower
    up = _imports_in(
        "hfadapt.adapters.registry", "__import__('hfadapt.sweep.worker')\n", known, False
    )
    assert layering_violations({"hfadapt.adapters.registry": up}) != [], up


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    """Whether the handler swallows an ImportError (one that re-raises does not)."""
    if any(isinstance(n, ast.Raise) and n.exc is None for n in ast.walk(handler)):
        return False
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    caught = {ast.unparse(n).rsplit(".", 1)[-1] for n in names}
    return bool(caught & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def guarded_imports(module: str, source: str) -> list[str]:
    """Imports of hfadapt's own modules inside a ``try`` that catches ImportError: one of
    them failing is a bug to see, never a case to carry on from."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Try) or not any(map(_catches_import_error, node.handlers)):
            continue
        for sub in (s for inner in node.body for s in ast.walk(inner)):
            names: list[str] = []
            if isinstance(sub, ast.ImportFrom) and not sub.level:
                names = [sub.module or ""]
            elif isinstance(sub, ast.Import):
                names = [a.name for a in sub.names]
            elif string_import(sub) is not None:
                names = [str(string_import(sub))]
            bad += [f"{module}:{sub.lineno} {n}" for n in names if n.startswith("hfadapt")]
    return bad


def test_no_import_of_hfadapt_itself_is_guarded() -> None:
    bad = [
        found
        for name, path in sorted(_modules().items())
        for found in guarded_imports(name, path.read_text())
    ]
    assert not bad, f"{len(bad)} guarded imports of hfadapt's own modules:\n" + "\n".join(bad)


def test_the_checker_sees_a_guarded_import() -> None:
    source = (
        "try:\n    from hfadapt.spyre.numerics.kernels import native_kernel\nexcept ImportError:\n    pass\n"
        "try:\n    importlib.import_module('hfadapt.adapters.registry')\n"
        "except (ValueError, ModuleNotFoundError):\n    pass\n"
        "try:\n    import ray\nexcept ImportError:\n    pass\n"
        "try:\n    from hfadapt.x import y\nexcept KeyError:\n    pass\n"
        "try:\n    from hfadapt.x import z\nexcept BaseException:\n    close()\n    raise\n"
    )
    found = [f.split(" ", 1)[1] for f in guarded_imports("m", source)]
    assert found == ["hfadapt.spyre.numerics.kernels", "hfadapt.adapters.registry"], found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every package module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def test_loading_a_model_never_imports_the_judge() -> None:
    graph = import_graph()
    for start in ("hfadapt.api", "hfadapt.loading.loader"):
        judge = sorted(m for m in reachable(graph, start) if m.startswith("hfadapt.judge"))
        assert not judge, f"{start} reaches the judge: {judge}"
    code = (
        "import sys, hfadapt.api\n"
        "print(sorted(m for m in sys.modules if m.startswith('hfadapt.judge')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"import hfadapt.api imported {out.stdout.strip()}"
