"""An optional C kernel for in-place DL16 rounding of float32 tensors, built with the system C
compiler on first use and cached. It computes exactly what ``dl16.round_dl16_`` computes (same
overflow, host-infinity mapping, rounding to nearest even and flush to zero, bit for bit; by
integer steps where the torch path uses a magic addend) in one pass over memory instead of six, which is what keeps the compiled device near CPU speed on a busy machine.
``dl16.round_dl16_`` and ``round_dl16`` use it when it is built; without a C compiler (or with
HFADAPT_NATIVE_DL16=0) they take the torch path."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from hfadapt import settings

log = logging.getLogger(__name__)

# The C source is hfadapt/spyre/dl16_kernels.c (package data, shipped in the wheel): what each
# kernel computes is written at its top.
SOURCE_FILE = "dl16_kernels.c"
# No -ffast-math: (v + m) - m must not be simplified away, nor contracted. OpenMP shares
# torch's libgomp (same soname), so torch.set_num_threads bounds both.
_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-fno-fast-math", "-ffp-contract=off"]


def cache_dir() -> Path:
    return settings.kernel_cache()


@lru_cache(maxsize=1)
def source() -> str:
    """The kernels' C source, as the package ships it."""
    return resources.files("hfadapt.spyre").joinpath(SOURCE_FILE).read_text(encoding="utf-8")


def _build(target: Path) -> None:
    compiler = settings.c_compiler() or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "dl16.c"
        src.write_text(source())
        out = Path(tmp) / target.name
        try:
            subprocess.run(
                [compiler, *_FLAGS, "-o", str(out), str(src)],
                check=True,
                capture_output=True,
                timeout=120,
            )
        except subprocess.CalledProcessError:  # a compiler without OpenMP: one thread
            flags = [f for f in _FLAGS if f != "-fopenmp"]
            subprocess.run(
                [compiler, *flags, "-o", str(out), str(src)],
                check=True,
                capture_output=True,
                timeout=120,
            )
        os.replace(out, target)  # atomic: concurrent workers never load a half-written file


@lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    """The built library, built on first use; None without a C compiler, with
    HFADAPT_NATIVE_DL16=0, or when building or loading it failed in any way: the accelerator
    never breaks an op, the torch path computes the same. Every kernel's loader goes through
    here, so its callers need no guard of their own."""
    if not settings.native_dl16():
        return None
    try:
        key = hashlib.sha1("|".join([source(), *_FLAGS, platform.machine()]).encode())
        target = cache_dir() / f"dl16-{key.hexdigest()[:16]}.so"
        if not target.exists():
            _build(target)
        return ctypes.CDLL(str(target))
    except Exception as exc:
        log.info("native DL16 kernels unavailable (%s); using the torch path", exc)
        return None


_PTR, _I64, _I32, _F32, _INT = (
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int32,
    ctypes.c_float,
    ctypes.c_int,
)


def _kernel(name: str, *argtypes: Any, restype: Any = None) -> Callable[..., Any] | None:
    """The library's function ``name`` with its C signature, None when the library is not built."""
    lib = _library()
    fn = getattr(lib, name, None) if lib is not None else None
    if fn is None:
        return None
    fn.argtypes = list(argtypes)
    fn.restype = restype
    return fn  # type: ignore[no-any-return]


@lru_cache(maxsize=1)
def load_sum_truncated() -> Callable[..., None] | None:
    """The kernel ``f(parts_ptr, pieces, n, dropped_bits, out_ptr, threads)``: ``out[i]`` is
    the in-order fp32 sum of the ``pieces`` contiguous partials ``parts[p * n + i]``, each
    rounded half-up to ``23 - dropped_bits`` mantissa bits first; None when not built."""
    return _kernel("hfadapt_sum_truncated", _PTR, _I64, _I64, _I32, _PTR, _INT)


@lru_cache(maxsize=1)
def load_sum_truncated_round() -> Callable[..., None] | None:
    """The kernel ``f(parts_ptr, pieces, n, dropped_bits, bias_ptr or None, columns,
    max_finite, below_min_normal, dropped, overflow, out_ptr, threads)``: load_sum_truncated's sum,
    plus ``bias[i % columns]`` when given, rounded to DL16 (as ``load``'s kernel without a
    transfer); None when not built."""
    return _kernel(
        "hfadapt_sum_truncated_round",
        *(_PTR, _I64, _I64, _I32, _PTR, _I64),
        *(_F32, _F32, _I32, _F32, _PTR, _INT),
    )


@lru_cache(maxsize=1)
def load_accumulate_truncated() -> Callable[..., None] | None:
    """The kernel ``f(acc_ptr, parts_ptr, pieces, n, dropped_bits, first, bias_ptr or None,
    columns, max_finite, below_min_normal, dropped, overflow, threads)``: one step of
    load_sum_truncated_round's sum made a group of ``pieces`` partials at a time (``acc``
    becomes their sum when ``first``, else ``acc`` plus each in order), then the bias and the
    rounding when given (``max_finite`` 0: no rounding); None when not built."""
    return _kernel(
        "hfadapt_accumulate_truncated",
        *(_PTR, _PTR, _I64, _I64, _I32, _INT, _PTR, _I64),
        *(_F32, _F32, _I32, _F32, _INT),
    )


