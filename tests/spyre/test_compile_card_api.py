"""``torch.compile(model)`` with torch's default backend on a model on ``spyre``: the card's form
(torch-spyre has no Dynamo backend named "spyre"; its inductor compiles for the device the
tensors are on). The same rules, numerics and errors as ``backend="spyre"``, which stays an
alias; a host model still goes to inductor, untouched."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from support.tiny_models import SEQ
from torch import nn

from hfadapt.errors import SpyreOpNotImplementedError
from hfadapt.spyre.compile.backend import SpyreCompileError
from hfadapt.spyre.eager import default_backend

pytestmark = pytest.mark.usefixtures("spyre", "spyre_backend")


class Block(nn.Module):
    """Linear, gelu (compiled-only on the card: the eager device refuses it), Linear,
    LayerNorm, softmax: widths on sticks."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(64, 128)
        self.down = nn.Linear(128, 64)
        self.norm = nn.LayerNorm(64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.norm(self.down(F.gelu(self.up(x)))), dim=-1)


def _host(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SEQ, 64, generator=g).half()


def _block() -> Block:
    torch.manual_seed(0)
    return Block().eval().half()


def _both(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> dict[str, torch.Tensor]:
    """fn compiled with the default backend, then with ``backend="spyre"``: results on the host."""
    out = {}
    for name, backend in (("default", "inductor"), ("spyre", "spyre")):
        torch._dynamo.reset()
        compiled = (
            torch.compile(fn) if backend == "inductor" else torch.compile(fn, backend=backend)
        )
        with torch.no_grad():
            result = compiled(*args)
        assert result.device.type == "spyre", (name, result.device)
        out[name] = result.cpu()
    return out


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().float() - b.detach().float()).abs().nan_to_num(nan=1e9).max())


