"""One card, four ways in: eager ops on ``spyre`` tensors, ``torch.compile(..., backend="spyre")``
on host tensors, the same compile on tensors already on ``spyre`` (torch-spyre's documented use:
``model.to("spyre")``, then compile), and the eager device inside such a call. The card's eager
kernels are per-op compiles (torch-spyre ``ops/eager.py``), so each way gives the same rules,
numerics, softmax leak and per-op defects. Public entry points only."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F


@pytest.fixture
def card(spyre: object, spyre_backend: object) -> object:
    return spyre_backend


def _three_ways(fn: object, *inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """fn on the eager device, compiled on host tensors, compiled on device tensors."""
    compiled = torch.compile(fn, backend="spyre")  # type: ignore[arg-type]
    with torch.no_grad():
        eager = fn(*(t.to("spyre") for t in inputs))  # type: ignore[operator]
        host = compiled(*inputs)
        torch._dynamo.reset()
        resident = torch.compile(fn, backend="spyre")(*(t.to("spyre") for t in inputs))  # type: ignore[arg-type]
    return {"eager": eager.cpu(), "compiled": host.cpu(), "resident": resident.cpu()}


def _same(results: dict[str, torch.Tensor]) -> None:
    base = results["eager"]
    for name, got in results.items():
        diff = float((got.float() - base.float()).abs().nan_to_num(nan=1e9).max())
        print(f"{name}: max |diff| against eager {diff:.3g}")
        assert got.dtype == base.dtype and torch.equal(got.isnan(), base.isnan()), name
        assert diff == 0.0, f"{name} differs from eager by {diff}"


def test_a_plain_fp16_product(card: object) -> None:
    """Compiling ``t * t`` on a tensor already on spyre used to raise "Tensor.item() cannot be
    called on meta tensors" (Dynamo traced the simulator's own rounding)."""
    x = torch.randn(4, 64).half()
    results = _three_ways(lambda t: t * t, x)
    _same(results)
    expected = (x.float() * x.float()).half()
    assert float((results["resident"].float() - expected.float()).abs().max()) < 0.05
    # one compiled function called on host tensors, then on device tensors (the order the card's failure was reported in)
    torch._dynamo.reset()
    square = torch.compile(lambda t: t * t, backend="spyre")
    host = square(x)
    resident = square(x.to("spyre")).cpu()
    assert torch.equal(host, resident), float((host.float() - resident.float()).abs().max())


def test_softmax_leaks_the_same_way_everywhere(card: object) -> None:
    """A -inf-masked key keeps the card's leak in every way in (compiled on spyre tensors had
    none)."""
    x = torch.randn(2, 128).half()
    x[:, 64:] = float("-inf")
    results = _three_ways(lambda t: torch.softmax(t, -1), x)
    _same(results)
    leak = float(results["resident"][:, 64:].float().max())
    print(f"masked probability {leak:.2e}")
    assert 1e-7 < leak <= 4.95e-5


def test_rms_norm_is_the_cards_whatever_the_way(card: object) -> None:
    """F.rms_norm and nn.RMSNorm (compiled with grad enabled too: its weight requires grad)
    are the card's native rms_norm, reduced-precision, in every way: compiled on spyre tensors
    it was fp16-exact, compiled on host tensors with grad enabled it was refused as fp32 pow."""
    x = (torch.randn(8, 1024) / 32).half()
    norm = torch.nn.RMSNorm(1024, eps=1e-6).half()
    ref = F.rms_norm(x.float(), [1024], None, 1e-6)
    eager = norm.to("spyre")(x.to("spyre")).detach().cpu()
    norm = norm.cpu()
    host = torch.compile(norm, backend="spyre")(x).detach()  # grad enabled
    torch._dynamo.reset()
    resident = torch.compile(norm.to("spyre"), backend="spyre")(x.to("spyre")).detach().cpu()
    for name, got in (("eager", eager), ("compiled", host), ("resident", resident)):
        rel = float(((got.float() - ref).abs() / ref.abs().clamp_min(1e-6)).mean())
        print(f"{name}: mean relative error {rel:.3%}")
        assert 0.004 < rel < 0.03, (name, rel)  # reduced precision, not fp16-exact (< 0.1%)
        assert torch.equal(got, eager), name


def test_sdpa_and_its_transposed_qkv_defect(card: object) -> None:
    """SDPA lowers on spyre tensors too (it errored), and a Q/K/V reaching it as a transposed
    view is misread eagerly as compiled (defect.transpose_sdpa_noncontiguous)."""
    from hfadapt.spyre.eager.device import tracking

    q = torch.randn(1, 64, 2, 64).half()  # [B, S, H, D]

    def attend(t: torch.Tensor) -> torch.Tensor:
        heads = t.transpose(1, 2)  # [B, H, S, D], non-contiguous
        return F.scaled_dot_product_attention(heads, heads, heads)

    def straight(t: torch.Tensor) -> torch.Tensor:
        heads = t.transpose(1, 2).contiguous()
        return F.scaled_dot_product_attention(heads, heads, heads)

    ref = straight(q.float()).half()
    with tracking(mode="eager", collect=True) as report:
        eager = attend(q.to("spyre")).cpu()
    resident = torch.compile(attend, backend="spyre")(q.to("spyre")).cpu()
    host = torch.compile(attend, backend="spyre")(q)
    cos = {
        name: float(F.cosine_similarity(got.float().flatten(), ref.float().flatten(), 0))
        for name, got in (("eager", eager), ("resident", resident), ("compiled", host))
    }
    print(f"cosine to the right result: {cos}; eager firings {report.defect_ids()}")
    assert "defect.transpose_sdpa_noncontiguous" in report.defect_ids()
    assert all(c < 0.9 for c in cos.values()), cos
    fixed = torch.compile(straight, backend="spyre")(q.to("spyre")).cpu()
    assert float(F.cosine_similarity(fixed.float().flatten(), ref.float().flatten(), 0)) > 0.999


