"""The stick's width is declared once, in the DL16 numerics (``STICK_ELEMENTS``; a device
profile's layout is checked against it): no other module of the package or of the bundled
adapters binds a ``*STICK*`` name to a number."""

from __future__ import annotations

import ast
from pathlib import Path

from hfadapt.spyre.numerics.dl16 import STICK_ELEMENTS

ROOT = Path(__file__).resolve().parents[2]
HOME = "hfadapt/spyre/numerics/dl16.py"


def stick_literals(source: str) -> list[tuple[str, int]]:
    """(name, line) of every ``NAME = <number>`` whose name holds STICK."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            number = isinstance(node.value, ast.Constant) and isinstance(node.value.value, int)
            for t in targets:
                if number and isinstance(t, ast.Name) and "STICK" in t.id.upper():
                    found.append((t.id, node.lineno))
    return found


def test_the_stick_is_declared_once() -> None:
    files = sorted([*(ROOT / "hfadapt").rglob("*.py"), *(ROOT / "adapters").rglob("*.py")])
    found = {
        f"{path.relative_to(ROOT).as_posix()}:{line} {name}"
        for path in files
        for name, line in stick_literals(path.read_text())
    }
    home = {f for f in found if f.startswith(HOME + ":")}
    assert len(home) == 1 and STICK_ELEMENTS == 64, f"the declared stick: {home}, {STICK_ELEMENTS}"
    assert found == home, f"sticks declared besides {HOME}: {sorted(found - home)}"


def test_the_scan_sees_a_stick_literal() -> None:
    assert stick_literals("STICK = 64\nFP32_STICK: int = 32\nX = STICK // 2\n") == [
        ("STICK", 1),
        ("FP32_STICK", 2),
    ]