def _errors(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> dict[str, BaseException]:
    """What fn compiled with the default backend, then with ``backend="spyre"``, raises."""
    errors: dict[str, BaseException] = {}
    for name, backend in (("default", "inductor"), ("spyre", "spyre")):
        torch._dynamo.reset()
        compiled = (
            torch.compile(fn) if backend == "inductor" else torch.compile(fn, backend=backend)
        )
        with pytest.raises(Exception) as caught, torch.no_grad():
            compiled(*args)
        errors[name] = caught.value
    return errors


def to_device(host: torch.Tensor) -> torch.Tensor:
    return (host * 2 + 1).to("spyre")  # a graph of host values whose result is on the device


def mixed(host: torch.Tensor, dev: torch.Tensor) -> torch.Tensor:
    return (host * 2 + 1).to("spyre") + dev


@pytest.mark.parametrize("case", ["model_on_spyre", "host_to_spyre_graph", "mixed_inputs"])
def test_the_default_backend_computes_bit_for_bit_what_backend_spyre_does(
    case: str, spyre_backend: object
) -> None:
    x = _host()
    if case == "model_on_spyre":
        model = _block().to("spyre")
        got = _both(model, x.to("spyre"))
        # the ops were judged by the compiled mode's rules: the eager device refuses gelu
        with pytest.raises(SpyreOpNotImplementedError, match="gelu"), torch.no_grad():
            model(x.to("spyre"))
        reference = _block().float()(x.float())
        err = _max_diff(got["default"], reference)
        print(f"max |default - fp32 CPU reference| = {err:.3g}")
        assert err < 0.02, err
    elif case == "host_to_spyre_graph":
        # the graph Dynamo captures makes a device tensor: it is the device compiler's graph
        # (inductor itself failed on it: KeyError 'spyre')
        got = _both(to_device, x)
        report = spyre_backend.last_report()  # type: ignore[attr-defined]
        assert report is not None and report.ops_seen["aten::_to_copy"] == 1, report
    else:
        got = _both(mixed, x, _host(1).to("spyre"))
    diff = _max_diff(got["default"], got["spyre"])
    print(f"{case}: max |default backend - backend='spyre'| = {diff}")
    assert got["default"].dtype == got["spyre"].dtype == torch.float16
    assert diff == 0.0, f"{case}: the default backend differs from backend='spyre' by {diff}"


def test_a_rule_the_card_refuses_raises_the_same_error_either_way() -> None:
    """stack is eager-only on the card: compiled, on device tensors, it is refused (the eager
    device runs it); pow(x, 3.0) in a captured graph is refused by the graph's judgement."""
    x = _host().to("spyre")
    with torch.no_grad():
        eager = torch.stack([x, x * 2]).cpu()
    assert eager.shape == (2, SEQ, 64)
    errors = _errors(lambda t: torch.stack([t, t * 2]), x)
    print({k: f"{type(e).__name__}: {e}" for k, e in errors.items()})
    assert type(errors["default"]) is type(errors["spyre"]) is SpyreOpNotImplementedError
    assert str(errors["default"]) == str(errors["spyre"])
    assert "aten::stack (eager only)" in str(errors["default"])

    errors = _errors(lambda h: torch.pow(h, 3.0).to("spyre"), _host())
    print({k: f"{type(e).__name__}: {e}" for k, e in errors.items()})
    assert type(errors["default"]) is type(errors["spyre"]) is SpyreCompileError
    assert str(errors["default"]) == str(errors["spyre"])
    rules = [v.rule_id for v in errors["default"].report.violations]
    assert rules == ["op.pow.square"], rules


@pytest.mark.parametrize("other", ["eager", "aot_eager"])
def test_backends_that_do_not_compile_keep_the_eager_rules(other: str) -> None:
    """backend="eager" runs the ops eagerly, on the card too: gelu stays refused."""
    torch._dynamo.reset()
    with pytest.raises(SpyreOpNotImplementedError, match="gelu"), torch.no_grad():
        torch.compile(F.gelu, backend=other)(_host().to("spyre"))


def test_a_host_model_compiles_with_inductor_untouched(
    spyre_backend: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CPU model with the default backend: inductor's own passes run on its graph, the
    device's compiler is never asked, no lowering report appears, and the numbers are
    inductor's (fp32, close to eager)."""
    from torch._inductor import config
    from torch._inductor.custom_graph_pass import CustomGraphPass

    asked: list[int] = []
    lookup = default_backend.device_compiler

    def counting() -> Callable[..., object]:
        asked.append(1)
        return lookup()

    class InductorRan(CustomGraphPass):
        graphs = 0

        def __call__(self, graph: torch.fx.Graph) -> None:
            InductorRan.graphs += 1

        def uuid(self) -> None:  # no cache key: inductor compiles it afresh
            return None

    monkeypatch.setattr(default_backend, "device_compiler", counting)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64)).eval()
    x = torch.randn(8, 64)
    torch._dynamo.reset()
    with config.patch(post_grad_custom_post_pass=InductorRan()), torch.no_grad():
        out = torch.compile(model)(x)
        ref = model(x)
    diff = _max_diff(out, ref)
    print(
        f"inductor graphs: {InductorRan.graphs}, device compiler asked: {len(asked)}, "
        f"max |inductor - eager| = {diff:.3g}, compile_fx routed: {default_backend.routed()}"
    )
    assert default_backend.routed(), "compile_fx is not wrapped: the test proves nothing"
    assert InductorRan.graphs == 1 and asked == []
    assert spyre_backend.last_report() is None  # type: ignore[attr-defined]
    assert out.device.type == "cpu" and out.dtype == torch.float32
    assert diff < 1e-5, diff


def test_a_fresh_process_compiles_the_cards_way_with_nothing_but_import_torch() -> None:
    """import torch (hfadapt's torch.backends entry point registers the device), a model on
    spyre, torch.compile with the default backend: it compiles by the card's rules (gelu,
    compiled-only, runs), a graph that makes device tensors finds the device compiler
    through Dynamo's registry, and inductor is imported only by the compile."""
    script = (
        "import sys, torch\n"
        "import torch.nn.functional as F\n"
        "print('inductor after import torch:', 'torch._inductor.compile_fx' in sys.modules)\n"
        "x = torch.randn(4, 64).half()\n"
        "out = torch.compile(lambda t: F.gelu(t))(x.to('spyre'))\n"
        "print(out.device, float((out.cpu().float() - F.gelu(x.float())).abs().max()))\n"
        "made = torch.compile(lambda h: (h * 2 + 1).to('spyre'))(x)\n"
        "print(made.device, float((made.cpu().float() - (x.float() * 2 + 1)).abs().max()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    print(done.stdout, done.stderr[-2000:])
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].endswith("False"), lines
    for line in lines[1:3]:
        device, err = line.split()
        assert device == "spyre:0" and float(err) < 0.05, line