def test_exp_past_the_first_stick_is_wrong_eagerly_too(card: object) -> None:
    """torch-spyre#3799 reaches eager: the card's eager exp is a per-op compile."""
    from hfadapt.spyre.eager.device import tracking

    x = torch.randn(63, 100).half()
    with tracking(mode="eager", collect=True) as report:
        results = _three_ways(torch.exp, x)
    _same(results)
    err = float((results["eager"].float() - x.float().exp()).abs().max())
    print(f"max abs error {err:.2f}; firings {report.defect_ids()}")
    assert err > 10 and "defect.exp_unaligned" in report.defect_ids()


def test_a_second_shape_compiles_static_again(card: object) -> None:
    """Dynamo makes a recompiled frame's sizes symbolic by itself; the card compiles each
    static shape, so a second shape is no dynamic-shape refusal."""
    f = torch.compile(lambda t: torch.exp(t) * 2, backend="spyre")
    with torch.no_grad():
        a = f(torch.randn(4, 64).half())
        b = f(torch.randn(8, 128).half())
    assert a.shape == (4, 64) and b.shape == (8, 128)


def test_compiled_rules_hold_for_device_tensors(card: object) -> None:
    """gelu is compiled-only on the card: compiled on spyre tensors it lowers, as compiled on
    host tensors; the eager device refuses it."""
    from hfadapt.spyre.eager.device import tracking

    x = torch.randn(4, 64).half()
    compiled = torch.compile(F.gelu, backend="spyre")
    with torch.no_grad():
        resident = compiled(x.to("spyre")).cpu()
    assert float((resident.float() - F.gelu(x.float())).abs().max()) < 0.01
    with tracking(mode="eager", collect=True) as report:
        F.gelu(x.to("spyre"))
    assert [v.rule_id for v in report.violations] == ["op.gelu"]


@pytest.mark.slow
def test_minilm_compiled_on_the_device(minilm_path: object) -> None:
    """all-MiniLM-L6-v2 as hfadapt.load leaves it (adapted, fp16, on spyre), then compiled as
    torch-spyre's docs say: it runs (it raised a spurious dynamic-shape error) and gives the
    eager device's sentence embeddings."""
    import hfadapt

    model = hfadapt.load(str(minilm_path), sentence_transformers=False)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_path))
    batch = tok(
        ["Spyre runs this.", "A second, longer sentence."], padding=True, return_tensors="pt"
    )
    inputs = {k: v.to("spyre") for k, v in batch.items()}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eager = model(**inputs).last_hidden_state.cpu().float()
        compiled = torch.compile(model, backend="spyre")(**inputs).last_hidden_state.cpu().float()
    cos = float(F.cosine_similarity(eager, compiled, -1)[batch["attention_mask"].bool()].min())
    print(f"min per-token cosine, compiled on the device vs eager: {cos:.6f}")
    assert cos > 0.9999, cos


def _fresh_process(script: str) -> list[str]:
    """The lines ``script`` prints, run in a fresh interpreter (it must exit 0)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    print(done.stdout, done.stderr[-2000:])
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.splitlines()


def test_a_fresh_process_compiles_on_device_tensors_first_thing() -> None:
    """In a fresh process (nothing warmed up), the first thing a user does, torch-spyre's way:
    compile, call on spyre tensors. Dynamo used to trace the device's own code there and fail
    ("Tensor.item() cannot be called on meta tensors")."""
    lines = _fresh_process(
        "import torch, hfadapt.spyre.eager.device as d\n"
        "from hfadapt.spyre.compile import backend\n"
        "d.register(); backend.register()\n"
        "x = torch.randn(4, 64).half()\n"
        "out = torch.compile(lambda t: t * t, backend='spyre')(x.to('spyre'))\n"
        "print(out.device, float((out.cpu().float() - (x.float() * x.float())).abs().max()))\n"
    )
    device, err = lines[0].split()
    assert device == "spyre:0" and float(err) < 0.05


def test_import_torch_leaves_dynamo_alone_until_a_compile_brings_it() -> None:
    """The device's autoload does not import Dynamo (over a second of every ``import torch``
    in an environment with hfadapt); when a compile imports it later, on tensors already on
    the device, the dispatch is still kept out of Dynamo's tracing."""
    lines = _fresh_process(
        "import sys, torch\n"
        "print('dynamo after import torch:', 'torch._dynamo' in sys.modules)\n"
        "x = torch.randn(4, 64).half()\n"
        "xs = x.to('spyre')\n"
        "print('dynamo after a device op:', 'torch._dynamo' in sys.modules)\n"
        "out = torch.compile(lambda t: t * t, backend='spyre')(xs)\n"
        "print(out.device, float((out.cpu().float() - (x.float() * x.float())).abs().max()))\n"
    )
    assert lines[0].endswith("False") and lines[1].endswith("False"), lines
    device, err = lines[2].split()
    assert device == "spyre:0" and float(err) < 0.05, lines[2]
