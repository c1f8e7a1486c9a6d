"""No silent skips of the native tests: every test that may skip for want of the C kernels or
AMX's tiles (a ``skipif`` or ``pytest.skip`` that names them, directly or through a helper)
carries the ``native`` marker, which tests/conftest.py turns into a failure under CI=true on a
machine with a C compiler (and, for ``native(amx=True)``, the tiles). Read from the sources."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# what a skip for want of the native kernels or the tiles names
NATIVE_WORDS = ("dl16_native", "native_build", "amx", "c kernel", "c compiler", "tiles")


def _skips(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and ast.unparse(n.func) in ("pytest.skip", "pytest.mark.skipif")
        for n in ast.walk(node)
    )


def _native(text: str) -> bool:
    low = text.lower()
    return any(word in low for word in NATIVE_WORDS)


def native_skips(source: str) -> dict[str, bool]:
    """The test functions of ``source`` that may skip for want of the native kernels, and
    whether each carries the ``native`` marker (itself or through the module's
    ``pytestmark``)."""
    tree = ast.parse(source)
    named: dict[str, str] = {}  # module-level names: their source (decorator aliases, helpers)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                named[ast.unparse(target)] = ast.unparse(node.value)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            named[node.name] = ast.unparse(node)
    module_marked = "mark.native" in named.get("pytestmark", "")
    module_skips = "skipif" in named.get("pytestmark", "") and _native(named["pytestmark"])
    # helpers (and decorator aliases) whose own text skips for want of the kernels
    skipping = {
        name for name, text in named.items()
        if not name.startswith("test_") and _skips(ast.parse(text)) and _native(text)
    }  # fmt: skip
    found: dict[str, bool] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
            continue
        decorators = [ast.unparse(d) for d in node.decorator_list]
        marked = module_marked or any(d.startswith("pytest.mark.native") for d in decorators)
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        text = ast.unparse(node)
        direct = _skips(node) and _native(text)
        if direct or used & skipping or module_skips:
            found[node.name] = marked
    return found


def unmarked_native_skips(source: str) -> list[str]:
    return [name for name, marked in native_skips(source).items() if not marked]


def test_every_test_that_may_skip_for_want_of_the_native_kernels_is_marked_native() -> None:
    seen = {
        f"{path.relative_to(TESTS)}::{name}": marked
        for path in sorted(TESTS.rglob("test_*.py"))
        for name, marked in native_skips(path.read_text(encoding="utf-8")).items()
    }
    bad = [name for name, marked in seen.items() if not marked]
    print(f"{len(seen)} tests may skip for want of the native kernels: {sorted(seen)}")
    assert bad == [], "native tests that would skip silently under CI:\n" + "\n".join(bad)
    assert len(seen) >= 10, f"the scan found only {sorted(seen)}"


SAMPLE = """
import pytest
built = pytest.mark.skipif(not dl16_native.available(), reason="the C kernels are not built")

def _compiler():
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")

@built
def test_alias_unmarked(): ...

@pytest.mark.native
@built
def test_alias_marked(): ...

def test_helper_unmarked():
    _compiler()

def test_inline_unmarked():
    if not amx.available():
        pytest.skip("no tiles")

def test_other_skip():
    pytest.skip("no bubblewrap")
"""


def test_the_scan_finds_each_way_a_native_test_skips() -> None:
    assert unmarked_native_skips(SAMPLE) == [
        "test_alias_unmarked", "test_helper_unmarked", "test_inline_unmarked",
    ]  # fmt: skip
    marked = "import pytest\npytestmark = pytest.mark.native(amx=True)\n" + SAMPLE
    assert unmarked_native_skips(marked) == []
    module = "pytestmark = pytest.mark.skipif(not amx.available(), reason='')\n" + SAMPLE
    assert unmarked_native_skips(module) == [
        "test_alias_unmarked", "test_helper_unmarked", "test_inline_unmarked", "test_other_skip",
    ]  # fmt: skip
