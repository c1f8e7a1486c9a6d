"""The package's public face: ``hfadapt.__all__`` names everything a caller needs, typed and
imported lazily, and the README and docs call only those names."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hfadapt

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(hfadapt.__all__))
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(hfadapt, name) is not None, name


def test_public_functions_are_typed() -> None:
    untyped = []
    for name in hfadapt.__all__:
        value = getattr(hfadapt, name)
        if not inspect.isfunction(value):
            continue
        sig = inspect.signature(value)
        if sig.return_annotation is inspect.Signature.empty:
            untyped.append(f"{name} -> ?")
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.annotation is p.empty:
                untyped.append(f"{name}({p.name})")
    assert not untyped, f"public functions without a typed signature: {untyped}"


def test_the_package_says_it_is_typed() -> None:
    assert (ROOT / "hfadapt" / "py.typed").is_file()


def test_lazy_names_load_nothing_heavy_until_used() -> None:
    code = (
        "import sys, hfadapt; before = 'torch' in sys.modules; hfadapt.load; "
        "print(before, 'torch' in sys.modules, 'hfadapt.api' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "True"], out.stdout


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        _ = hfadapt.not_a_name  # type: ignore[attr-defined]


def _user_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_docs_call_only_public_names() -> None:
    """A call written in the README or the docs (``hfadapt.x.y(...)``) goes through the public
    face, or the adapter authors' ``hfadapt.adapters.api``; no private attribute is read."""
    bad = []
    for path in _user_docs():
        text = path.read_text()
        for match in re.finditer(r"\bhfadapt((?:\.\w+)+)\(", text):
            parts = match.group(1).strip(".").split(".")
            if len(parts) == 1 and parts[0] in hfadapt.__all__:
                continue
            if parts[:2] == ["adapters", "api"]:
                continue
            bad.append(f"{path.name}: hfadapt.{'.'.join(parts)}(")
        bad += [f"{path.name}: {m}" for m in re.findall(r"\._hfadapt\w*", text)]
    assert not bad, f"docs reach past the public face: {bad}"
