"""Ops on the eager spyre device, judged by the profile: native ops run, fallbacks warn and are
counted, unsupported ops raise the upstream message (or are recorded in audit mode), layout
rules are checked, and the report says where in the model each violation came from."""

from __future__ import annotations

import threading

import pytest
import torch

from hfadapt.spyre.numerics.dl16 import round_dl16
from hfadapt.spyre.rules.tracking import SpyreDowncastWarning, SpyreFallbackWarning

EAGER_TEXT = "with arguments from the 'PrivateUse1' backend"


def _fp16(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return round_dl16(torch.randn(*shape, generator=g)).half()


def test_pow_square_runs_and_cube_is_refused(spyre) -> None:
    x = _fp16(4, 64)
    sq = torch.pow(x.to("spyre"), 2).cpu()
    expected = round_dl16(x.float() ** 2).half()
    assert torch.equal(sq, expected), (sq.float() - expected.float()).abs().max().item()
    with pytest.raises(NotImplementedError) as info:
        torch.pow(x.to("spyre"), 3.0)
    message = str(info.value)
    assert message.startswith("Could not run 'aten::pow.Tensor_Scalar'") and EAGER_TEXT in message
    assert info.value.violations[0].rule_id == "op.pow.square"


@pytest.mark.parametrize(
    ("fn", "op"),
    [(torch.tril, "aten::tril"), (lambda t: torch.cumsum(t, dim=-1), "aten::cumsum")],
)
def test_fallbacks_warn_and_are_counted(spyre, fn, op) -> None:
    x = _fp16(8, 64)
    with spyre.tracking() as report:
        on = x.to("spyre")
        with pytest.warns(SpyreFallbackWarning, match=f"^{op} is falling back to cpu$"):
            out = fn(on)
            fn(on)
    assert report.fallbacks[op] == 2, dict(report.fallbacks)
    assert report.ok and report.ops_seen[op] == 2
    # the host computes in fp16 (the logical dtype); the result comes back rounded to DL16
    expected = round_dl16(fn(x).float()).half()
    assert out.device.type == "spyre" and out.dtype == torch.float16
    diff = (out.cpu().float() - expected.float()).abs().max().item()
    assert diff == 0.0, f"{op} result differs from the host's by {diff}"


def test_gelu_is_compiled_only(spyre) -> None:
    x = _fp16(4, 64).to("spyre")
    with pytest.raises(NotImplementedError, match=r"^Could not run 'aten::gelu' with arguments"):
        torch.nn.functional.gelu(x)
    with spyre.tracking(mode="compile") as report:
        out = torch.nn.functional.gelu(x)  # the compile-mode rules: gelu is native there
    assert report.ok and out.dtype == torch.float16


def test_matmul_k_off_the_stick_is_a_layout_violation(spyre) -> None:
    a, b = _fp16(16, 32).to("spyre"), _fp16(32, 64, seed=1).to("spyre")
    with pytest.raises(RuntimeError) as info:
        torch.mm(a, b)
    assert "K=32 is not a multiple of the stick size 64" in str(info.value), str(info.value)
    v = info.value.violations[0]
    assert (v.rule_id, v.op, v.kind) == ("layout.matmul_k", "aten::mm", "layout")
    a64, b64 = _fp16(16, 64), _fp16(64, 32, seed=1)
    out = torch.mm(a64.to("spyre"), b64.to("spyre")).cpu()
    expected = round_dl16(a64.float() @ b64.float()).half()
    diff = (out.float() - expected.float()).abs().max().item()
    assert diff == 0.0, f"K=64 matmul differs from fp32-then-round by {diff}"


def test_audit_mode_records_every_violation_with_its_location(spyre) -> None:
    x = _fp16(4, 64).to("spyre")
    with spyre.tracking(collect=True) as report:
        cube = torch.pow(x, 3.0)  # refused, but the run goes on
        g = torch.nn.functional.gelu(x)
        torch.pow(x, 3.0)  # the same violation again: recorded once
    rules = [v.rule_id for v in report.violations]
    assert rules == ["op.pow.square", "op.gelu"], rules
    loc = report.violations[0].location
    assert loc is not None and loc.file == __file__ and loc.function.startswith("test_audit")
    assert loc.code == "cube = torch.pow(x, 3.0)  # refused, but the run goes on"
    # refused ops still compute, as a native op would: fp32 on the held data, rounded to DL16
    host = x.cpu().float()
    assert torch.equal(cube.cpu(), round_dl16(host**3.0).half())
    assert torch.equal(g.cpu(), round_dl16(torch.nn.functional.gelu(host)).half())
    assert report.ops_seen["aten::pow.Tensor_Scalar"] == 2


def test_sdpa_with_head_dim_32_is_a_matmul_k_violation(spyre) -> None:
    q = _fp16(1, 2, 64, 32).to("spyre")
    with spyre.tracking(collect=True) as report:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    ks = sorted(
        {v.message.split(" ")[3] for v in report.violations if v.rule_id == "layout.matmul_k"}
    )
    assert ks == ["K=32"], [str(v) for v in report.violations]
    assert report.ops_seen["aten::bmm"] == 2, "SDPA runs as its math decomposition, piece by piece"
    ref = torch.nn.functional.scaled_dot_product_attention(*(q.cpu().float(),) * 3)
    err = (out.cpu().float() - ref).abs().max().item()
    assert err < 2e-2, f"DL16 attention off by {err} from fp32"


def test_mixing_host_and_device_tensors_fails(spyre) -> None:
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3).to("spyre") + torch.ones(3)
    # a 0-dim host tensor is a scalar, as on any torch device
    out = torch.ones(3).to("spyre") * torch.tensor(2.0)
    assert out.cpu().tolist() == [2.0, 2.0, 2.0]


