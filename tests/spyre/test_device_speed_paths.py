"""The device's faster paths compute what the plain ones compute: the chunked matmul made a
group of pieces at a time, the softmax's C kernel, a kernel's output not rounded twice, the
judge that skips a signature judged clean before, and the heap that keeps freed memory. Speed
itself is measured in benchmarks/; these tests pin the values and the verdicts."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from hfadapt.spyre.numerics import kernels
from hfadapt.spyre.numerics.dl16 import DEFAULT_FORMAT, round_dl16
from hfadapt.spyre.rules.profile import load_profile

CODE = DEFAULT_FORMAT.host_inf  # the -inf code a host -inf lands on


def _bits_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.view(torch.int32) != b.view(torch.int32)).sum())


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [
        ((96, 3072), (3072, 40)),
        ((2, 33, 1000), (1000, 24)),
        ((5, 17, 640), (5, 640, 30)),
        # one piece (K <= 256): the one-pass epilogue, a linear's and attention's bmm
        ((64, 200), (200, 96)),
        ((12, 29, 32), (12, 32, 29)),
    ],
)
@pytest.mark.native
def test_groups_of_pieces_give_the_bits_of_all_pieces_at_once(
    monkeypatch: pytest.MonkeyPatch, a_shape: tuple[int, ...], b_shape: tuple[int, ...]
) -> None:
    """A group as large as K's pieces, one piece a group, and groups that split unevenly:
    the same bits, with and without the bias and the rounding, and the same as the torch
    path's side-by-side sum; a product of one piece (its truncation, bias and rounding in one
    pass) gives the torch ops' bits too."""
    if kernels._native_accumulate() is None:
        pytest.skip("the C kernels are not built here (no C compiler)")
    g = torch.Generator().manual_seed(3)
    a = torch.randn(*a_shape, generator=g) * 2
    b = torch.randn(*b_shape, generator=g)
    bias = torch.randn(b_shape[-1], generator=g)
    results: dict[str, list[torch.Tensor]] = {}
    out_bytes = 4 * a.shape[-2] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
    for name, group_bytes in {"all": 1 << 30, "one": 1, "three": 3 * out_bytes}.items():
        monkeypatch.setattr(kernels, "GROUP_BYTES", group_bytes)
        results[name] = [
            kernels.chunked_matmul(a, b, 256, 9),
            kernels.chunked_matmul(a, b, 256, 9, bias=bias, fmt=DEFAULT_FORMAT),
        ]
    monkeypatch.setattr(kernels, "_native_accumulate", lambda: None)
    monkeypatch.setattr(kernels, "_native_kernels", lambda: (None, None))
    results["torch"] = [
        kernels.chunked_matmul(a, b, 256, 9),
        kernels.chunked_matmul(a, b, 256, 9, bias=bias, fmt=DEFAULT_FORMAT),
    ]
    for name in ("one", "three", "torch"):
        for i, (got, want) in enumerate(zip(results[name], results["all"], strict=True)):
            differ = _bits_differ(got, want)
            assert differ == 0, f"{name} (result {i}): {differ} of {got.numel()} values differ"


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "block_bytes"),
    [
        ((12, 29, 64), (12, 64, 29), 3 * 4 * 29 * 29),  # groups of 3 batch items
        ((10, 40, 64), (10, 64, 48), 4 * 4 * 40 * 48),  # groups of 4: the last one of 2
        ((7, 33, 200), (7, 200, 20), 1),  # one batch item a group
    ],
)
@pytest.mark.native
def test_a_batched_product_made_a_group_at_a_time_gives_the_whole_products_bits(
    monkeypatch: pytest.MonkeyPatch,
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
    block_bytes: int,
) -> None:
    """A one-piece batched product (attention's Q @ K^T, P @ V) made a group of batch items
    at a time, each group's epilogue written into the result: the bits of the whole product
    and its epilogue, with and without the bias and the rounding."""
    if kernels._native_accumulate() is None:
        pytest.skip("the C kernels are not built here (no C compiler)")
    g = torch.Generator().manual_seed(5)
    a = torch.randn(*a_shape, generator=g) * 3
    b = torch.randn(*b_shape, generator=g)
    bias = torch.randn(b_shape[-1], generator=g)

    def both() -> list[torch.Tensor]:
        return [
            kernels.chunked_matmul(a, b, 256, 9),
            kernels.chunked_matmul(a, b, 256, 9, bias=bias, fmt=DEFAULT_FORMAT),
        ]

    monkeypatch.setattr(kernels, "BLOCKED_FROM", 1 << 40)
    whole = both()
    monkeypatch.setattr(kernels, "BLOCKED_FROM", 0)
    monkeypatch.setattr(kernels, "BLOCK_BYTES", block_bytes)
    assert kernels._blockable(a, b)
    blocked = both()
    for i, (got, want) in enumerate(zip(blocked, whole, strict=True)):
        differ = _bits_differ(got, want)
        assert got.shape == want.shape, (got.shape, want.shape)
        assert differ == 0, f"result {i}: {differ} of {got.numel()} values differ"


