"""Ctrl-C while adapters load stops discovery: a KeyboardInterrupt raised by an adapter file or
a plugin's entry point propagates, never recorded as a broken adapter; a ``sys.exit()`` in an
adapter file is still one broken adapter, not the end of hfadapt."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hfadapt.adapters.registry import discover

GOOD = """
from hfadapt.adapters.api import adapter

@adapter(name="relu-double", target="torch.nn.modules.activation:ReLU.forward", rule="op.activation")
def relu_double(self, x):
    return 2 * x
"""


def _plugin(folder: Path, module: str, body: str) -> None:
    """An installed-looking distribution whose ``hfadapt.adapters`` entry point is
    ``module:register``."""
    (folder / f"{module}.py").write_text(body)
    dist = folder / f"{module}-0.1.dist-info"
    dist.mkdir()
    name = module.replace("_", "-")
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[hfadapt.adapters]\nmine = {module}:register\n")


def test_ctrl_c_in_an_adapter_file_propagates(tmp_path: Path) -> None:
    (tmp_path / "a_good.py").write_text(GOOD)
    (tmp_path / "b_interrupted.py").write_text("raise KeyboardInterrupt\n")
    with pytest.raises(KeyboardInterrupt):
        discover(paths=[tmp_path], bundled=False, entry_points=False)
    left = [m for m in sys.modules if m.startswith("hfadapt_adapters.b_interrupted")]
    assert left == [], f"the interrupted file stayed imported as {left}"


def test_sys_exit_in_an_adapter_file_is_a_broken_adapter(tmp_path: Path) -> None:
    (tmp_path / "a_good.py").write_text(GOOD)
    (tmp_path / "b_exits.py").write_text("import sys\nsys.exit(3)\n")
    reg = discover(paths=[tmp_path], bundled=False, entry_points=False)
    assert [a.name for a in reg.adapters] == ["relu-double"], reg.adapters
    assert [(Path(e.path).name, e.error) for e in reg.errors] == [("b_exits.py", "SystemExit: 3")]


@pytest.mark.parametrize(
    ("module", "body"),
    [
        ("ep_ctrl_c_at_import_hfadapt_test", "raise KeyboardInterrupt\n"),
        (
            "ep_ctrl_c_in_register_hfadapt_test",
            "def register(registry):\n    raise KeyboardInterrupt\n",
        ),
    ],
)
def test_ctrl_c_in_a_plugin_propagates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, body: str
) -> None:
    _plugin(tmp_path, module, body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        discover(paths=[], bundled=False, entry_points=True)


def test_a_plugin_that_exits_is_reported_and_discovery_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = "ep_exits_hfadapt_test"
    _plugin(tmp_path, module, "def register(registry):\n    raise SystemExit('no')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = discover(paths=[], bundled=False, entry_points=True)
    mine = [e for e in reg.errors if e.path == "entry-point:mine"]
    assert [e.error for e in mine] == ["SystemExit: no"], reg.errors
