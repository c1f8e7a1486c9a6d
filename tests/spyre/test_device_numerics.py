"""DL16 numerics: round_dl16 against properties and against an independent bit-level reference
written here, the rounding of fp16 data moved to the device, and the device's layer norm, whose
statistics stay in DL16."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hfadapt.spyre import kernels
from hfadapt.spyre.dl16 import DEFAULT_FORMAT, round_dl16
from hfadapt.spyre.profile import load_profile

# Published numbers (torch-spyre _inductor/constants.py DLFLOAT16_MAX, "0x7FFF is NaN-Infinity";
# the hardware-simulating Triton matmul's clamp_acc_to_dl16 for the smallest normal; hf-adapters
# hf_common.py), written out here, not read from hfadapt.
MAX = 8573157376.0  # 0x7FFE: (1 + 510/512) * 2^32
MIN_NORMAL = 4.6657e-10  # 2^-31 * (1 + 2^-9), as published (4 digits)
HOST_INF = 33521664.0  # 0xEFFF's magnitude: (2 - 2^-9) * 2^24, "about 3.35e7"
MIN_NORMAL_EXACT = 2.0**-31 * (1 + 2.0**-9)


def reference_dl16(x: float, transfer: bool = False) -> float:
    """DL16 rounding of one float32 on its bit pattern: keep 9 of the 23 mantissa bits,
    round to nearest with ties to even, NaN past MAX (device arithmetic overflows onto the
    0x7FFF symbol), flush results below 2^-31 * (1 + 2^-9) to zero, keep NaN; with `transfer`
    (a host value moved onto the device) +-inf lands on +-HOST_INF. Independent of hfadapt's
    implementation."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    negative = bool(bits >> 31)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    if exponent == 0xFF:
        if mantissa:
            return math.nan
        if transfer:
            return -HOST_INF if negative else HOST_INF
        return math.nan
    if exponent == 0:  # float32 subnormals: far below DL16's range
        return 0.0
    dropped = 23 - 9
    kept, rest = mantissa >> dropped, mantissa & ((1 << dropped) - 1)
    half = 1 << (dropped - 1)
    if rest > half or (rest == half and kept & 1):
        kept += 1
    value = (1 + kept / 2**9) * 2.0 ** (exponent - 127)  # kept == 512 carries into the exponent
    if value > MAX:
        return math.nan
    if value < MIN_NORMAL_EXACT:
        value = 0.0
    return -value if negative else value


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _rounded(values: list[float], transfer: bool = False) -> list[float]:
    return round_dl16(torch.tensor(values, dtype=torch.float32), transfer=transfer).tolist()


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


float32s = st.floats(width=32, allow_nan=True, allow_infinity=True)
bit_patterns = st.integers(min_value=0, max_value=2**32 - 1).map(_f32)
finite_normals = st.floats(
    min_value=MIN_NORMAL_EXACT, max_value=MAX, width=32, allow_subnormal=False
).flatmap(lambda v: st.sampled_from([v, -v]))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(float32s, bit_patterns), min_size=1, max_size=64),
    st.booleans(),
)
@example(
    [
        2.0**-31,
        MIN_NORMAL_EXACT,
        MIN_NORMAL_EXACT * (1 - 2.0**-12),
        2.0**-31 * (1 + 2.0**-10),
        MAX,
        MAX + 2.0**21,
        MAX + 2.0**22,
        MAX + 2.0**23,
        1 + 2.0**-10,
        1 + 3 * 2.0**-10,
        math.inf,
        -math.inf,
    ],
    False,
)
def test_agrees_with_the_bit_level_reference(values: list[float], transfer: bool) -> None:
    got = _rounded(values, transfer)
    for x, y in zip(values, got, strict=True):
        expected = reference_dl16(x, transfer)
        assert _same(y, expected), (
            f"round_dl16({x!r}, transfer={transfer}) = {y!r}, reference says {expected!r}"
        )


@settings(max_examples=200, deadline=None)
@given(st.lists(float32s, min_size=1, max_size=64))
def test_idempotent(values: list[float]) -> None:
    once = _rounded(values)
    twice = _rounded(once)
    bad = [(a, b) for a, b in zip(once, twice, strict=True) if not _same(a, b)]
    assert not bad, f"rounding twice changed {bad[:5]}"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False), min_size=2, max_size=64))
