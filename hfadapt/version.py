"""The installed hfadapt version (one place; ``hfadapt.__version__`` reads it)."""

__version__ = "0.1.0"