def _softmax_inputs() -> list[tuple[torch.Tensor, float]]:
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(6, 4, 29, 64, generator=g) * 6
    scores[..., 40:] = -CODE  # padded keys at the -inf code
    scores[0, 0, 0, :] = -CODE  # a row with nothing but the code
    scores[1, 1, 1, 3] = float("nan")
    odd = torch.randn(9, 13, generator=g) * 30  # a width that is not a multiple of 8
    odd[2, :5] = -1e4  # keys far below the max: exp clamped at -87
    # rows longer than the kernel's block of 4096 values, one of them all -inf
    wide = torch.randn(3, 4500, generator=g) * 4
    wide[1] = float("-inf")
    # short rows (an encode's 29 keys) over many blocks, a NaN last in its row
    short = torch.randn(8, 12, 29, 29, generator=g) * 6
    short[..., 20:] = -CODE
    short[7, 11, 28, 28] = float("nan")
    return [(scores, 0.0), (scores, 2.0**-20), (odd, 0.0), (odd, 1e-3), (wide, 0.0), (short, 1e-5)]


@pytest.mark.native
@pytest.mark.parametrize("case", range(6))
def test_the_softmax_kernel_agrees_with_the_torch_ops(case: int) -> None:
    """The C softmax (a block of rows at a time) against the torch ops it replaces: within 12 fp32
    ulps (its own exp and order of the sum), the same NaNs, the floor on coded keys, and after
    the DL16 rounding the same value in all but a few in ten thousand."""
    x, floor = _softmax_inputs()[case]
    fast = kernels._softmax_rows(x, -1, floor, CODE)
    if fast is None:
        pytest.skip("the C kernels are not built here (no C compiler)")
    out, top = fast
    want = kernels._softmax_shifted(x, x.amax(-1, keepdim=True), -1, floor, CODE)
    # the kernel flushes results below fp32's smallest normal to +0 (the DL16 rounding makes
    # them +0 anyway): a subnormal probability costs the FPU a microcode assist per value
    tiny = (want != 0) & (want.abs() < torch.finfo(torch.float32).tiny)
    subnormal_out = int(((out != 0) & (out.abs() < torch.finfo(torch.float32).tiny)).sum())
    assert subnormal_out == 0, f"{subnormal_out} subnormal probabilities left"
    assert bool((out[tiny] == 0).all()), out[tiny][:4]
    want = want.masked_fill(tiny, 0.0)
    assert torch.equal(out.isnan(), want.isnan()), "NaN rows differ"
    assert torch.equal(top.isnan(), x.amax(-1, keepdim=True).isnan())
    assert torch.equal(top.nan_to_num(0.0), x.amax(-1, keepdim=True).nan_to_num(0.0)), "row max"
    finite = ~want.isnan()
    ulps = int((out[finite].view(torch.int32) - want[finite].view(torch.int32)).abs().max())
    moved = float((round_dl16(out[finite]) != round_dl16(want[finite])).float().mean())
    print(f"case {case}: max {ulps} ulp apart, {moved:.2e} of DL16 values moved")
    assert ulps <= 12, ulps
    # DL16 drops 14 bits of fp32's mantissa: a value u ulps off lands on the other side of a
    # rounding boundary with probability at most u / 2**14 (long rows' sums differ most)
    assert moved <= max(2e-4, ulps / 2**14), (moved, ulps)
    if floor > 0 and x.shape[-1] == 64:
        coded = out[2, 0, 0, 40:]  # coded keys of an ordinary row keep floor / sum
        assert float(coded.min()) > 0, coded
    if floor > 0 and x.shape[-1] == 29:
        coded = out[0, 0, 0, 20:]
        assert float(coded.min()) > 0, coded
    assert torch.allclose(out[finite].sum(), want[finite].sum(), rtol=1e-5)
    # rounded in the kernel (a block at a time, in the cache): the bits of rounding after it
    rounded = kernels._softmax_rows(x, -1, floor, CODE, DEFAULT_FORMAT)
    assert rounded is not None
    differ = _bits_differ(rounded[0].nan_to_num(7.0), round_dl16(out).nan_to_num(7.0))
    assert differ == 0, f"{differ} of {out.numel()} values differ when rounded in the kernel"
    assert torch.equal(rounded[0].isnan(), out.isnan())