def test_monotonic(values: list[float]) -> None:
    values.sort()
    got = _rounded(values)
    drops = [(values[i], got[i], got[i + 1]) for i in range(len(got) - 1) if got[i] > got[i + 1]]
    assert not drops, f"rounding is not monotonic at {drops[:3]}"


@settings(max_examples=300, deadline=None)
@given(st.lists(finite_normals, min_size=1, max_size=64))
def test_error_is_at_most_half_an_ulp(values: list[float]) -> None:
    got = _rounded(values)
    worst = max(abs(y - x) / abs(x) for x, y in zip(values, got, strict=True))
    assert worst <= 2.0**-10, f"relative error {worst:.3g} > 2^-10"


def test_range_matches_the_published_constants() -> None:
    fmt = DEFAULT_FORMAT
    print(f"max finite: measured {fmt.max_finite!r}, published {MAX!r} (0x7FFE)")
    print(f"min normal: measured {fmt.min_normal:.5g}, published {MIN_NORMAL} (2^-31 * (1 + 2^-9))")
    print(f"host -inf lands on: measured {fmt.decode(0xEFFF)!r}, published about -3.35e7")
    assert fmt.max_finite == MAX, f"max finite {fmt.max_finite!r} != {MAX!r}"
    assert abs(fmt.min_normal - MIN_NORMAL) / MIN_NORMAL < 1e-4, f"min normal {fmt.min_normal!r}"
    assert fmt.decode(0x0001) == fmt.min_normal, "exponent field 0 is a normal binade"
    assert fmt.decode(0xEFFF) == -HOST_INF and round(fmt.decode(0xEFFF) / 1e7, 2) == -3.35
    # both ends survive rounding; an ulp past MAX (the 0x7FFF code) reads as NaN, and just below
    # MIN flushes
    got = _rounded([MAX, -MAX, MIN_NORMAL_EXACT, MAX + 2.0**23, 2.0**-31 * (1 + 2.0**-11)])
    assert got[:3] == [MAX, -MAX, MIN_NORMAL_EXACT] and math.isnan(got[3]) and got[4] == 0.0, got


def test_device_arithmetic_overflows_to_nan_not_saturation() -> None:
    """An overflowing result lands on 0xFFFF/0x7FFF, the NaN/infinity symbol, and reads back
    as NaN (torch-spyre's tests: "overflows to NINF ... decoded as NaN")."""
    got = _rounded([math.inf, -math.inf, 1e30, -1e30, 3.4e38, 2.0**33])
    print(f"overflowing results: {got}")
    assert all(math.isnan(v) for v in got), got


def test_host_infinity_lands_on_0xEFFF() -> None:
    got = _rounded([math.inf, -math.inf, 65472.0, math.nan], transfer=True)
    print(f"host [inf, -inf] on the device: measured {got[:2]}, published +-3.35e7 (0xEFFF)")
    assert got[:3] == [HOST_INF, -HOST_INF, 65472.0] and math.isnan(got[3]), got


def test_eager_device_overflow_and_host_infinity(spyre) -> None:  # type: ignore[no-untyped-def]
    host = torch.tensor([-math.inf, math.inf, 49152.0], dtype=torch.float16)
    on_device = host.to("spyre")
    landed = on_device._held.tolist()  # what the card holds (DL16 values in float32)
    print(f"eager: host fp16 [-inf, inf] moved to the device -> {landed[:2]}")
    assert landed == [-HOST_INF, HOST_INF, 49152.0], landed
    # 49152^2 = 2.4e9 fits DL16 (fp16 would overflow); * 49152 again (1.2e14) does not
    x = torch.full((64,), 49152.0, dtype=torch.float16).to("spyre")
    square = (x * x)._held[0].item()
    cube = (x * x * x)._held[0].item()
    print(f"eager: 49152^2 on the device = {square:.6g}, 49152^3 = {cube}")
    assert square == 49152.0**2 and math.isnan(cube), (square, cube)


@given(st.floats(min_value=_f32(1), max_value=2.0**-31, width=32))
def test_flush_below_the_smallest_normal(x: float) -> None:
    assert _rounded([x, -x]) == [0.0, 0.0]


