"""torch's private API behind one door: ``hfadapt.torch_internals`` is the only module of the
package that names a private torch attribute or module, and every name it lists in ``USED``
exists on the installed torch (the canary runs this on the newest torch the range allows)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hfadapt import torch_internals

PACKAGE = Path(__file__).resolve().parents[2] / "hfadapt"
DOOR = PACKAGE / "torch_internals.py"


def _private(dotted: str) -> bool:
    parts = dotted.split(".")
    if parts[0] != "torch" or (len(parts) > 1 and parts[1] == "ops"):  # op names are public
        return False
    return any(p.startswith("_") and not p.endswith("__") for p in parts[1:])


def _dotted(node: ast.AST) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def private_torch_names(source: str) -> set[str]:
    """Private torch names a module's source imports, reads, or names in a string constant."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            names = [n for n in [_dotted(node)] if n]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = (
                [node.value] if node.value.startswith("torch.") and " " not in node.value else []
            )
        found.update(n for n in names if _private(n))
    return found


def test_the_scan_sees_each_way_of_naming_a_private_api() -> None:
    source = (
        "import torch._dynamo\nfrom torch.utils._pytree import tree_map\n"
        "x = torch._C._get_privateuse1_backend_name()\nM = 'torch._inductor.compile_fx'\n"
        "ok = torch.ops.aten._softmax.default\nfine = torch.nn.functional.gelu\n"
    )
    assert private_torch_names(source) == {
        "torch._dynamo",
        "torch.utils._pytree.tree_map",
        "torch._C._get_privateuse1_backend_name",
        "torch._C",
        "torch._inductor.compile_fx",
    }, private_torch_names(source)


def test_only_the_door_names_torch_internals() -> None:
    outside = {
        str(path.relative_to(PACKAGE.parent)): sorted(names)
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != DOOR and (names := private_torch_names(path.read_text(encoding="utf-8")))
    }
    assert outside == {}, f"private torch API outside hfadapt/torch_internals.py: {outside}"


def test_every_listed_internal_exists_on_this_torch() -> None:
    import torch

    missing = {}
    for name, why in torch_internals.USED:
        try:
            torch_internals.resolve(name)
        except (ImportError, AttributeError) as exc:
            missing[name] = f"{why}: {type(exc).__name__}: {exc}"
    print(f"torch {torch.__version__}: {len(torch_internals.USED)} private names, all present")
    assert missing == {}, f"torch {torch.__version__} lacks: {missing}"


def test_the_list_covers_what_the_door_uses() -> None:
    """Every private name the door itself reaches is listed in USED (by itself or a parent)."""
    used = private_torch_names(DOOR.read_text(encoding="utf-8"))
    listed = {name for name, _ in torch_internals.USED}
    unlisted = sorted(
        n
        for n in used
        if not any(n == m or n.startswith(m + ".") for m in listed)
        and not any(m.startswith(n + ".") for m in listed)
    )
    assert unlisted == [], f"used in torch_internals.py but not in USED: {unlisted}"


def test_patched_puts_back_what_it_replaced() -> None:
    import types

    module = types.ModuleType("m")
    module.f = 1  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError), torch_internals.patched([(module, "f", 2), (module, "g", 3)]):
        assert (module.f, hasattr(module, "g")) == (2, False)  # type: ignore[attr-defined]
        raise RuntimeError
    assert module.f == 1 and not hasattr(module, "g")  # type: ignore[attr-defined]
