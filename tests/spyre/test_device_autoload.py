"""``import torch`` finds the simulated device through the ``torch.backends`` entry point, the way
it finds torch-spyre's card: on by default, off with HFADAPT_SPYRE_AUTOLOAD=0
or TORCH_DEVICE_BACKEND_AUTOLOAD=0, and never in place of an installed torch_spyre.

The shared venv's hfadapt metadata may predate the entry point, so each fresh process gets a
dist-info folder declaring exactly what pyproject.toml declares."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from hfadapt.spyre.eager import autoload

ROOT = Path(__file__).resolve().parents[2]
_PROBE = """
import torch
try:
    print("DEVICE", torch.ones(2, dtype=torch.float16).to("spyre").device)
except RuntimeError as exc:
    print("NO DEVICE", str(exc).splitlines()[0])
"""


def _declared() -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return dict(data["project"]["entry-points"]["torch.backends"])


def _dist_info(tmp: Path, entry_points: dict[str, str]) -> Path:
    info = tmp / "hfadapt_autoload_probe-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: hfadapt-autoload-probe\nVersion: 0\n"
    )
    lines = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text("[torch.backends]\n" + lines)
    return tmp


def test_pyproject_declares_the_torch_backends_entry_point() -> None:
    declared = _declared()
    assert declared == {"hfadapt_spyre": "hfadapt.spyre.eager.autoload:_autoload"}, declared


def test_opt_out_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(autoload.ENV, raising=False)
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    assert autoload.enabled()
    monkeypatch.setenv(autoload.ENV, "0")
    assert not autoload.enabled()
    monkeypatch.setenv(autoload.ENV, "1")
    monkeypatch.setenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    assert not autoload.enabled()


def test_import_torch_registers_the_simulator(tmp_path: Path) -> None:
    """A fresh interpreter's ``import torch`` alone registers the device (through the declared
    entry point; the opt-outs are read by the same entry point, in process below)."""
    meta = _dist_info(tmp_path / "meta", _declared())
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (autoload.ENV, "TORCH_DEVICE_BACKEND_AUTOLOAD")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(meta)])
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "DEVICE spyre:0", (done.stdout, done.stderr[-500:])


def test_the_entry_point_registers_nothing_when_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the entry point does when ``import torch`` calls it: register the device by
    default; nothing under either opt-out or with the real torch_spyre importable."""
    from hfadapt.spyre.eager import device

    fake_card = tmp_path / "card"
    (fake_card / "torch_spyre").mkdir(parents=True)
    (fake_card / "torch_spyre" / "__init__.py").write_text("")  # importable, registers nothing
    calls: list[str] = []
    monkeypatch.setattr(device, "register", lambda force=False: calls.append("register"))
    monkeypatch.setattr(autoload, "_stepped_aside", None)
    monkeypatch.delenv(autoload.ENV, raising=False)
    monkeypatch.delenv("TORCH_DEVICE_BACKEND_AUTOLOAD", raising=False)
    cases = {
        "default": {},
        "hfadapt opt-out": {autoload.ENV: "0"},
        "torch opt-out": {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        "real torch_spyre": {"card": str(fake_card)},
    }
    registered = {}
    for name, env in cases.items():
        with monkeypatch.context() as m:
            for key, value in env.items():
                if key == "card":
                    m.syspath_prepend(value)
                else:
                    m.setenv(key, value)
            calls.clear()
            autoload._autoload()
            registered[name] = len(calls)
    print(f"register() calls by case: {registered}")
    assert registered == {
        "default": 1,
        "hfadapt opt-out": 0,
        "torch opt-out": 0,
        "real torch_spyre": 0,
    }, registered


def test_hfadapt_importing_torch_first_keeps_torch_importable(tmp_path: Path) -> None:
    """When hfadapt's own device modules are the first to import torch, the entry point meets
    them half-initialized: it must leave torch importable and registration to register()."""
    meta = _dist_info(tmp_path / "meta", _declared())
    env = {k: v for k, v in os.environ.items() if k not in (autoload.ENV,)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(meta)])
    code = (
        "import hfadapt.spyre as s, torch\n"
        "s.register()\n"
        "print('DEVICE', torch.ones(2, dtype=torch.float16).to('spyre').device)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("DEVICE spyre:0"), (out.stdout, out.stderr[-500:])


# A PrivateUse1 backend of another package, registering the way torch's openreg example's
# entry point does (rename the slot, generate the tensor methods). torch's wheel does not ship
# openreg (a C++ extension built from torch's source tree), so this stand-in makes the same
# calls on the slot without its kernels.
_OTHER_BACKEND = """
import torch

def _autoload():
    torch.utils.rename_privateuse1_backend("openreg")
    torch.utils.generate_methods_for_privateuse1_backend()
"""
_OTHER_PROBE = """
import torch
from hfadapt.errors import DeviceError
from hfadapt.spyre.eager import autoload
import hfadapt.spyre as s
print("SLOT", torch._C._get_privateuse1_backend_name())
print("OPENREG", torch.device("openreg:0"), hasattr(torch.Tensor, "is_openreg"))
print("ASIDE", autoload.stepped_aside())
try:
    s.register()
    print("REGISTERED")
except DeviceError as exc:
    print("REFUSED", exc)
"""


def test_autoload_leaves_privateuse1_to_another_backend_in_either_order(tmp_path: Path) -> None:
    meta = _dist_info(tmp_path / "meta", _declared())
    other = tmp_path / "other"
    (other / "openreg_probe").mkdir(parents=True)
    (other / "openreg_probe" / "__init__.py").write_text(_OTHER_BACKEND)
    info = other / "openreg_probe-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: openreg-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\nopenreg = openreg_probe:_autoload\n")
    base = {k: v for k, v in os.environ.items() if k not in (autoload.ENV,)}
    base.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    orders = {
        "hfadapt first": [str(ROOT), str(meta), str(other)],
        "other first": [str(ROOT), str(other), str(meta)],
    }
    for name, path in orders.items():
        out = subprocess.run(
            [sys.executable, "-c", _OTHER_PROBE],
            env={**base, "PYTHONPATH": os.pathsep.join(path)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, (name, out.stderr[-2000:])
        lines = dict(line.split(" ", 1) for line in out.stdout.strip().splitlines())
        print(name, lines)
        assert lines["SLOT"] == "openreg", (name, lines)
        assert lines["OPENREG"] == "openreg:0 True", (name, lines)
        assert "openreg" in lines["ASIDE"], (name, lines)
        assert lines["REFUSED"].startswith(
            "the PrivateUse1 backend is already registered as 'openreg'"
        ), (name, lines)
