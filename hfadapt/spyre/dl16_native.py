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

log = logging.getLogger(__name__)

# Same steps as dl16._round_inplace: with a transfer, +-inf becomes +-host_inf; clamp to
# +-big (NaN passes); add and subtract a magic number of the value's sign and exponent shifted
# by the dropped mantissa bits (the FPU rounds to nearest even); zero |y| <= the largest float
# below the smallest normal; a rounded |y| past the largest finite value becomes +-inf.
_SOURCE = r"""
#include <stdint.h>
#include <string.h>
void hfadapt_round_dl16(float* x, int64_t n, float maxf, float lam, int32_t shift, float big,
                        float host_inf, int nt) {
    const float inf = __builtin_inff();
    #pragma omp parallel for schedule(static) num_threads(nt) if(n > 32768)
    for (int64_t i = 0; i < n; i++) {
        float v = x[i];
        if (host_inf > 0.0f && (v == inf || v == -inf)) v = v > 0.0f ? host_inf : -host_inf;
        v = v > big ? big : (v < -big ? -big : v);
        int32_t b;
        memcpy(&b, &v, 4);
        uint32_t mb = ((uint32_t)b & 0xFF800000u) + (uint32_t)shift;
        float m;
        memcpy(&m, &mb, 4);
        float y = (v + m) - m;
        y = (y >= -lam && y <= lam) ? 0.0f : y;
        x[i] = y > maxf ? inf : (y < -maxf ? -inf : y);
    }
}
"""
# No -ffast-math: (v + m) - m must not be simplified away, nor contracted. OpenMP shares
# torch's libgomp (same soname), so torch.set_num_threads bounds both.
_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-fno-fast-math", "-ffp-contract=off"]


def cache_dir() -> Path:
    base = os.environ.get("HFADAPT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "hfadapt",
    )
    return Path(base)


def _build(target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
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
def load() -> Callable[..., None] | None:
    """The kernel ``f(ptr, n, max_finite, below_min_normal, shift, clamp, host_inf, threads)``
    (host_inf 0: device arithmetic, no transfer), built on first use; None without a C compiler or with HFADAPT_NATIVE_DL16=0."""
    if os.environ.get("HFADAPT_NATIVE_DL16", "1") == "0":
        return None
    key = hashlib.sha1("|".join([_SOURCE, *_FLAGS, platform.machine()]).encode()).hexdigest()
    target = cache_dir() / f"dl16-{key[:16]}.so"
    try:
        if not target.exists():
            _build(target)
        fn = ctypes.CDLL(str(target)).hfadapt_round_dl16
    except (OSError, subprocess.SubprocessError) as exc:
        log.info("native DL16 rounding unavailable (%s); using the torch path", exc)
        return None
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_float,
        ctypes.c_float,
        ctypes.c_int32,
        ctypes.c_float,
        ctypes.c_float,
        ctypes.c_int,
    ]
    fn.restype = None
    return fn  # type: ignore[no-any-return]


def available() -> bool:
    return load() is not None
