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

The right operand's tiles (a linear's weight) are kept between calls while the tensor they
came from lives and is unchanged (its version counter): a compiled graph's weights are the same
tensors call after call. The eager device hands each op a fresh alias of a weight's data (made
below autograd: no ``_base``, a version counter of its own), so there the tiles are made every
call (0.07 ms for a 384 x 384 weight, 0.3 ms for 384 x 1536 on one thread). The left operand is
split into this thread's kept buffer every call."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hfadapt.spyre import dl16_native
from hfadapt.spyre.dl16 import DL16Format, optional_rounding_args

# Products with fewer multiply-adds than this take the fp32 path: splitting the operands
# costs more than the tiles save.
MIN_MACS = 1 << 21
# The tiles' unit: K and both output dimensions are padded to whole 32-element blocks.
BLOCK = 32


# (the source tensor's id, the view's address, shape and strides)
_Key = tuple[int, int, tuple[int, ...], tuple[int, ...]]


@dataclass
class _Tiles:
    """A right operand's tiles, and the tensor and version they were made from."""

    source: weakref.ref[torch.Tensor]
    version: int
    tiles: torch.Tensor | None  # None: a value does not split exactly


_KEPT: dict[_Key, _Tiles] = {}
_LEFT = threading.local()


def _padded(n: int) -> int:
    return -(-n // BLOCK) * BLOCK


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
    ``b`` not 2-D, too small, or a value that does not split)."""
    kernels = dl16_native.load_amx()
    if kernels is None or b.dim() != 2 or a.dim() < 2 or per % BLOCK:
        return None
    k, n = b.shape
    left = a if a.dim() == 2 else a.reshape(-1, k)
    m = left.shape[0]
    if m < 16 or m * n * k < MIN_MACS:
        return None
    pack, matmul = kernels
    threads = torch.get_num_threads()
    right = _right_tiles(pack, b, threads)
    if right is None:
        return None
    mp, kp = _padded(m), _padded(k)
    tiles = _left_buffer(2 * mp * kp)
    bad = pack(
        left.data_ptr(), m, k, left.stride(0), left.stride(1), 0, mp, kp, tiles.data_ptr(),
        threads,
    )  # fmt: skip
    if bad:
        return None
    out = torch.empty((*a.shape[:-1], n), dtype=torch.float32)
    matmul(
        tiles.data_ptr(), right.data_ptr(), m, n, kp, per, 23 - mantissa_bits,
        None if bias is None else bias.data_ptr(), *optional_rounding_args(fmt),
        out.data_ptr(), threads,
    )  # fmt: skip
    return out


def _right_tiles(pack: Callable[..., int], b: torch.Tensor, threads: int) -> torch.Tensor | None:
    """``b``'s tiles: kept from an earlier call when ``b`` is the same view of the same
    living, unchanged tensor, else made (and kept, unless the tensor has no version
    counter). Several views of one tensor (the slices of a fused weight) are kept apart."""
    source = b._base if b._base is not None else b
    key = (id(source), b.data_ptr(), tuple(b.shape), tuple(b.stride()))
    version = _version(source)
    if version is not None:
        kept = _KEPT.get(key)
        if kept is not None and kept.source() is source and kept.version == version:
            return kept.tiles
    k, n = b.shape
    made = torch.empty(2 * _padded(n) * _padded(k), dtype=torch.int16)
    bad = pack(
        b.data_ptr(), n, k, b.stride(1), b.stride(0), 1, _padded(n), _padded(k),
        made.data_ptr(), threads,
    )  # fmt: skip
    tiles = None if bad else made
    if version is not None:
        _KEPT[key] = _Tiles(weakref.ref(source, _forget(key)), version, tiles)
    return tiles


def _forget(key: _Key) -> Callable[[Any], None]:
    """A weakref callback: drop the tiles kept under ``key`` once their source is freed."""

    def forget(ref: Any) -> None:
        kept = _KEPT.get(key)
        if kept is not None and kept.source is ref:
            del _KEPT[key]

    return forget


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter, None for an inference tensor (it has none)."""
    if t.is_inference():
        return None
    return int(t._version)


def _left_buffer(numel: int) -> torch.Tensor:
    """This thread's kept int16 buffer of at least ``numel`` elements for the left tiles
    (allocated once and grown: a fresh one per product faults its pages in every call)."""
    buf = getattr(_LEFT, "buf", None)
    if buf is None or buf.numel() < numel:
        with torch.inference_mode(False):
            buf = _LEFT.buf = torch.empty(numel, dtype=torch.int16)
    return buf[:numel]


def available() -> bool:
    """Whether products of DL16 operands may be made on AMX's tiles in this process."""
    return dl16_native.load_amx() is not None
