"""Where hfadapt keeps what it builds for itself (the native DL16 kernels, the compile cache):
``$HFADAPT_CACHE_DIR``, else ``$XDG_CACHE_HOME/hfadapt``, else ``~/.cache/hfadapt``. Everything
in it can be deleted at any time; it is built again when needed."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    base = os.environ.get("HFADAPT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "hfadapt",
    )
    return Path(base)
