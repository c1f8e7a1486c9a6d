"""hfadapt: which Hugging Face embedding models run on IBM Spyre, and adapters that
make more of them run. Importing this package is cheap; torch loads on first use."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
