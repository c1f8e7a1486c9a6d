"""Row programs (hfadapt.spyre.eager.fusion): the eager device's binary ops and last-dimension
sums wait and run as one pass over the rows, with the values of running them one at a time,
bit for bit; calls are judged and counted when they are made; a program's inputs cannot change
under it; its tensors read right from any thread. Speed is measured in benchmarks/."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from hfadapt.spyre.eager import fusion
from hfadapt.spyre.numerics.dl16 import round_dl16


def _dl16(*shape: int, seed: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return round_dl16(torch.randn(*shape, generator=g) * scale + shift).half()


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The layer-norm-unfused adapter's arithmetic (adapters/layer_norm.py)."""
    n = x.shape[-1]
    mean = (x * (1.0 / n)).sum(dim=(-1,), keepdim=True)
    centred = x - mean
    centred = centred - (centred * (1.0 / n)).sum(dim=(-1,), keepdim=True)
    scaled = centred * (1.0 / math.sqrt(n))
    var = (scaled * scaled).sum(dim=(-1,), keepdim=True)
    rstd = torch.where(var > 0, torch.rsqrt(var + 1e-12), torch.zeros_like(var))
    return centred * rstd * w + b


@contextmanager
def _programs() -> Iterator[list[int]]:
    """The node count of every program run in this block."""
    sizes: list[int] = []
    run = fusion._run

    def counted(program: Any) -> None:
        sizes.append(len(program.nodes))
        run(program)

    fusion._run = counted
    try:
        yield sizes
    finally:
        fusion._run = run


@contextmanager
def _op_by_op() -> Iterator[None]:
    """Nothing waits: every op runs when it is called (the path without the C kernel)."""
    fusion._load()
    kernel = fusion._kernel
    fusion._kernel = None
    try:
        yield
    finally:
        fusion._kernel = kernel


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.float().view(torch.int32)


def _compare(f: Callable[..., torch.Tensor], *host: torch.Tensor) -> tuple[int, list[int]]:
    device = [t.to("spyre") for t in host]
    with torch.inference_mode(), _programs() as sizes:
        fused = f(*device).cpu()
    with torch.inference_mode(), _op_by_op():
        plain = f(*device).cpu()
    nan = torch.isnan(plain)
    assert torch.equal(torch.isnan(fused), nan), "NaN in other places"
    return int((_bits(fused)[~nan] != _bits(plain)[~nan]).sum()), sizes


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("shape", "scale", "shift"),
    [((32, 29, 384), 3.0, 1.0), ((4, 64, 768), 0.5, 300.0), ((2, 8, 1000), 40.0, -2.0)],
)
def test_a_layer_norm_chain_in_row_programs_gives_the_op_by_op_bits(
    spyre, shape: tuple[int, ...], scale: float, shift: float, threads: int
) -> None:
    """The unfused LayerNorm after a residual add: two programs (the add, the statistics and
    the centring; then the scale and shift) with every value of the ops run one by one."""
    torch.set_num_threads(threads)
    try:
        x = _dl16(*shape, seed=1, scale=scale, shift=shift)
        x[0, 0] = 0  # a constant row: var 0, guarded
        x[-1, -1, :7] = float("inf")  # a row that turns to NaN
        residual = _dl16(*shape, seed=2)
        w, b = _dl16(shape[-1], seed=3), _dl16(shape[-1], seed=4)
        differ, sizes = _compare(lambda x, r, w, b: _layer_norm(x + r, w, b), x, residual, w, b)
    finally:
        torch.set_num_threads(1)
    assert fusion._lanes is not None, "the C sum never matched torch.sum here"
    assert differ == 0, f"{differ} values differ from the op by op path"
    assert sizes == [10, 3], f"programs of {sizes} nodes (expected the chain in two)"


