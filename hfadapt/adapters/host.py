"""Host work inside a device run: the one way an adapter runs code on the host (the CPU) and
moves the result back to the device, as the card's runtime does with work the device cannot do
(mask building, position ids, bucketed biases, pooling).

``on_host(fn, *args, back_to=device, **kwargs)`` moves every tensor among the arguments to the
CPU (also inside tuples, lists and dicts), calls ``fn`` there, and moves every tensor of the
result to ``back_to``. It runs outside compiled graphs (``torch.compiler.disable``), so a
compiled model sees one opaque host call, not host ops in its graph. ``host_copy`` gives ``fn``
a module whose weights live on the host, so stock methods can run unchanged.
``host_constant(key, fn, *args, back_to=device)`` builds a constant tensor on the host once per
key and device and hands the cached copy to later calls. Adapter files import these through
``hfadapt.adapters.api``."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hfadapt.errors import AdapterError
from hfadapt.spyre import host_constants

__all__ = ["host_constant", "host_copy", "on_host", "to_device", "to_host"]

HOST = torch.device("cpu")


def to_device(value: object, device: torch.device | str) -> Any:
    """``value`` with every tensor (also inside tuples, lists and dicts) moved to ``device``;
    anything else is returned as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(to_device(v, device) for v in value)
    if isinstance(value, list):
        return [to_device(v, device) for v in value]
    if isinstance(value, Mapping):  # dicts, and UserDicts such as a tokenizer's BatchEncoding
        return {k: to_device(v, device) for k, v in value.items()}
    return value


def to_host(value: object) -> Any:
    """``value`` with every tensor moved to the host (the CPU)."""
    return to_device(value, HOST)


@torch.compiler.disable
def on_host(
    fn: Callable[..., Any], /, *args: Any, back_to: torch.device | str, **kwargs: Any
) -> Any:
    """``fn(*args, **kwargs)`` run on the host, its tensors moved back to ``back_to``.

    Tensor arguments are moved to the CPU first; modules are passed as they are (give ``fn`` a
    :func:`host_copy` when it needs their weights). Casts belong inside ``fn``: a cast after
    the move back would be a device op."""
    return to_device(fn(*to_host(args), **to_host(kwargs)), back_to)


def host_constant(
    key: str, fn: Callable[..., torch.Tensor], /, *args: object, back_to: torch.device | str
) -> torch.Tensor:
    """``fn(*args)`` built on the host once per ``(key, args, back_to)`` and moved to
    ``back_to``; later calls return the cached tensor (a compiled graph sees it as a constant;
    the cache: ``hfadapt.spyre.host_constants``). ``args`` must be hashable and decide the
    result together with ``key``."""
    found = host_constants.cached((key, *args, str(back_to)))
    return found if found is not None else _build_constant(key, fn, args, back_to)


@torch.compiler.disable
def _build_constant(
    key: str, fn: Callable[..., torch.Tensor], args: tuple[Any, ...], back_to: torch.device | str
) -> torch.Tensor:
    built: torch.Tensor = on_host(fn, *args, back_to=back_to)
    host_constants.store((key, *args, str(back_to)), built)
    return built


def host_copy(
    module: torch.nn.Module, *submodules: str, dtype: torch.dtype | None = torch.float32
) -> torch.nn.Module:
    """A shallow copy of ``module`` whose own parameters and buffers, and those of the named
    direct ``submodules``, are on the host; floating ones converted to ``dtype`` (fp32 by
    default: the host computes what the device hands it in full precision; ``None`` keeps
    each dtype). Other submodules are shared with the original, which is never changed."""
    host = copy.copy(module)
    host._parameters = {
        k: None if v is None else torch.nn.Parameter(_moved(v, dtype), requires_grad=False)
        for k, v in module._parameters.items()
    }
    host._buffers = {k: None if v is None else _moved(v, dtype) for k, v in module._buffers.items()}
    if submodules:
        host._modules = dict(module._modules)
        for name in submodules:
            child = module._modules.get(name)
            if child is None:
                raise AdapterError(
                    f"host_copy: submodules names {name!r}, not a submodule of "
                    f"{type(module).__name__} (it has {', '.join(module._modules) or 'none'})"
                )
            host._modules[name] = host_copy(child, dtype=dtype)
    return host


def _moved(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    t = t.detach().to(HOST)
    return t.to(dtype) if dtype is not None and t.is_floating_point() else t
