"""An optional C kernel for in-place DL16 rounding of float32 tensors, built with the system C
compiler on first use and cached. It computes exactly what ``dl16.round_dl16_`` computes (same
overflow to +-inf, host-infinity mapping, magic-addend rounding and flush to zero, bit for
bit) in one pass over memory instead of six, which is what keeps the compiled device near CPU speed on a busy machine.
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
from pathlib import Path
from typing import Any

from hfadapt import settings

log = logging.getLogger(__name__)

# hfadapt_round_dl16: the same steps as dl16._round_inplace: with a transfer, +-inf becomes +-host_inf; clamp to
# +-big (NaN passes); add and subtract a magic number of the value's sign and exponent shifted
# by the dropped mantissa bits (the FPU rounds to nearest even); zero |y| <= the largest float
# below the smallest normal; a rounded |y| past the largest finite value becomes ``over`` (the
# profile's overflow value: NaN, the card's 0x7FFF code, or +-inf) with the value's sign.
# hfadapt_sum_truncated: kernels.chunked_matmul's accumulation (kernels.truncate_partial_ on
# each of ``pieces`` fp32 partial products, then their sum in order) in one pass;
# hfadapt_sum_truncated_round: the same, then an optional bias over the last dimension, then
# the DL16 rounding, in one pass (a device linear's epilogue).
_SOURCE = r"""
#include <stdint.h>
#include <string.h>
/* An AVX2 build of each kernel beside the baseline one, chosen when the library loads (GCC's
   function multiversioning): eight floats a step where the CPU has them, never an illegal
   instruction where it does not. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif
static inline float round_one(float v, float maxf, float lam, int32_t shift, float big,
                              float over, float host_inf) {
    const float inf = __builtin_inff();
    if (host_inf > 0.0f && (v == inf || v == -inf)) v = v > 0.0f ? host_inf : -host_inf;
    v = v > big ? big : (v < -big ? -big : v);
    int32_t b;
    memcpy(&b, &v, 4);
    uint32_t mb = ((uint32_t)b & 0xFF800000u) + (uint32_t)shift;
    float m;
    memcpy(&m, &mb, 4);
    float y = (v + m) - m;
    y = (y >= -lam && y <= lam) ? 0.0f : y;
    return y > maxf ? over : (y < -maxf ? -over : y);
}

static inline float truncated(float x, uint32_t half, uint32_t keep) {
    uint32_t b;
    memcpy(&b, &x, 4);
    b = (b + half) & keep;
    float v;
    memcpy(&v, &b, 4);
    return v;
}

/* One row of `cols` values: the in-order sum of the pieces' truncated partials (piece p of
   this row starts at row + p * n), then the bias, then (when `maxf` > 0) the DL16 rounding. */
static inline void row_epilogue(const float* restrict row, int64_t pieces, int64_t n,
                                int64_t cols, uint32_t half, uint32_t keep,
                                const float* restrict bias, float maxf, float lam, int32_t shift,
                                float big, float over, float* restrict out) {
    for (int64_t c = 0; c < cols; c++) out[c] = truncated(row[c], half, keep);
    for (int64_t p = 1; p < pieces; p++) {
        const float* restrict piece = row + p * n;
        for (int64_t c = 0; c < cols; c++) out[c] = out[c] + truncated(piece[c], half, keep);
    }
    if (bias)
        for (int64_t c = 0; c < cols; c++) out[c] = out[c] + bias[c];
    if (maxf > 0.0f)
        for (int64_t c = 0; c < cols; c++)
            out[c] = round_one(out[c], maxf, lam, shift, big, over, 0.0f);
}

CLONES void hfadapt_round_dl16(float* x, int64_t n, float maxf, float lam, int32_t shift, float big,
                        float over, float host_inf, int nt) {
    #pragma omp parallel for schedule(static) num_threads(nt) if(n > 32768)
    for (int64_t i = 0; i < n; i++) x[i] = round_one(x[i], maxf, lam, shift, big, over, host_inf);
}