def test_nan_is_kept_and_min_normal_survives() -> None:
    got = _rounded([math.nan, -math.nan, MIN_NORMAL_EXACT, -MIN_NORMAL_EXACT])
    assert math.isnan(got[0]) and math.isnan(got[1]), got
    assert got[2:] == [MIN_NORMAL_EXACT, -MIN_NORMAL_EXACT], got


def test_moving_fp16_to_the_device_rounds_it(spyre) -> None:
    # every fp16 value in [0.5, 1): 1024 values, 10 mantissa bits; DL16 keeps 9
    grid = (0.5 + torch.arange(1024, dtype=torch.float32) / 2048).half()
    back = grid.to("spyre").cpu()
    change = (back.float() - grid.float()).abs()
    assert change.max().item() == 2.0**-11, f"largest change {change.max().item()}"
    assert (change > 0).sum().item() == 512, "every odd fp16 mantissa moves"
    assert torch.equal(back.to("spyre").cpu(), back), "DL16 data moves unchanged"


def _layer_norm_inputs() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    # a large mean and a unit spread: E[x^2] ~ 9e4, where DL16's spacing is 128
    return round_dl16(300.0 + torch.randn(4, 64, generator=g)).half()


def test_layer_norm_statistics_in_dl16_differ_from_fp32(spyre) -> None:
    x = _layer_norm_inputs()
    w, b = torch.ones(64, dtype=torch.float16), torch.zeros(64, dtype=torch.float16)
    ref = torch.nn.functional.layer_norm(x.float(), (64,), w.float(), b.float())
    device = torch.nn.functional.layer_norm(x.to("spyre"), (64,), w.to("spyre"), b.to("spyre"))
    out = device.cpu().float()
    bad = out.isnan() | (out - ref).abs().gt(0.5)
    assert bad.float().mean().item() > 0.5, (
        f"DL16 statistics should wreck a large-mean layer norm; max diff "
        f"{(out - ref).abs().nan_to_num(float('inf')).max().item()}"
    )
    # and the kernel's variance is E[x^2] - E[x]^2 in DL16: a multiple of DL16's spacing there
    _, mean, rstd = kernels.native_layer_norm(
        [x.float(), [64], None, None, 1e-5], {}, DEFAULT_FORMAT
    )
    assert torch.equal(mean, round_dl16(mean)) and torch.equal(rstd, round_dl16(rstd))


def test_layer_norm_matches_fp32_when_the_profile_disables_it(spyre, tmp_path: Path) -> None:
    base = load_profile("spyre-2026.07")
    numerics = json.loads(json.dumps(base.numerics))
    numerics["layer_norm_stats"]["enabled"] = False
    path = tmp_path / "no-ln-stats.json"
    path.write_text(
        json.dumps(
            {
                "name": "no-ln-stats",
                "version": "0",
                "extends": "spyre-2026.07",
                "numerics": numerics,
            }
        )
    )
    profile = load_profile(str(path))
    assert kernels.native_kernel("aten::native_layer_norm", profile) is None
    assert (
        kernels.native_kernel("aten::native_layer_norm.default", base) is kernels.native_layer_norm
    )
    assert kernels.native_kernel("aten::add.Tensor", base) is None
    x = _layer_norm_inputs()
    ref = torch.nn.functional.layer_norm(x.float(), (64,))
    with spyre.tracking(profile=profile):
        out = torch.nn.functional.layer_norm(x.to("spyre"), (64,)).cpu().float()
    err = (out - ref).abs().max().item()
    assert err < 2e-2, f"fp32 statistics, DL16 output: max diff {err}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_native_outputs_are_rounded_fp32_outputs_are_not(spyre, dtype) -> None:
    a = round_dl16(torch.randn(8, 64)).to(dtype)
    out = (a.to("spyre") * 1.1).float().cpu()
    # the number is a device constant (DL16, as the compiled program holds it too)
    constant = float(round_dl16(torch.tensor([1.1]))[0])
    assert constant != 1.1
    assert torch.equal(out, round_dl16(a.float() * constant)), "fp32 compute, DL16 result"
    f = torch.randn(8, 64)
    assert torch.equal((f.to("spyre") * 1.1).cpu(), f * 1.1)