def test_binary_ops_of_every_operand_kind_wait_and_give_the_op_by_op_bits(spyre) -> None:
    """Full-size, row vector, per-row, one-value and gathered (a [batch, 1, keys] mask)
    operands, numbers, all four ops, results read at the end. ``2.5 - a`` is aten::rsub, not a
    program's op: the program so far runs before it (after it, the transpose's view does too);
    an operand of no kind the program reads (a transposed view) makes its op run at once, and a
    new program takes the rest."""
    x, y = _dl16(8, 16, 64, seed=5, scale=4.0), _dl16(8, 16, 64, seed=6)
    col, row = _dl16(64, seed=7), _dl16(8, 16, 1, seed=8, shift=3.0)
    one, mask = _dl16(1, seed=9), _dl16(8, 1, 64, seed=10)
    across = _dl16(8, 64, 16, seed=11)  # read through a transposed view: no kind

    def chain(*t: torch.Tensor) -> torch.Tensor:
        x, y, col, row, one, mask, across = t
        a = x * y - col
        b = (2.5 - a) / row + one
        c = b * 0.125 + mask
        d = c + across.transpose(1, 2)
        return (d - a) * (a / 3) + (row - one) * row

    differ, sizes = _compare(chain, x, y, col, row, one, mask, across)
    assert differ == 0, f"{differ} values differ"
    assert sizes == [2, 4, 6], f"programs of {sizes} nodes"


def test_a_waiting_call_is_judged_and_counted_when_it_is_made(spyre) -> None:
    """ops_seen counts a call when it is made, not when its program runs; a pending result
    has no data until it is read."""
    x = _dl16(16, 512, seed=11).to("spyre")
    with torch.inference_mode(), spyre.tracking(collect=True) as report:
        y = x * 3
        assert y._data is None, "the product waits"
        counted = dict(report.ops_seen)
        host = y.cpu()
    assert counted == {"aten::mul.Tensor": 1}, counted
    assert torch.equal(host, round_dl16(x.cpu().float() * 3).half())


def test_a_programs_inputs_cannot_change_under_it(spyre) -> None:
    """An in-place write into a waiting op's input runs the program first: the result holds
    the product of the values it was called with."""
    host = _dl16(16, 512, seed=12)
    x = host.to("spyre")
    with torch.inference_mode():
        y = x * 2
        x.add_(1)
        assert torch.equal(y.cpu(), round_dl16(host.float() * 2).half())
        assert torch.equal(x.cpu(), round_dl16(host.float() + 1).half())


def test_a_pending_tensor_reads_right_from_another_thread(spyre) -> None:
    x = _dl16(16, 512, seed=13)
    with torch.inference_mode():
        y = x.to("spyre") * x.to("spyre")
        out: list[torch.Tensor] = []
        reader = threading.Thread(target=lambda: out.append(y.cpu()))
        reader.start()
        reader.join()
    assert torch.equal(out[0], round_dl16(x.float() * x.float()).half())


def test_small_and_mixed_dtype_calls_run_at_once(spyre) -> None:
    """A result below fusion.MIN_VALUES starts no program; an fp16 op with an fp32 operand
    (an fp32 result) never waits."""
    small = _dl16(4, 8, seed=14).to("spyre")
    wide = torch.randn(16, 512).to("spyre")
    x = _dl16(16, 512, seed=15).to("spyre")
    with torch.inference_mode():
        assert (small * 2)._data is not None
        assert (x * wide)._data is not None
        assert (x * 2)._data is None


