"""Chunked products of DL16 operands on AMX's bf16 tiles, where the CPU has them.

A DL16 value (at most 10 significant bits; an fp16 value has 11) is exactly the sum of two
bf16 values, so a product of DL16 operands is four bf16 products, each exact in fp32, that
AMX's tile product adds into fp32 accumulators: about four times the arithmetic of the fp32
product, on units that do sixteen times as much per cycle. The C kernel
(``hfadapt_amx_matmul`` in dl16_kernels.c) makes each piece of K in the tiles, truncates its
partials and adds them to a block of outputs held in the cache, then adds the bias and
rounds: no piece's product passes through memory (on the fp32 path every piece is written out
and read back).

The contract is the chunked product's (``kernels.chunked_matmul``): each piece's fp32
product of the operands, in the order and internal precision of the machine's product (MKL's
on the fp32 path, the tiles' here), truncated, summed in order. The two paths agree on every
truncated partial except where the two fp32 sums straddle a truncation step (the tests
count them). An operand with a value that does not split exactly (fp32 data off the DL16
grid), is infinite or NaN, or lies outside [2^-40, 2^62] takes the fp32 path, as does everything with
``HFADAPT_NATIVE_AMX=0`` or on a CPU without AMX.

Both operands are split into tiles every call, into this thread's kept buffers. The right
operand's tiles (a linear's weight) were once kept between calls while the tensor lived and
its version counter stood still; but a write through ``weight.data`` (or through any other
alias with a counter of its own: a second ``torch.from_numpy`` of the same array, ``set_``
of its storage, a NumPy view) leaves the counter where it was, and the kept tiles served the
old weight. No counter, pointer or storage field moves with every write, and checking the
values costs what splitting them costs (a 768 x 3072 weight: about 1.5 ms to compare with a
kept copy, 2.5 ms to split on this machine), so nothing is kept: a weight's tiles are its
values of this call (a 384 x 384 weight about 0.05 ms, 384 x 1536 0.3 ms on one thread)."""

from __future__ import annotations

import threading

import torch

from hfadapt.spyre.numerics import dl16_native
from hfadapt.spyre.numerics.dl16 import DL16Format, optional_rounding_args

# Products with fewer multiply-adds than this take the fp32 path: splitting the operands
# costs more than the tiles save.
MIN_MACS = 1 << 21
# The tiles' unit: K and both output dimensions are padded to whole 32-element blocks.
BLOCK = dl16_native.AMX_BLOCK

_KEPT = threading.local()  # this thread's int16 buffers for the left and the right tiles


def _padded(n: int) -> int:
    return dl16_native.amx_padded(n)


def product(
    a: torch.Tensor,
    b: torch.Tensor,
    per: int,
    mantissa_bits: int,
    bias: torch.Tensor | None,
    fmt: DL16Format | None,
) -> torch.Tensor | None:
    """a @ b with K in pieces of ``per`` elements, each piece's partials truncated to
    ``mantissa_bits``, then ``bias`` (float32, 1-D, contiguous) and the rounding to ``fmt``
    when given; made on the tiles, or None when this product takes the fp32 path (no AMX,
    ``b`` not 2-D, operands that do not multiply, too small, or a value that does not split).
    Operands the kernels cannot read (not float32 CPU tensors) are refused with
    dl16_native.NativeArgumentError."""
    kernels = dl16_native.load_amx()
    if kernels is None or b.dim() != 2 or a.dim() < 2 or per % BLOCK:
        return None
    k, n = b.shape
    if a.shape[-1] != k:  # not a product: the fp32 path's torch.matmul says why
        return None
    left = a if a.dim() == 2 else a.reshape(-1, k)
    m = left.shape[0]
    if m < 16 or m * n * k < MIN_MACS:
        return None
    pack, matmul = kernels
    threads = torch.get_num_threads()
    kp = _padded(k)
    right = _buffer("right", 2 * _padded(n) * kp)
    if pack(b.t(), 1, right, threads):
        return None
    tiles = _buffer("left", 2 * _padded(m) * kp)
    if pack(left, 0, tiles, threads):
        return None
    out = torch.empty((*a.shape[:-1], n), dtype=torch.float32)
    matmul(
        tiles, right, m, n, k, per, mantissa_bits, bias, optional_rounding_args(fmt), out, threads
    )
    return out


def _buffer(side: str, numel: int) -> torch.Tensor:
    """This thread's kept int16 buffer for one side's tiles, of at least ``numel`` elements
    (allocated once and grown: a fresh one per product faults its pages in every call)."""
    buf: torch.Tensor | None = getattr(_KEPT, side, None)
    if buf is None or buf.numel() < numel:
        with torch.inference_mode(False):
            buf = torch.empty(numel, dtype=torch.int16)
        setattr(_KEPT, side, buf)
    return buf[:numel]


def available() -> bool:
    """Whether products of DL16 operands may be made on AMX's tiles in this process."""
    return dl16_native.load_amx() is not None
