"""DL16 numerics: round_dl16 against properties and against an independent bit-level reference
written here, the rounding of fp16 data moved to the device, and the device's layer norm, whose
statistics stay in DL16."""

from __future__ import annotations

import ctypes
import json
import math
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from hfadapt.spyre.numerics import dl16_native, kernels
from hfadapt.spyre.numerics.dl16 import (
    DEFAULT_FORMAT,
    DL16Format,
    native_rounding_args,
    optional_rounding_args,
    round_dl16,
)
from hfadapt.spyre.rules.profile import load_profile

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
    assert kernels.native_kernel("aten::native_layer_norm", profile.numeric_params) is None
    assert (
        kernels.native_kernel("aten::native_layer_norm.default", base.numeric_params)
        is kernels.native_layer_norm
    )
    assert (
        kernels.native_kernel("aten::mul.Tensor", base.numeric_params) is None
    )  # add has #1972's kernel
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


# -- the C kernels' arguments: checked before C, and by C -------------------------------------

# with the marker ``native``, under CI=true a skip fails where the machine has a C compiler
built = pytest.mark.skipif(not dl16_native.available(), reason="the C kernels are not built here")
NAN_ROUNDING = native_rounding_args(DEFAULT_FORMAT)
NO_ROUNDING = optional_rounding_args(None)


def _f(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float32)


def _loaded(loader: Callable[[], Any]) -> Any:
    kernel = loader()
    assert kernel is not None, f"{loader.__name__}: the C kernels are built, the kernel is not"
    return kernel


def _round(*args: Any) -> None:
    _loaded(dl16_native.load)(*args)


def _sum(*args: Any) -> None:
    _loaded(dl16_native.load_sum_truncated)(*args)


def _sum_round(*args: Any) -> None:
    _loaded(dl16_native.load_sum_truncated_round)(*args)


def _accumulate(*args: Any) -> None:
    _loaded(dl16_native.load_accumulate_truncated)(*args)


def _softmax(*args: Any) -> None:
    _loaded(dl16_native.load_softmax_floor)(*args)


def _layer_norm(*args: Any) -> None:
    _loaded(dl16_native.load_layer_norm)(*args)


def _aten_sum(*args: Any) -> None:
    _loaded(dl16_native.load_aten_sum)(*args)


def _program(rows: int, cols: int, desc: list[int], inputs: list[int], outs: list[int],
             lanes: int = 8, rounding: tuple[Any, ...] = NAN_ROUNDING) -> None:  # fmt: skip
    """A row program of ``desc`` (11 fields a node) over ``rows`` x ``cols``."""
    i64, f32 = ctypes.c_int64, ctypes.c_float
    _loaded(dl16_native.load_row_program)(
        rows, cols, len(outs), (i64 * max(1, len(desc)))(*desc),
        (i64 * max(1, len(inputs)))(*inputs), (f32 * 1)(2.0), (i64 * max(1, len(outs)))(*outs),
        lanes, *rounding, 1,
    )  # fmt: skip


X, OUT = _f(4, 8), _f(4, 8)
PARTS = _f(3, 4, 8)
# one add node: input 0 (a full row) + number 0, written to outs[0]
ADD = [0, 0, 1, 0, 0, 0, 0, 2, 3, 0, 0]