@lru_cache(maxsize=1)
def load_softmax_floor() -> Callable[..., None] | None:
    """The kernel ``f(x_ptr, out_ptr, top_ptr, rows, columns, floor, code, max_finite,
    below_min_normal, dropped, overflow, threads)``: the softmax with the exp floor
    (kernels._softmax_floor) over the last dimension of contiguous float32 rows, each row's
    max written to ``top``, the probabilities rounded to DL16 unless ``max_finite`` is 0; None
    when not built."""
    return _kernel(
        "hfadapt_softmax_floor",
        *(_PTR, _PTR, _PTR, _I64, _I64, _F32, _F32),
        *(_F32, _F32, _I32, _F32, _INT),
    )


@lru_cache(maxsize=1)
def load_layer_norm() -> Callable[..., None] | None:
    """The kernel ``f(x_ptr, rows, columns, weight_ptr or None, bias_ptr or None, eps,
    max_finite, below_min_normal, dropped, overflow, out_ptr, mean_ptr, rstd_ptr, threads)``:
    LayerNorm with DL16 statistics (kernels._layer_norm_dl16) over each row of contiguous
    float32 values, each row's mean and rstd written out; None when not built."""
    return _kernel(
        "hfadapt_layer_norm_dl16",
        *(_PTR, _I64, _I64, _PTR, _PTR, _F32),
        *(_F32, _F32, _I32, _F32, _PTR, _PTR, _PTR, _INT),
    )


@lru_cache(maxsize=1)
def load_aten_sum() -> Callable[..., None] | None:
    """The kernel ``f(x_ptr, rows, columns, lanes, out_ptr)``: each row's sum of contiguous
    float32 values in the order of ATen's CPU sum with vectors of ``lanes`` lanes (the sum
    the row programs make, on its own: their probe compares it with torch's); None when not
    built."""
    return _kernel("hfadapt_aten_sum", _PTR, _I64, _I64, _INT, _PTR)


@lru_cache(maxsize=1)
def load_row_program() -> Callable[..., None] | None:
    """The kernel ``f(rows, columns, nodes, desc_ptr, inputs_ptr, numbers_ptr, outs_ptr,
    lanes, max_finite, below_min_normal, dropped, overflow, threads)``: a row program of the
    eager device (hfadapt.spyre.eager.fusion, which writes ``desc``); None when not built."""
    return _kernel(
        "hfadapt_row_program",
        *(_I64, _I64, _I64, _PTR, _PTR, _PTR, _PTR, _INT),
        *(_F32, _F32, _I32, _F32, _INT),
    )


@lru_cache(maxsize=1)
def load_amx() -> tuple[Callable[..., int], Callable[..., None]] | None:
    """The AMX product kernels ``(pack, matmul)`` when this machine and process can run them
    (the CPU has AMX's bf16 tiles and the kernel grants their state), else None:
    ``pack(x_ptr, rows, depth, si, sk, role, rows_p, depth_p, out_ptr, threads)`` splits an
    operand into the tiles' layout and returns how many values do not split exactly;
    ``matmul(a_ptr, b_ptr, m, n, depth_p, piece, dropped_bits, bias_ptr or None, max_finite,
    below_min_normal, dropped, overflow, out_ptr, threads)`` makes the chunked product (the
    layouts and the steps are written in dl16_kernels.c)."""
    if not settings.native_amx():
        return None
    ready = _kernel("hfadapt_amx_ready", restype=_INT)
    pack = _kernel(
        "hfadapt_amx_pack",
        *(_PTR, _I64, _I64, _I64, _I64, _INT, _I64, _I64, _PTR, _INT),
        restype=_I64,
    )
    matmul = _kernel(
        "hfadapt_amx_matmul",
        *(_PTR, _PTR, _I64, _I64, _I64, _I64, _I32, _PTR),
        *(_F32, _F32, _I32, _F32, _PTR, _INT),
    )
    if ready is None or pack is None or matmul is None or not ready():
        return None
    return pack, matmul


@lru_cache(maxsize=1)
def load() -> Callable[..., None] | None:
    """The kernel ``f(ptr, n, max_finite, below_min_normal, dropped, overflow, host_inf,
    threads)``
    (host_inf 0: device arithmetic, no transfer), built on first use; None without a C compiler
    or with HFADAPT_NATIVE_DL16=0."""
    return _kernel("hfadapt_round_dl16", _PTR, _I64, _F32, _F32, _I32, _F32, _F32, _INT)


def available() -> bool:
    return load() is not None