CLONES void hfadapt_sum_truncated(const float* parts, int64_t pieces, int64_t n, int32_t dropped,
                           float* out, int nt) {
    const uint32_t half = 1u << (dropped - 1);
    const uint32_t keep = ~((1u << dropped) - 1u);
    const int64_t block = 4096;
    #pragma omp parallel for schedule(static) num_threads(nt) if(n > 32768)
    for (int64_t i = 0; i < n; i += block) {
        int64_t len = n - i < block ? n - i : block;
        row_epilogue(parts + i, pieces, n, len, half, keep, 0, 0.0f, 0.0f, 0, 0.0f, 0.0f, out + i);
    }
}

CLONES void hfadapt_sum_truncated_round(const float* parts, int64_t pieces, int64_t n, int32_t dropped,
                                 const float* bias, int64_t cols, float maxf, float lam,
                                 int32_t shift, float big, float over, float* out, int nt) {
    const uint32_t half = 1u << (dropped - 1);
    const uint32_t keep = ~((1u << dropped) - 1u);
    const int64_t rows = n / cols;
    #pragma omp parallel for schedule(static) num_threads(nt) if(n > 32768)
    for (int64_t r = 0; r < rows; r++)
        row_epilogue(parts + r * cols, pieces, n, cols, half, keep, bias, maxf, lam, shift, big,
                     over, out + r * cols);
}
"""
# No -ffast-math: (v + m) - m must not be simplified away, nor contracted. OpenMP shares
# torch's libgomp (same soname), so torch.set_num_threads bounds both.
_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-fno-fast-math", "-ffp-contract=off"]


def cache_dir() -> Path:
    return settings.kernel_cache()


def _build(target: Path) -> None:
    compiler = settings.c_compiler() or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise OSError("no C compiler")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "dl16.c"
        src.write_text(_SOURCE)
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
    """The built library, built on first use; None without a C compiler or with
    HFADAPT_NATIVE_DL16=0."""
    if not settings.native_dl16():
        return None
    key = hashlib.sha1("|".join([_SOURCE, *_FLAGS, platform.machine()]).encode()).hexdigest()
    target = cache_dir() / f"dl16-{key[:16]}.so"
    try:
        if not target.exists():
            _build(target)
        return ctypes.CDLL(str(target))
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("native DL16 kernels unavailable (%s); using the torch path", exc)
        return None


_PTR, _I64, _I32, _F32, _INT = (
    ctypes.c_void_p,
    ctypes.c_int64,
    ctypes.c_int32,
    ctypes.c_float,
    ctypes.c_int,
)


def _kernel(name: str, *argtypes: Any) -> Callable[..., None] | None:
    """The library's function ``name`` with its C signature, None when the library is not built."""
    lib = _library()
    if lib is None:
        return None
    fn = getattr(lib, name)
    fn.argtypes = list(argtypes)
    fn.restype = None
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
    max_finite, below_min_normal, shift, clamp, overflow, out_ptr, threads)``: load_sum_truncated's sum,
    plus ``bias[i % columns]`` when given, rounded to DL16 (as ``load``'s kernel without a
    transfer); None when not built."""
    return _kernel(
        "hfadapt_sum_truncated_round",
        *(_PTR, _I64, _I64, _I32, _PTR, _I64),
        *(_F32, _F32, _I32, _F32, _F32, _PTR, _INT),
    )


@lru_cache(maxsize=1)
def load() -> Callable[..., None] | None:
    """The kernel ``f(ptr, n, max_finite, below_min_normal, shift, clamp, overflow, host_inf,
    threads)``
    (host_inf 0: device arithmetic, no transfer), built on first use; None without a C compiler
    or with HFADAPT_NATIVE_DL16=0."""
    return _kernel("hfadapt_round_dl16", _PTR, _I64, _F32, _F32, _I32, _F32, _F32, _F32, _INT)


def available() -> bool:
    return load() is not None