BAD_CALLS: list[tuple[str, Callable[[], None], str]] = [
    ("round: float64", lambda: _round(X.double(), NAN_ROUNDING, 0.0, 1),
     "x must be a strided float32 CPU tensor, got strided float64 on cpu"),
    ("round: a list", lambda: _round([1.0], NAN_ROUNDING, 0.0, 1),
     "x must be a CPU torch.Tensor, got list"),
    ("round: strided", lambda: _round(X[:, ::2], NAN_ROUNDING, 0.0, 1), "x must be contiguous"),
    ("round: 0 dropped bits", lambda: _round(X, (*NAN_ROUNDING[:2], 0, math.nan), 0.0, 1),
     "rounding dropped bits = 0, must be an integer from 1 to 23"),
    ("round: no max_finite", lambda: _round(X, NO_ROUNDING, 0.0, 1), "this kernel always rounds"),
    ("round: overflow 5", lambda: _round(X, (*NAN_ROUNDING[:3], 5.0), 0.0, 1),
     "rounding overflow = 5.0, must be NaN or +-inf"),
    ("round: host_inf -1", lambda: _round(X, NAN_ROUNDING, -1.0, 1), "host_inf = -1.0"),
    ("round: 0 threads", lambda: _round(X, NAN_ROUNDING, 0.0, 0), "threads = 0, must be"),
    ("sum: 23 mantissa bits", lambda: _sum(PARTS, 23, OUT, 1),
     "mantissa_bits = 23, must be an integer from 0 to 22"),
    ("sum: out too small", lambda: _sum(PARTS, 9, _f(4, 7), 1), "out must hold 32 values, holds 28"),
    ("sum: no pieces", lambda: _sum(_f(0, 4, 8), 9, OUT, 1), "parts must stack at least one piece"),
    ("sum_round: bias length", lambda: _sum_round(PARTS, 9, _f(7), NAN_ROUNDING, OUT, 1),
     "bias must hold 8 values, holds 7"),
    ("sum_round: strided bias", lambda: _sum_round(PARTS, 9, _f(16)[::2], NAN_ROUNDING, OUT, 1),
     "bias must be contiguous"),
    ("accumulate: parts too small", lambda: _accumulate(OUT, _f(2, 4, 8), 3, 9, True, None,
                                                        NO_ROUNDING, 1),
     "parts must hold at least 96 values, holds 64"),
    ("accumulate: 0 pieces", lambda: _accumulate(OUT, PARTS, 0, 9, True, None, NO_ROUNDING, 1),
     "pieces = 0, must be an integer at least 1"),
    ("accumulate: first 1", lambda: _accumulate(OUT, PARTS, 3, 9, 1, None, NO_ROUNDING, 1),
     "first must be a bool"),
    ("accumulate: -1 mantissa bits", lambda: _accumulate(OUT, PARTS, 3, -1, True, None,
                                                         NO_ROUNDING, 1),
     "mantissa_bits = -1, must be an integer from 0 to 22"),
    ("softmax: out shape", lambda: _softmax(X, _f(8, 4), _f(4, 1), 0.0, 1.0, NO_ROUNDING, 1),
     "out must have x's shape (4, 8), got (8, 4)"),
    ("softmax: top size", lambda: _softmax(X, OUT, _f(3, 1), 0.0, 1.0, NO_ROUNDING, 1),
     "top must hold 4 values, holds 3"),
    ("softmax: floor 2", lambda: _softmax(X, OUT, _f(4, 1), 2.0, 1.0, NO_ROUNDING, 1),
     "floor = 2.0, must be in [0.0, 1.0]"),
    ("layer_norm: 0 columns", lambda: _layer_norm(X, 0, None, None, 1e-5, NAN_ROUNDING, OUT,
                                                  _f(4), _f(4), 1),
     "columns = 0, must be an integer at least 1"),
    ("layer_norm: part rows", lambda: _layer_norm(X, 5, None, None, 1e-5, NAN_ROUNDING, OUT,
                                                  _f(4), _f(4), 1),
     "x holds 32 values, not whole rows of 5"),
    ("layer_norm: weight size", lambda: _layer_norm(X, 8, _f(4), None, 1e-5, NAN_ROUNDING, OUT,
                                                    _f(4), _f(4), 1),
     "weight must hold 8 values, holds 4"),
    ("layer_norm: mean size", lambda: _layer_norm(X, 8, None, None, 1e-5, NAN_ROUNDING, OUT,
                                                  _f(2), _f(4), 1),
     "mean must hold 4 values, holds 2"),
    ("layer_norm: no rounding", lambda: _layer_norm(X, 8, None, None, 1e-5, NO_ROUNDING, OUT,
                                                    _f(4), _f(4), 1),
     "this kernel always rounds"),
    ("aten_sum: 5 lanes", lambda: _aten_sum(X.data_ptr(), 4, 8, 5, OUT.data_ptr()),
     "lanes = 5, must be one of (4, 8, 16)"),
    ("aten_sum: null", lambda: _aten_sum(0, 4, 8, 8, OUT.data_ptr()), "a null address for 4 rows"),
    ("program: desc length", lambda: _program(4, 8, ADD[:-1], [X.data_ptr()], [OUT.data_ptr()]),
     "desc holds 10 fields, 1 nodes need 11"),
    ("program: input index", lambda: _program(4, 8, [0, 0, 1, 0, 0, 0, 0, 2, 3, 0, 0], [],
                                              [OUT.data_ptr()]),
     "node 0 reads input 0 (at 0); 1 given, at addresses [0]"),
    ("program: number index", lambda: _program(4, 8, [0, 0, 1, 0, 0, 0, 0, 2, 3, 1, 0],
                                               [X.data_ptr()], [OUT.data_ptr()]),
     "node 0 reads number 1; 1 given"),
    ("program: 12 lanes", lambda: _program(4, 8, ADD, [X.data_ptr()], [OUT.data_ptr()], lanes=12),
     "lanes = 12, must be one of (4, 8, 16)"),
    # a node reading a later node: checked in C (its pointer would be unset)
    ("program: a later node", lambda: _program(4, 8, [0, 0, 1, 1, 0, 1, 0, 2, 3, 0, 0],
                                               [X.data_ptr()], [OUT.data_ptr()]),
     "hfadapt_row_program refused its argument desc (position 4)"),
]  # fmt: skip


