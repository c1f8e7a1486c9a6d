"""Running stock model code with some of its global names swapped, for one call site.

Model code calls module-level helpers (``rotate_half``, ``create_causal_mask``...) through its
module's globals, so patching the module would change every model in the process. Instead an
adapter calls a *copy* of the stock function whose globals dict has the swaps; decorators
(``functools.wraps`` chains) are copied down to the wrapped function, so their behaviour stays.
Copies are cached; the originals are never touched."""

from __future__ import annotations

import threading
import types
from collections.abc import Callable
from typing import Any

import torch

_CACHE: dict[tuple[int, tuple[tuple[str, int], ...]], Callable[..., Any]] = {}
_LOCK = threading.Lock()


def _copy(
    fn: types.FunctionType, globals_: dict[str, Any], closure: tuple[Any, ...] | None
) -> types.FunctionType:
    new = types.FunctionType(fn.__code__, globals_, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    new.__module__ = fn.__module__
    return new


def _rebind(fn: Any, replacements: dict[str, Any]) -> Any:
    if not isinstance(fn, types.FunctionType):
        return fn
    inner = getattr(fn, "__wrapped__", None)
    cells = fn.__closure__ or ()
    if isinstance(inner, types.FunctionType) and any(_holds(c, inner) for c in cells):
        new_inner = _rebind(inner, replacements)
        closure = tuple(types.CellType(new_inner) if _holds(c, inner) else c for c in cells)
        new = _copy(fn, fn.__globals__, closure)
        new.__wrapped__ = new_inner  # type: ignore[attr-defined]
        return new
    globals_ = dict(fn.__globals__)
    globals_.update(replacements)
    return _copy(fn, globals_, fn.__closure__)


def _holds(cell: Any, value: Any) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # empty cell
        return False


def rebind(fn: Callable[..., Any], **replacements: Any) -> Callable[..., Any]:
    """A copy of ``fn`` (and of the functions its decorators wrap) that sees ``replacements``
    in place of the same-named globals. Cached per (fn, replacement objects)."""
    key = (id(fn), tuple(sorted((k, id(v)) for k, v in replacements.items())))
    found = _CACHE.get(key)  # the hot path takes no lock (and stays traceable by dynamo)
    if found is None:
        found = _build(key, fn, replacements)
    return found


@torch.compiler.disable
def _build(
    key: tuple[int, tuple[tuple[str, int], ...]],
    fn: Callable[..., Any],
    replacements: dict[str, Any],
) -> Callable[..., Any]:
    with _LOCK:
        found = _CACHE.get(key)
        if found is None:
            found = _CACHE[key] = _rebind(fn, replacements)
            # keep the replacement objects alive as long as the cache entry (ids stay unique)
            found.__dict__.setdefault("_hfadapt_replacements", replacements)
    return found


def stock_method(cls: type, name: str) -> Callable[..., Any]:
    """The class's own (unpatched) function for ``name``."""
    fn = getattr(cls, name)
    return getattr(fn, "__func__", fn)


__all__ = ["rebind", "stock_method"]