def test_attention_scores_scaled_and_masked_in_one_program(spyre) -> None:
    """Scores times the scale plus a [batch, 1, queries, keys] mask (broadcast over heads, read
    row by row through a table of row numbers), then the softmax: the op by op path's bits, the
    scaled scores never written out."""
    scores = _dl16(4, 12, 29, 64, seed=20, scale=8.0)
    mask = _dl16(4, 1, 29, 64, seed=21)
    mask[..., 40:] = -30000.0

    def attention(s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return torch.softmax(s * 0.125 + m, dim=-1)

    differ, sizes = _compare(attention, scores, mask)
    assert differ == 0, f"{differ} values differ"
    assert sizes == [2], f"programs of {sizes} nodes"


def _dl16_data(*shape: int, seed: int) -> torch.Tensor:
    """Held DL16 values (float32) over a wide range, with zeros, infinities, NaN, subnormal-sized
    and overflowing magnitudes among them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.exp(torch.randn(*shape, generator=g) * 8)
    specials = torch.tensor(
        [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e-30, -1e-30, 3e38, 6e4, 1.0]
    )
    flat = x.view(-1)
    k = min(flat.numel(), specials.numel())
    flat[torch.randperm(flat.numel(), generator=g)[:k]] = specials[:k]
    return round_dl16(x)


_TORCH_BINARY = {
    "aten::add.Tensor": torch.add,
    "aten::sub.Tensor": torch.sub,
    "aten::mul.Tensor": torch.mul,
    "aten::div.Tensor": torch.div,
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("op", sorted(_TORCH_BINARY))
def test_a_one_node_program_gives_the_ops_and_the_roundings_bits(
    spyre, monkeypatch: pytest.MonkeyPatch, op: str, threads: int
) -> None:
    """The row program's kernel against torch's CPU op followed by round_dl16, on the held
    values, for every operand kind it reads (the same shape, a row vector, one value per row,
    one value, a number), tensors on either side, on rows short and long (every size starts
    a program here). A NaN's sign and payload depend on which operand the FPU hands on: only
    its place is compared."""
    from hfadapt.spyre.eager.tensor import wrap

    monkeypatch.setattr(fusion, "MIN_VALUES", 1)
    device = torch.device("spyre", 0)
    torch.set_num_threads(threads)
    try:
        for rows, cols in ((7, 5), (300, 384), (1, 33)):
            a = _dl16_data(rows, cols, seed=rows)
            others: list[Any] = [
                _dl16_data(rows, cols, seed=1),
                _dl16_data(cols, seed=2),
                _dl16_data(1, cols, seed=3),
                _dl16_data(rows, 1, seed=4),
                _dl16_data(1, seed=5),
                0.375,
                3,
                -2.5,
            ]
            for b in others:
                pairs = [(a, b)] + ([(b, a)] if isinstance(b, torch.Tensor) else [])
                for x, y in pairs:
                    dx, dy = (
                        wrap(t, torch.float16, device) if isinstance(t, torch.Tensor) else t
                        for t in (x, y)
                    )
                    with torch.inference_mode():
                        out = _TORCH_BINARY[op](dx, dy)
                        assert out._data is None, "the call waits in a program"
                        got = out._held
                    want = round_dl16(_TORCH_BINARY[op](x, y))
                    nan = torch.isnan(want)
                    other = ~nan & ~torch.isnan(got)
                    differ = int((_bits(got[other]) != _bits(want[other])).sum())
                    misplaced = int((torch.isnan(got) != nan).sum())
                    where = (op, rows, cols, getattr(b, "shape", b))
                    assert (differ, misplaced) == (0, 0), (*where, differ, misplaced)
    finally:
        torch.set_num_threads(1)


def test_a_call_the_program_does_not_read_runs_at_once(spyre) -> None:
    """Operands of no kind the program reads run the op now (no pending result): a transposed
    operand, a 0-d result, a bool, per-row values of another leading shape, a mixed dtype;
    shapes that do not broadcast raise torch's own error."""
    x = _dl16(64, 128, seed=30).to("spyre")
    cases: list[tuple[Any, Any]] = [
        (x, _dl16(128, 64, seed=31).to("spyre").t()),
        (_dl16(1, seed=32).reshape(()).to("spyre"), _dl16(1, seed=33).reshape(()).to("spyre")),
        (x, True),
        (_dl16(2, 64, 128, seed=34).to("spyre"), _dl16(64, 1, seed=35).to("spyre")),
        (x, x.float()),
    ]
    with torch.inference_mode():
        for a, b in cases:
            out = a * b
            assert out._data is not None, (getattr(a, "shape", a), getattr(b, "shape", b))
        with pytest.raises(RuntimeError, match="must match the size"):
            x * _dl16(64, 127, seed=36).to("spyre")
