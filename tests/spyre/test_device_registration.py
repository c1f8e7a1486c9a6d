"""The spyre device presents itself like a torch device: lazy registration, the torch.spyre
module, transfers both ways, model.to("spyre"), views that alias, and the real-card guard."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hfadapt.spyre.numerics.dl16 import round_dl16


def test_device_module(spyre) -> None:
    assert torch.spyre is spyre
    assert spyre.is_available() and spyre.is_simulated() and spyre.is_registered()
    assert spyre.device_count() == 1
    assert spyre.current_device() == 0
    spyre.set_device(0)
    spyre.set_device("spyre:0")
    spyre.synchronize()
    with spyre.device(0):
        assert spyre.current_device() == 0
    with pytest.raises(RuntimeError, match="Invalid device index 1"):
        spyre.set_device(1)
    assert torch.empty(2, device="spyre").device == torch.device("spyre", 0)


def test_device_context_switches_the_current_device(spyre, monkeypatch) -> None:
    monkeypatch.setattr(spyre, "DEVICE_COUNT", 2)
    with spyre.device("spyre:1"):
        assert spyre.current_device() == 1
        assert torch.zeros(3, device="spyre").device == torch.device("spyre", 1)
        spyre.synchronize(1)
    assert spyre.current_device() == 0
    assert torch.ones(2).to("spyre:1").device.index == 1


def test_round_trip_keeps_dtype_and_values(spyre) -> None:
    x32 = torch.randn(5, 7)
    back = x32.to("spyre").cpu()
    assert back.dtype == torch.float32 and torch.equal(back, x32), "fp32 must stay IEEE fp32"
    i32 = torch.arange(-5, 5, dtype=torch.int32)
    assert torch.equal(i32.to("spyre").cpu(), i32)
    b = torch.tensor([True, False, True])
    assert torch.equal(b.to("spyre").cpu(), b)
    x16 = round_dl16(torch.randn(64)).half()  # values DL16 can hold
    on = x16.spyre()
    assert (on.device.type, on.dtype) == ("spyre", torch.float16)
    assert torch.equal(on.cpu(), x16)


def test_model_to_spyre_keeps_parameter_data(spyre) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LayerNorm(128)).half()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.to("spyre")
    for name, p in model.named_parameters():
        assert isinstance(p, torch.nn.Parameter), name
        assert (p.device.type, p.dtype) == ("spyre", torch.float16), name
        expected = round_dl16(before[name].float()).half()
        diff = (p.detach().cpu().float() - expected.float()).abs().max().item()
        assert diff == 0.0, f"{name}: parameter changed by {diff} beyond DL16 rounding"
    with torch.no_grad():
        out = model(torch.randn(2, 64, dtype=torch.float16).to("spyre"))
    assert (out.device.type, out.dtype, tuple(out.shape)) == ("spyre", torch.float16, (2, 128))


def test_views_alias(spyre) -> None:
    x = torch.zeros(4, 4).to("spyre")
    x[:, 0] = 5.0  # select on the stick dimension at offset 0: a basic slice
    x[3] = 7.0
    x.t()[2] = 3.0  # column 2, through a transposed view
    host = x.cpu()
    assert host[:3, 0].tolist() == [5.0] * 3
    assert host[3].tolist() == [7.0, 7.0, 3.0, 7.0]
    assert host[:, 2].tolist() == [3.0] * 4
    assert host.sum().item() == 5.0 * 3 + 7.0 * 3 + 3.0 * 4


def test_repr_shows_device_and_values(spyre) -> None:
    text = repr(torch.tensor([1.5, 2.0], dtype=torch.float16).to("spyre"))
    assert "device='spyre:0'" in text and "1.5000" in text and "float16" in text, text


_FRESH_PROCESS = textwrap.dedent(
    """
    import sys, types, warnings
    import torch
    import hfadapt, hfadapt.spyre, hfadapt.spyre.eager.device as device
    # importing registers nothing
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"
    assert not hasattr(torch, "spyre")
    sys.modules["torch_spyre"] = types.ModuleType("torch_spyre")  # "the real package"
    try:
        device.register()
    except hfadapt.errors.DeviceError as exc:
        print("REFUSED:", exc)
    assert not device.is_available()
    assert torch._C._get_privateuse1_backend_name() == "privateuseone"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        device.register(force=True)
    print("FORCED:", [str(w.message) for w in caught])
    print("SIMULATED:", torch.spyre.is_simulated(), torch.ones(2).to("spyre").device)
    """
)


def test_import_is_lazy_and_the_real_torch_spyre_wins() -> None:
    # With the torch.backends entry point opted out (test_device_autoload covers it), importing
    # hfadapt registers nothing by itself.
    env = {**os.environ, "HFADAPT_SPYRE_AUTOLOAD": "0"}
    done = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "REFUSED: the real torch-spyre is installed" in out and "force=True" in out, out
    assert "FORCED: ['simulating the Spyre device although torch-spyre is installed" in out, out
    assert "SIMULATED: True spyre:0" in out, out


def test_values_read_back_like_a_device(spyre) -> None:
    x = torch.tensor([[1.5, -2.0], [0.25, 4.0]], dtype=torch.float16).to("spyre")
    assert x.tolist() == [[1.5, -2.0], [0.25, 4.0]]
    assert x.max().item() == 4.0  # (x[1, 1] would slice the stick dimension at an offset)
    assert torch.equal(x, x.clone())
