"""hfadapt: which Hugging Face embedding models run on IBM Spyre, and adapters that make more
of them run. Importing this package is cheap; torch and transformers load on first use.

    import hfadapt
    model = hfadapt.load("sentence-transformers/all-MiniLM-L6-v2")  # adapted, fp16, on spyre
    vectors = model.encode(["Spyre runs this."])
"""

from __future__ import annotations

from typing import Any

from hfadapt.version import __version__

__all__ = ["__version__", "adapt", "load"]


def load(*args: Any, **kwargs: Any) -> Any:
    """See hfadapt.api.load."""
    from hfadapt.api import load as _load

    return _load(*args, **kwargs)


def adapt(*args: Any, **kwargs: Any) -> Any:
    """See hfadapt.api.adapt."""
    from hfadapt.api import adapt as _adapt

    return _adapt(*args, **kwargs)
