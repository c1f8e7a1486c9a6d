"""This process as a new one finds the C kernels: no loader of ``dl16_native`` run yet, and no
module holding a kernel it looked up, so a test reads in process what a new interpreter would
decide under the environment the test sets. ``native_build`` keeps the library it already
opened, so running a loader again builds nothing."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

# Modules that keep the kernel they looked up, by attribute, and what they hold before looking.
_HOLDERS = {
    "hfadapt.spyre.numerics.dl16": {"_native": False},
    "hfadapt.spyre.eager.fusion": {"_kernel": False, "_lanes": None},
}


def loaders() -> list[Any]:
    """Each cached loader of the C kernels (``load``, ``load_amx``, ...)."""
    from hfadapt.spyre.numerics import dl16_native

    found = [getattr(dl16_native, name) for name in dir(dl16_native) if name.startswith("load")]
    return [loader for loader in found if hasattr(loader, "cache_clear")]


def loaders_run() -> int:
    """How many loaders have run (hold an answer) in this process."""
    return sum(loader.cache_info().currsize for loader in loaders())


@contextlib.contextmanager
def loaders_not_run() -> Iterator[None]:
    """Inside: no loader has run and no module holds a kernel. On leaving, the loaders'
    answers are dropped again (the next caller loads under its own environment, not one a test
    set), and each module gets back what it held (one imported inside: nothing looked up)."""
    held = {
        name: {attr: getattr(sys.modules[name], attr) for attr in fresh}
        for name, fresh in _HOLDERS.items()
        if name in sys.modules
    }
    for loader in loaders():
        loader.cache_clear()
    for name in held:
        for attr, value in _HOLDERS[name].items():
            setattr(sys.modules[name], attr, value)
    try:
        yield
    finally:
        for loader in loaders():
            loader.cache_clear()
        for name, fresh in _HOLDERS.items():  # a module first imported inside starts afresh
            for attr, value in held.get(name, fresh).items():
                if name in sys.modules:
                    setattr(sys.modules[name], attr, value)
