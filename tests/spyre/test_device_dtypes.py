"""Data types on the eager spyre device: int64 stored as int32 with torch-spyre's warning,
float64 and complex refused, fp32 only in the fp32-capable ops, on-device casts checked, and the
logical dtype of results as torch would give it."""

from __future__ import annotations

import pytest
import torch

from hfadapt.spyre.rules.tracking import SpyreDowncastWarning

INT64_WARNING = "^Backend Spyre does not support int64; downcasting to int32$"


def test_int64_is_downcast_to_int32_with_the_warning(spyre) -> None:
    ids = torch.tensor([0, 7, 2**31 - 1, 2**31, -(2**31) - 1])
    with spyre.tracking() as report, pytest.warns(SpyreDowncastWarning, match=INT64_WARNING):
        on = ids.to("spyre")
    assert report.downcasts == 1
    assert on.dtype == torch.int64, "the tensor still says int64, as on the card"
    assert on._held.dtype == torch.int32, "... and the card stores int32"
    back = on.cpu()
    assert back.dtype == torch.int64
    # values outside the 32-bit range wrap, as a downcast does
    assert back.tolist() == [0, 7, 2**31 - 1, -(2**31), 2**31 - 1], back.tolist()


def test_int64_results_keep_their_logical_dtype(spyre) -> None:
    with pytest.warns(SpyreDowncastWarning):
        a = torch.arange(6).view(2, 3).to("spyre")
    s = a + 1
    assert s.dtype == torch.int64 and s.cpu().tolist() == [[1, 2, 3], [4, 5, 6]]
    assert (a > 2).dtype == torch.bool


@pytest.mark.parametrize(
    ("dtype", "name"), [(torch.float64, "Double"), (torch.complex64, "ComplexFloat")]
)
def test_float64_and_complex_are_refused(spyre, dtype, name) -> None:
    with pytest.raises(RuntimeError, match=f"^Spyre backend does not support dtype {name}$"):
        torch.ones(3, dtype=dtype).to("spyre")
    with pytest.raises(RuntimeError, match=f"^Spyre backend does not support dtype {name}$"):
        torch.ones(3).to("spyre").to(dtype)


def test_float64_in_audit_mode_is_recorded_and_the_run_goes_on(spyre) -> None:
    with spyre.tracking(collect=True) as report:
        on = torch.tensor([1.5, 2.5], dtype=torch.float64).to("spyre")
    assert [v.rule_id for v in report.violations] == ["dtype.fp64.unsupported"]
    assert report.violations[0].location.file == __file__
    assert on.cpu().tolist() == [1.5, 2.5]


def test_fp32_outside_the_fp32_capable_ops_fails(spyre) -> None:
    x = torch.randn(4, 64).to("spyre")
    with pytest.raises(RuntimeError) as info:
        torch.tanh(x)
    assert (
        str(info.value)
        == "Unsupported: Spyre backend does not support: aten::tanh on DataFormats.IEEE_FP32"
    )
    assert info.value.violations[0].rule_id == "dtype.fp32.ops"
    with pytest.raises(RuntimeError, match=r"aten::mm on DataFormats\.IEEE_FP32"):
        torch.mm(x, torch.randn(64, 64).to("spyre"))


def test_fp32_add_works_and_stays_ieee(spyre) -> None:
    a, b = torch.randn(4, 64), torch.randn(4, 64)
    with spyre.tracking() as report:
        out = a.to("spyre") + b.to("spyre")
        scaled = a.to("spyre") * 3.0
    assert report.ok, report.summary()
    assert out.dtype == torch.float32
    assert torch.equal(out.cpu(), a + b), "fp32 results are not rounded to DL16"
    assert torch.equal(scaled.cpu(), a * 3.0)


def test_result_dtypes_follow_torch_promotion(spyre) -> None:
    h = torch.randn(4, 64).half().to("spyre")
    f = torch.randn(4, 64).to("spyre")
    assert (h + f).dtype == torch.float32
    assert (h * 2.5).dtype == torch.float16
    assert h.sum().dtype == torch.float16
    assert (h + torch.tensor(1.0)).dtype == torch.float16  # a 0-dim fp32 does not promote
    out, mean, rstd = torch.ops.aten.native_layer_norm(h, [64], None, None, 1e-5)
    # torch's device-generic answer (the meta kernel): statistics in fp32, output in fp16
    expected = torch.ops.aten.native_layer_norm(h.cpu().to("meta"), [64], None, None, 1e-5)
    assert [t.dtype for t in (out, mean, rstd)] == [t.dtype for t in expected]
    assert out.dtype == torch.float16


def test_casts_on_the_device(spyre) -> None:
    h = torch.tensor([40000.0, 1.0]).to("spyre").half()  # fp32 -> fp16 is an allowed cast
    big = h * 2.0  # 80000 is a DL16 value; fp16 cannot hold it
    assert big.float().cpu().tolist() == [80000.0, 2.0], "DL16 holds 80000"
    assert big.cpu().tolist() == [float("inf"), 2.0], "moving fp16 to the host overflows"
    with pytest.warns(SpyreDowncastWarning):
        mask = torch.tensor([1, 0, 1]).to("spyre")
    with pytest.raises(RuntimeError) as info:
        mask.to(torch.bool)
    assert "cast from int32 to bool on the device" in str(info.value), str(info.value)
    assert info.value.violations[0].rule_id == "dtype.cast"