@pytest.mark.native
@built
@pytest.mark.parametrize(
    ("call", "message"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_each_bad_argument_of_a_c_kernel_is_refused_before_c(
    call: Callable[[], None], message: str
) -> None:
    """The wrappers of hfadapt.spyre.numerics.dl16_native check every argument (dtype, layout, sizes
    against one another, ranges) and raise NativeArgumentError naming it; C never sees it."""
    with pytest.raises(dl16_native.NativeArgumentError) as info:
        call()
    assert message in str(info.value), str(info.value)


@pytest.mark.native
@built
@pytest.mark.parametrize(
    ("dropped", "position"), [(0, 5), (24, 5), (-3, 5)], ids=["0 bits", "24 bits", "-3 bits"]
)
def test_the_c_kernels_refuse_a_shift_past_the_word_themselves(dropped: int, position: int) -> None:
    """Called past the Python checks (the raw function), the C rounding and sums refuse a
    shift amount outside 1..23 and return its position, instead of shifting by -1 (undefined:
    the sums came back with every sign flipped)."""
    x = torch.ones(64)
    rounding = list(NAN_ROUNDING)
    raw = dl16_native._kernel(dl16_native.ROUND)
    assert raw is not None
    status = raw(x.data_ptr(), x.numel(), rounding[0], rounding[1], dropped, rounding[3], 0.0, 1)
    assert status == position, status
    assert torch.equal(x, torch.ones(64)), "a refused call wrote its output"
    raw_sum = dl16_native._kernel(dl16_native.SUM_TRUNCATED)
    assert raw_sum is not None
    out = torch.full((64,), 7.0)
    assert raw_sum(x.data_ptr(), 1, 64, dropped, out.data_ptr(), 1) == 4
    assert torch.equal(out, torch.full((64,), 7.0))


@pytest.mark.parametrize("torch_path", [False, True], ids=["c kernels", "torch ops"])
def test_a_23_bit_partial_truncation_is_refused_on_either_path(
    monkeypatch: pytest.MonkeyPatch, torch_path: bool
) -> None:
    """chunked_matmul with 23 partial mantissa bits (nothing left to drop): refused with the
    range on both paths. The C sums used to shift by -1 and return every product with its
    sign flipped (the torch ops raised "negative shift count")."""
    if torch_path:
        monkeypatch.setattr(kernels, "_native_accumulate", lambda: None)
        monkeypatch.setattr(kernels, "_native_kernels", lambda: (None, None))
    a, b = torch.randn(64, 512), torch.randn(512, 64)
    with pytest.raises(ValueError, match=r"mantissa_bits = 23, must be an integer from 0 to 22"):
        kernels.chunked_matmul(a, b, 256, 23)
    with pytest.raises(ValueError, match=r"mantissa_bits = 23"):
        kernels.truncate_partial_(torch.randn(8), 23)
    with pytest.raises(ValueError, match=r"chunk = 0, must be a positive number"):
        kernels.chunked_matmul(a, b, 0, 9)


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("mantissa_bits", 23, "an integer from 0 to 22"),
        ("exponent_bits", 0, "an integer from 1 to 8"),
        ("min_normal_value", 2.0**-130, "a number from 2^-126"),
        ("max_finite_value", math.inf, "a finite number below 2^113"),
        ("host_inf_bits", 0x7FFF, "at most the largest finite value"),
    ],
)
def test_a_dl16_format_the_rounding_cannot_compute_is_refused(
    field: str, value: Any, allowed: str
) -> None:
    with pytest.raises(
        ValueError, match=rf"^DL16 format: {field} = .*; allowed: .*{re.escape(allowed)}"
    ):
        DL16Format(**{field: value})