def test_tracking_is_per_thread(spyre) -> None:
    x = _fp16(8, 64).to("spyre")
    reports = {}

    def work(name: str, count: int) -> None:
        with spyre.tracking() as report:
            for _ in range(count):
                torch.tril(x)
        reports[name] = report

    with pytest.warns(SpyreFallbackWarning):
        threads = [threading.Thread(target=work, args=(f"t{n}", n)) for n in (1, 2, 3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    counts = {name: r.fallbacks["aten::tril"] for name, r in sorted(reports.items())}
    assert counts == {"t1": 1, "t2": 2, "t3": 3}, counts


def test_nested_tracking_merges_into_the_outer_report(spyre) -> None:
    x = _fp16(8, 64).to("spyre")
    with spyre.tracking(collect=True) as outer:
        with spyre.tracking(collect=True) as inner:
            torch.nn.functional.gelu(x)
        x + x
    assert [v.rule_id for v in inner.violations] == ["op.gelu"]
    assert [v.rule_id for v in outer.violations] == ["op.gelu"]
    assert outer.ops_seen["aten::add.Tensor"] == 1 and outer.ops_seen["aten::gelu"] == 1


def test_set_profile_changes_the_rules(spyre) -> None:
    with pytest.warns(SpyreDowncastWarning):
        ids = torch.tensor([[1, 2, 3]]).to("spyre")
    table = _fp16(8, 64).to("spyre")
    with pytest.warns(SpyreFallbackWarning, match="aten::embedding is falling back"):
        torch.nn.functional.embedding(ids, table)
    spyre.set_profile("spyre-2026.10")  # upstream made embedding native later
    assert spyre.active_profile().name == "spyre-2026.10"
    with spyre.tracking() as report:
        out = torch.nn.functional.embedding(ids, table)
    assert not report.fallbacks and report.profile_name == "spyre-2026.10"
    assert torch.equal(out.cpu(), table.cpu()[[1, 2, 3]].unsqueeze(0))


def test_eval_dropout_hands_its_input_on_and_training_dropout_drops(spyre) -> None:
    """Dropout reaches the device as its C++ composite kernel does on a real device: in eval
    mode it returns its input (no copy reaches the card; PyTorch's Python decomposition would
    clone), in training mode it runs native_dropout."""
    x = _fp16(16, 64).to("spyre")
    with torch.inference_mode(), spyre.tracking(collect=True) as report:
        same = torch.nn.functional.dropout(x, 0.1, training=False)
    assert same is x
    assert dict(report.ops_seen) == {}, dict(report.ops_seen)
    with spyre.tracking(collect=True) as report:
        dropped = torch.nn.functional.dropout(x, 0.5, training=True).cpu()
    zeros = float((dropped == 0).float().mean())
    kept = dropped != 0
    assert 0.35 < zeros < 0.65, zeros
    scaled = (x.cpu().float() * 2)[kept]
    assert torch.equal(dropped.float()[kept], scaled), "kept values are scaled by 1 / (1 - p)"
    assert report.ops_seen["aten::native_dropout"] == 1, dict(report.ops_seen)


def test_binary_ops_of_dl16_operands_wait_in_a_row_program(spyre) -> None:
    """On the eager device, add/sub/mul/div of fp16 operands (or a number beside one) wait in a
    row program (hfadapt.spyre.eager.fusion) and give the values of the op and its rounding; a
    mixed-dtype call (fp16 with fp32: an fp32 result) runs at once and is not rounded."""
    x, w, r = _fp16(32, 128), _fp16(128, seed=1), _fp16(32, 1, seed=2)
    dx, dw, dr = x.to("spyre"), w.to("spyre"), r.to("spyre")
    with torch.inference_mode():
        cases = {
            "x * w": (lambda a, b, c: a * b, dx * dw),
            "r - x": (lambda a, b, c: c - a, dr - dx),
            "x + 0.25": (lambda a, b, c: a + 0.25, dx + 0.25),
            "x / r": (lambda a, b, c: a / c, dx / dr),
        }
        waiting = [name for name, (_, device) in cases.items() if device._data is None]
        assert waiting == list(cases), waiting
        for name, (f, device) in cases.items():
            want = round_dl16(f(x.float(), w.float(), r.float())).half()
            got = device.cpu()
            assert got.dtype == torch.float16, (name, got.dtype)
            assert torch.equal(got, want), (name, int((got != want).sum()))
        wide = torch.full((128,), 1.0 + 2**-20)  # no DL16 (nor fp16) value: an fp32 operand
        mixed = dx * wide.to("spyre")
        assert mixed._data is not None and mixed.dtype == torch.float32, mixed.dtype
        assert torch.equal(mixed.cpu(), x.float() * wide), "an fp32 result is not rounded to DL16"