@pytest.mark.native
def test_the_softmax_kernel_leaves_the_callers_float_mode_alone() -> None:
    """The kernel's flush-to-zero is its own: afterwards a subnormal result is still one, in
    this thread and in torch's worker threads."""
    x, _ = _softmax_inputs()[0]
    if kernels._softmax_rows(x, -1, 0.0, CODE) is None:
        pytest.skip("the C kernels are not built here (no C compiler)")
    tiny = torch.finfo(torch.float32).tiny
    one = torch.tensor([tiny]) / 4
    many = torch.full((1 << 20,), tiny) / 4  # large enough to run on every thread
    assert float(one[0]) == tiny / 4, float(one[0])
    flushed = int((many == 0).sum())
    assert flushed == 0, f"{flushed} of {many.numel()} subnormal results flushed after the kernel"


def test_the_misread_of_a_coded_row_still_reaches_the_sdpa_softmax() -> None:
    """Inside SDPA a row of nothing but the code becomes NaN (the amax misread), on the C
    kernel's path as on the torch ops' path."""
    x, _ = _softmax_inputs()[0]
    out, misread = kernels.sdpa_softmax(x, -1, 0.0, CODE, True)
    assert misread
    assert bool(out[0, 0, 0].isnan().all()), out[0, 0, 0, :4]
    assert not bool(out[0, 0, 1].isnan().any())


def _grid(x: torch.Tensor) -> torch.Tensor:
    """DL16 data with the edges in it: huge, tiny and zero values, and a NaN."""
    x = round_dl16(x)
    flat = x.view(-1)
    flat[0], flat[1], flat[2], flat[3] = 6e9, -6e9, 1e-9, float("nan")
    return x


KERNEL_CALLS = {
    "aten::mm": lambda g: (_grid(torch.randn(7, 600, generator=g)), _grid(torch.randn(600, 5, generator=g))),
    "aten::bmm": lambda g: (_grid(torch.randn(2, 7, 300, generator=g)), _grid(torch.randn(2, 300, 9, generator=g))),
    "aten::addmm": lambda g: (_grid(torch.randn(5, generator=g)), _grid(torch.randn(7, 600, generator=g)), _grid(torch.randn(600, 5, generator=g))),
    "aten::_softmax": lambda g: (_grid(torch.randn(4, 9, 70, generator=g) * 4), -1, False),
    "aten::softmax.int": lambda g: (_grid(torch.randn(4, 9, 70, generator=g) * 4), -1, None),
    "aten::native_layer_norm": lambda g: (_grid(torch.randn(6, 96, generator=g) + 30), [96], _grid(torch.randn(96, generator=g)), _grid(torch.randn(96, generator=g)), 1e-5),
    "aten::layer_norm": lambda g: (_grid(torch.randn(6, 96, generator=g) + 30), [96], None, None, 1e-5),
    "aten::mean.dim": lambda g: (_grid(torch.randn(6, 96, generator=g) * 1e3), [-1], True),
    "aten::rms_norm": lambda g: (_grid(torch.randn(6, 96, generator=g)), [96], _grid(torch.randn(96, generator=g)), 1e-6),
}  # fmt: skip


@pytest.mark.parametrize("op", sorted(KERNEL_CALLS))
def test_a_kernels_outputs_are_already_on_the_dl16_grid(op: str) -> None:
    """The eager device stores a device-numerics kernel's outputs without rounding them again
    (the compiled path never did): every float output must already be a DL16 value, so a
    second rounding would change no bit."""
    profile = load_profile()
    kernel = kernels.native_kernel(op, profile.numeric_params)
    assert kernel is not None, f"{op}: no kernel in {profile.name}"
    out = kernel(KERNEL_CALLS[op](torch.Generator().manual_seed(0)), {}, profile.dl16)
    outputs = [t for t in (out if isinstance(out, tuple) else (out,)) if t.is_floating_point()]
    for i, t in enumerate(outputs):
        again = round_dl16(t)
        same = torch.equal(t.isnan(), again.isnan()) and torch.equal(
            t.nan_to_num(0.0).view(torch.int32), again.nan_to_num(0.0).view(torch.int32)
        )
        moved = int((t.nan_to_num(0.0) != again.nan_to_num(0.0)).sum())
        print(f"{op} output {i}: {tuple(t.shape)}, {moved} values moved by a second rounding")
        assert same, f"{op} output {i}: {moved} of {t.numel()} values are not on the DL16 grid"


def test_a_violation_is_reported_every_time_a_clean_call_is_not_judged_again(
    spyre: object,
) -> None:
    """The judge remembers only clean signatures: a matmul with K = 32 (refused) after clean
    K = 64 ones is judged and refused each time it comes, and the clean one is judged once."""
    from hfadapt.errors import SpyreOpError
    from hfadapt.spyre.eager import dispatch
    from hfadapt.spyre.rules.tracking import tracking

    a64 = torch.randn(8, 64).half().to("spyre")
    b64 = torch.randn(64, 8).half().to("spyre")
    a32 = torch.randn(8, 32).half().to("spyre")
    b32 = torch.randn(32, 8).half().to("spyre")
    judged: list[str] = []
    real = dispatch.judge

    def counting(*args: object, **kwargs: object) -> object:
        judged.append(str(args[1]))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    refusals = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatch, "judge", counting)
        with tracking():
            for _ in range(5):
                a64 @ b64
            clean_judged = judged.count("aten::mm")
            for _ in range(3):
                with pytest.raises(SpyreOpError, match="32"):
                    a32 @ b32
                refusals += 1
    print(f"mm judged {clean_judged} times for 5 clean calls, {judged.count('aten::mm')} in all")
    assert clean_judged == 1, clean_judged
    assert judged.count("aten::mm") == 4, judged
    assert refusals == 3