def test_an_accumulator_past_float32_is_refused() -> None:
    with pytest.raises(ValueError, match=r"mantissa_bits = 24, must be an integer from 0 to 23"):
        kernels.Accumulator(mantissa_bits=24)
    with pytest.raises(ValueError, match=r"lanes = 0, must be a positive integer"):
        kernels.Accumulator(lanes=0)


STRICT_RUN = """
import pytest

@pytest.mark.native
def test_c_kernels():
    pytest.skip("pretend the C kernels did not build")

@pytest.mark.native(amx=True)
def test_tiles():
    pytest.skip("pretend the tiles were not granted")

def test_unmarked():
    pytest.skip("nothing native")

@pytest.mark.native
@pytest.mark.xfail(strict=True, reason="a known gap: it ran and failed as expected")
def test_expected():
    assert False
"""


def test_under_ci_a_skipped_native_test_fails_where_the_machine_can_run_it(
    tmp_path: Path,
) -> None:
    """tests/conftest.py under CI=true: a skipped test marked ``native`` fails where the
    machine has a C compiler (``native(amx=True)``: and AMX's granted tiles), as a skipped
    containment test does; an unmarked skip stays a skip, and so does every skip without CI or
    with the kernels turned off (HFADAPT_NATIVE_DL16=0)."""
    import os
    import shutil
    import subprocess
    import sys

    from hfadapt.spyre.numerics import amx

    shutil.copy(Path(__file__).parents[1] / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_strict.py").write_text(STRICT_RUN)

    codes: list[int] = []

    def outcomes(**env: str) -> dict[str, str]:
        report = tmp_path / "report.xml"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             f"--junitxml={report}", str(tmp_path / "test_strict.py")],
            env={**os.environ, **env}, cwd=tmp_path, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
        assert report.exists(), done.stdout[-3000:] + done.stderr[-2000:]
        codes.append(done.returncode)
        seen = {}
        for case in ElementTree.parse(report).iter("testcase"):
            kinds = [child.tag for child in case if child.tag in ("failure", "skipped")]
            seen[case.get("name", "")] = kinds[0] if kinds else "passed"
        return seen

    strict = {
        "test_c_kernels": "failure" if dl16_native.available() else "skipped",
        "test_tiles": "failure" if amx.available() else "skipped",
        "test_unmarked": "skipped",
        "test_expected": "skipped",  # an xfail ran: never turned into a failure
    }
    assert outcomes(CI="true") == strict
    failed = "failure" in strict.values()
    assert codes[-1] == (1 if failed else 0), f"pytest's exit code under CI: {codes[-1]}"
    every_skip = dict.fromkeys(strict, "skipped")
    assert outcomes(CI="") == every_skip
    assert outcomes(CI="true", HFADAPT_NATIVE_DL16="0") == every_skip
