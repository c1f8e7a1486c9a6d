"""``torch.compile(model)`` with torch's default backend on a model on ``spyre``: the card's form.

torch-spyre has no Dynamo backend named "spyre" (``backend="spyre"`` raises InvalidBackend
there). ``torch.compile`` keeps its default backend, inductor, and torch-spyre makes inductor
compile for the device a graph's tensors are on: it registers its inductor device backend for
"spyre" (``register_backend_for_device``) and wraps ``torch._inductor.compile_fx.compile_fx``
so that a graph that uses the device is compiled its way (torch_spyre/_inductor/__init__.py).

The simulator hooks in at the same place, when the device is registered: ``compile_fx`` is
wrapped (once inductor is imported: importing it costs seconds, most processes never compile)
so that a graph that uses the spyre device (an example input, a node's value or a factory's
``device=``) goes to the backend registered under the name "spyre", the same compile path as
``backend="spyre"``, with the device's active profile (``torch.spyre.set_profile``). Every
other graph goes to inductor unchanged. The backend is found through Dynamo's backend registry
(hfadapt's ``torch_dynamo_backends`` entry point, or ``hfadapt.spyre.compile.backend.register()``),
so the eager device does not import the compile half. Most compiled calls on device tensors
reach no graph at all: Dynamo cannot trace the simulator's tensors, and their ops run one by
one under the compiled mode's rules (hfadapt.spyre.eager.compiled_call, which counts inductor
as a backend that compiles for the device).

Why not ``register_backend_for_device`` alone: inductor asks for a device's scheduling only
after its own aot_autograd, decompositions and lowerings, so hfadapt's checks of the ATen graph
(its decomposition table, every violation at once) could not be the ones that judge it.

Private torch API used (where it is missing, the default backend is left as it is):

- ``torch._inductor.compile_fx.compile_fx``: what torch.compile's default backend
  (``torch._TorchCompileInductorWrapper``) and the registry's "inductor" import each time they
  compile a graph; replaced by a wrapper, as torch-spyre does;
- ``torch._dynamo.backends.registry.lookup_backend``: the backend named "spyre".
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hfadapt import torch_internals as ti
from hfadapt.errors import DeviceError
from hfadapt.spyre.eager.selection import DEVICE_TYPE
from hfadapt.spyre.eager.tensor import when_imported
from hfadapt.spyre.rules.tracking import active_profile

COMPILE_FX = ti.COMPILE_FX_MODULE
BACKEND = "spyre"  # the Dynamo backend that compiles for the simulated device
_MARK = "_hfadapt_spyre_route"  # set on the wrapper: the module holds it already
_lock = threading.Lock()


def _on_device(value: object) -> bool:
    if isinstance(value, torch.Tensor):
        return value.device.type == DEVICE_TYPE
    if isinstance(value, list | tuple):
        return any(_on_device(v) for v in value)
    if isinstance(value, dict):
        return any(_on_device(v) for v in value.values())
    return False


def _is_device(value: object) -> bool:
    if isinstance(value, torch.device):
        return value.type == DEVICE_TYPE
    return isinstance(value, str) and value.split(":", 1)[0] == DEVICE_TYPE


def uses_device(gm: torch.fx.GraphModule, example_inputs: Sequence[object]) -> bool:
    """Whether a graph Dynamo captured computes on the spyre device: an example input on it,
    a node whose value is on it (``x.to("spyre")``), or a factory given ``device="spyre"``."""
    if _on_device(list(example_inputs)):
        return True
    for node in gm.graph.nodes:
        if _on_device(node.meta.get("val")) or _on_device(node.meta.get("example_value")):
            return True
        if _is_device(node.kwargs.get("device")):
            return True
    return False


def device_compiler() -> Callable[..., object]:
    """The backend registered as "spyre" (hfadapt.spyre.compile.backend.spyre_backend)."""

    try:
        return ti.lookup_backend(BACKEND)
    except Exception as e:  # InvalidBackend: neither the entry point nor register()
        raise DeviceError(
            "torch.compile on the simulated spyre device needs its compiler: install hfadapt "
            "(its torch_dynamo_backends entry point) or call "
            "hfadapt.spyre.compile.backend.register()"
        ) from e


def _route(original: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(original)
    def compile_fx(model_: Any, example_inputs_: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        if isinstance(model_, torch.fx.GraphModule) and uses_device(model_, example_inputs_):
            # inductor's own arguments (config patches, decompositions, inner compilers) are
            # inductor's: the device's compiler takes the graph and its profile only
            compiler = device_compiler()
            return compiler(model_, example_inputs_, options={"profile": active_profile()})
        return original(model_, example_inputs_, *args, **kwargs)

    setattr(compile_fx, _MARK, True)
    return compile_fx


def routed() -> bool:
    """Whether inductor's ``compile_fx`` is wrapped (False until inductor is imported)."""
    module = sys.modules.get(COMPILE_FX)
    return bool(getattr(getattr(module, "compile_fx", None), _MARK, False))


def _wrap() -> None:
    """Runs right after inductor's compile_fx module executes, or at once. Never raises (it
    may run inside an import): an inductor without ``compile_fx`` is left as it is."""
    try:
        with _lock:
            module = sys.modules.get(COMPILE_FX)
            original = getattr(module, "compile_fx", None)
            if module is None or not callable(original) or getattr(original, _MARK, False):
                return
            setattr(module, "compile_fx", _route(original))  # noqa: B010
    except Exception:
        return


def install() -> None:
    """Route the default backend's graphs that use the spyre device to the device's compiler.
    Idempotent; called when the simulated device is registered."""
    when_imported(COMPILE_FX, _wrap)


__all__ = ["BACKEND", "device_compiler", "install", "routed", "uses_device"]
