"""Which plain attributes of a module (and of its submodules and config) a call reads.

A graph freezes every such value where it was captured (``self.num_heads``, ``config.hidden_act``,
an ``eps``): it is right for another module instance only when those values are the same. This
records the names read while trusted code runs a call, so that hfadapt can apply the graph only
where they match. The record is made by swapping each object's class for a subclass that notes
attribute reads, for the length of the call; nothing is changed on the objects themselves."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

MAX_VALUE_ITEMS = 16


def is_plain(value: object) -> bool:
    """Whether a value is a plain literal a condition can compare (and a graph may bake)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return not isinstance(value, str) or len(value) <= 200
    if isinstance(value, (tuple, list)) and len(value) <= MAX_VALUE_ITEMS:
        return all(v is None or isinstance(v, (bool, int, float, str)) for v in value)
    return False


def plain(value: object) -> object:
    """A plain value in JSON form (tuples as lists)."""
    return list(value) if isinstance(value, tuple) else value


def _tracing_class(cls: type, prefix: str, seen: dict[str, object]) -> type:
    getter: Any = cls.__getattribute__

    def __getattribute__(self: object, name: str) -> Any:
        value = getter(self, name)
        if not name.startswith("_") and is_plain(value):
            seen.setdefault(prefix + name, plain(value))
        return value

    return type(
        cls.__name__, (cls,), {"__getattribute__": __getattribute__, "__module__": cls.__module__}
    )


@contextmanager
def record_reads(module: torch.nn.Module) -> Iterator[dict[str, Any]]:
    """Within the block, every plain attribute read of ``module``, its submodules and their
    configs is noted in the yielded dict: ``{"path.name": value}`` (``config.name`` for the
    config of the module itself, ``sub.config.name`` for a submodule's)."""
    seen: dict[str, Any] = {}
    swapped: list[tuple[Any, type]] = []
    configs: set[int] = set()
    try:
        for path, sub in module.named_modules(remove_duplicate=True):
            prefix = f"{path}." if path else ""
            swapped.append((sub, type(sub)))
            config = sub.__dict__.get("config")
            sub.__class__ = _tracing_class(type(sub), prefix, seen)
            if config is not None and id(config) not in configs and hasattr(config, "to_dict"):
                configs.add(id(config))
                swapped.append((config, type(config)))
                config.__class__ = _tracing_class(type(config), f"{prefix}config.", seen)
        yield seen
    finally:
        for obj, cls in reversed(swapped):
            obj.__class__ = cls


def read_value(module: torch.nn.Module, path: str) -> Any:
    """The current value at ``path`` (as :func:`record_reads` names it); a missing attribute
    reads as a marker that equals nothing recorded."""
    obj: Any = module
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:
            return _MISSING
    return plain(obj) if is_plain(obj) else _MISSING


class _Missing:
    def __eq__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()

__all__ = ["is_plain", "plain", "read_value", "record_reads"]