_KEPT = """
import os, torch
from hfadapt.spyre import heap
raised = heap.keep_freed_memory()
page = os.sysconf("SC_PAGE_SIZE")
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * page
x = torch.empty(64 << 18)  # 64 MiB
x.fill_(1.0)
address, filled = x.data_ptr(), resident()
with open("/proc/self/maps") as f:
    spans = [(line.split()[0], line.rstrip().endswith("[heap]")) for line in f]
in_heap = any(
    int(span.split("-")[0], 16) <= address < int(span.split("-")[1], 16) and is_heap
    for span, is_heap in spans
)
del x
print(raised, in_heap, (filled - resident()) >> 20)
"""


@pytest.mark.parametrize("setting", ["1", "0"])
def test_the_device_heap_keeps_freed_memory(setting: str) -> None:
    """With the heap kept (the default) a 64 MiB tensor comes from the process's heap and its
    memory stays in the process when it is freed, for the next tensor; with
    HFADAPT_DEVICE_HEAP=0 it gets a mapping of its own, handed back to the system on free."""
    import os

    env = {**os.environ, "HFADAPT_DEVICE_HEAP": setting, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_KEPT)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    raised, in_heap, returned_mib = done.stdout.split()
    print(
        f"HFADAPT_DEVICE_HEAP={setting}: thresholds raised {raised}, tensor in the heap "
        f"{in_heap}, {returned_mib} MiB handed back on free"
    )
    if setting == "1":
        assert (raised, in_heap) == ("True", "True"), done.stdout
        assert int(returned_mib) < 8, returned_mib
    else:
        assert (raised, in_heap) == ("False", "False"), done.stdout
        assert int(returned_mib) >= 56, returned_mib


def _layer_norm_cases() -> list[tuple[torch.Tensor, list[int], bool, bool, float]]:
    g = torch.Generator().manual_seed(4)
    wide = round_dl16(torch.randn(1024, 768, generator=g) * 3 + 0.5)
    shifted = round_dl16(torch.randn(4, 33, 96, generator=g) + 30)  # E[x^2] - E[x]^2 cancels
    two_dims = round_dl16(torch.randn(2, 5, 6, 16, generator=g))
    two_dims[0, 0, 0, 3] = float("nan")  # a NaN row
    two_dims[1, 1] = 2.0  # a constant row: variance 0
    odd = round_dl16(torch.randn(7, 29, generator=g) * 100)  # a width not a multiple of 8
    return [
        (wide, [768], True, True, 1e-12),
        (shifted, [96], False, False, 1e-5),
        (two_dims, [6, 16], True, False, 1e-6),
        (odd, [29], False, True, 1e-5),
    ]


@pytest.mark.native
@pytest.mark.parametrize("case", range(4))
def test_the_layer_norm_kernel_gives_the_torch_ops_bits(
    monkeypatch: pytest.MonkeyPatch, case: int
) -> None:
    """LayerNorm with DL16 statistics by the C kernel (one pass per row) and by the torch ops:
    the same bits in the output, the mean and the rstd, NaN rows and constant rows included."""
    x, shape, with_weight, with_bias, eps = _layer_norm_cases()[case]
    g = torch.Generator().manual_seed(5)
    weight = round_dl16(torch.randn(shape, generator=g)) if with_weight else None
    bias = round_dl16(torch.randn(shape, generator=g)) if with_bias else None
    fast = kernels._layer_norm_rows(x, shape, weight, bias, eps, DEFAULT_FORMAT)
    if fast is None:
        pytest.skip("the C kernels are not built here (no C compiler)")
    monkeypatch.setattr(kernels, "_layer_norm_rows", lambda *args: None)
    slow = kernels._layer_norm_dl16(x, shape, weight, bias, eps, DEFAULT_FORMAT)
    for name, got, want in zip(("out", "mean", "rstd"), fast, slow, strict=True):
        assert got.shape == want.shape, (name, got.shape, want.shape)
        differ = _bits_differ(got.nan_to_num(7.0), want.nan_to_num(7.0))
        assert differ == 0, f"{name}: {differ} of {got.numel()} values differ"
        assert torch.equal(got.isnan(), want.isnan()), name
