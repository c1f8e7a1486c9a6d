"""Every use hfadapt makes of torch's private API, in one place: why torch is a narrow range.

torch promises nothing about names that start with an underscore, and hfadapt needs some of
them: the simulated device is a PrivateUse1 backend registered from Python, its compile half is
a Dynamo backend that reads aot_autograd's metadata, and the proofs of drafted graphs run under
fake tensors. Modules of hfadapt reach those names only through this module
(``tests/package/test_torch_internals.py`` fails on a private torch name used anywhere else),
and :data:`USED` lists each one with what it is for, so a new torch release is checked in one
place: the same test resolves every listed name on the installed torch, and the canary
(``scripts/canary``) runs it on the newest torch the range allows.

Names in Dynamo, inductor and functorch are imported on first use, never at import: importing
Dynamo costs ``import torch`` more than a second and most processes never compile. Patches to
torch's own modules go through :func:`patched`, which saves what it replaces and puts it back.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, TypeVar

import torch
import torch._ops
from torch.utils import _pytree as pytree

__all__ = [
    "COMPILE_FX_MODULE",
    "DYNAMO_MODULE",
    "USED",
    "DeviceGuard",
    "HigherOrderOperator",
    "OpOverload",
    "OpOverloadPacket",
    "PrivateUse1Hooks",
    "aot_autograd",
    "autocast_supported_devices",
    "compile_fx_module",
    "compiler_backend_registered",
    "composite_implicit_key",
    "disabled_torch_function_impl",
    "dispatch_has_kernel",
    "dynamo_config",
    "dynamo_counters",
    "dynamo_module",
    "dynamo_reset",
    "eval_frame_callback",
    "fake_tensor_mode",
    "fw_metadata",
    "inductor_error",
    "is_top_frame",
    "lookup_backend",
    "make_wrapper_subclass",
    "output_type_non_alias",
    "patched",
    "privateuse1_backend_name",
    "privateuse1_device_type",
    "pytree",
    "register_compiler_backend",
    "reparametrize_module",
    "set_skip_frame",
    "setup_privateuse1_python_backend",
    "skip_code",
    "torch_dispatch_mode",
    "unset_fake_temporarily",
]

#: Every private torch name hfadapt uses: (dotted name, what hfadapt uses it for).
USED: tuple[tuple[str, str], ...] = (
    ("torch._ops.OpOverload", "ATen overloads: graph nodes, dispatch, the op allowlist"),
    ("torch._ops.OpOverloadPacket", "graph targets given as packets"),
    ("torch._ops.HigherOrderOperator", "graph targets that are higher-order ops"),
    ("torch.utils._pytree", "flattening op arguments and results"),
    ("torch._C._get_privateuse1_backend_name", "whether PrivateUse1 is free, and its name"),
    (
        "torch.utils.backend_registration._setup_privateuseone_for_python_backend",
        "registering the simulated device from Python (no C++ build)",
    ),
    ("torch._C._acc.PrivateUse1Hooks", "the device's hooks (is_available, ...)"),
    ("torch._C._acc.DeviceGuard", "the device's guard"),
    ("torch._C._autograd.DeviceType", "the PrivateUse1 device type of the guard"),
    ("torch._C._dispatch_has_kernel_for_dispatch_key", "whether an op decomposes"),
    ("torch._C.DispatchKey", "CompositeImplicitAutograd, the decomposing ops' key"),
    ("torch._C._disabled_torch_function_impl", "the device tensor's __torch_function__"),
    ("torch.Tensor._make_wrapper_subclass", "the device tensor type"),
    ("torch._C._autocast_supported_devices", "pinning autocast off on every device"),
    ("torch.utils._python_dispatch.TorchDispatchMode", "watching ops a graph runs"),
    ("torch._subclasses.fake_tensor.FakeTensorMode", "shapes of graphs without data"),
    ("torch._subclasses.fake_tensor.unset_fake_temporarily", "real tensors while tracing"),
    ("torch.nn.utils.stateless._reparametrize_module", "running a module on other weights"),
    ("torch._dynamo.reset", "a clean Dynamo between a worker's units"),
    ("torch._dynamo.config", "static shapes and recompile limits for audits"),
    ("torch._dynamo.utils.counters", "graph breaks counted during an audit"),
    ("torch._dynamo.eval_frame.skip_code", "glue functions inlined, never frames"),
    ("torch._dynamo.eval_frame.set_code_exec_strategy", "the device dispatch never traced"),
    ("torch._dynamo.eval_frame.FrameExecStrategy", "the strategy that skips a frame"),
    ("torch._dynamo.eval_frame.FrameAction", "the SKIP action"),
    ("torch._C._dynamo.eval_frame.get_eval_frame_callback", "whether compiled code runs"),
    ("torch._dynamo.symbolic_convert.InstructionTranslator", "a frame's start vs a resume"),
    ("torch._dynamo.symbolic_convert.get_funcname", "skipped while its debug log is off"),
    ("torch._dynamo.output_graph", "whether the trace_call log is on"),
    ("torch._dynamo.guards.profile_guard_manager", "skipped: a guard latency probe for logs"),
    ("torch._dynamo.backends.common.aot_autograd", "the spyre backend's ATen graphs"),
    ("torch._dynamo.backends.registry.register_backend", "the backend named spyre"),
    ("torch._dynamo.backends.registry._COMPILER_FNS", "whether spyre is registered"),
    ("torch._dynamo.backends.registry.lookup_backend", "the default backend's device route"),
    ("torch._guards.TracingContext", "aot_autograd's metadata of the graph compiled"),
    ("torch._functorch._aot_autograd.schemas.OutputType", "plain outputs, for the cache"),
    ("torch._inductor.exc.InductorError", "inductor's wrapper around a backend's error"),
    ("torch._inductor.compile_fx", "the default backend, routed for the device"),
)

_T = TypeVar("_T", bound=torch.Tensor)

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket
HigherOrderOperator = torch._ops.HigherOrderOperator


def resolve(dotted: str) -> Any:
    """The object a dotted name of :data:`USED` names on the installed torch (raises
    ImportError or AttributeError when this torch lacks it)."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


# -- the PrivateUse1 device ---------------------------------------------------------------


def privateuse1_backend_name() -> str:
    """PrivateUse1's current name ("privateuseone" while no backend has renamed it)."""
    return str(torch._C._get_privateuse1_backend_name())


def setup_privateuse1_python_backend(name: str, **kwargs: Any) -> None:
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(name, **kwargs)


PrivateUse1Hooks = torch._C._acc.PrivateUse1Hooks
DeviceGuard = torch._C._acc.DeviceGuard


def privateuse1_device_type() -> Any:
    return torch._C._autograd.DeviceType.PrivateUse1


def dispatch_has_kernel(name: str, key: str) -> bool:
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(name, key))


def composite_implicit_key() -> Any:
    return torch._C.DispatchKey.CompositeImplicitAutograd


disabled_torch_function_impl: Callable[..., Any] = torch._C._disabled_torch_function_impl


def make_wrapper_subclass(cls: type[_T], *args: Any, **kwargs: Any) -> _T:
    return torch.Tensor._make_wrapper_subclass(cls, *args, **kwargs)


def autocast_supported_devices() -> list[str]:
    return list(torch._C._autocast_supported_devices())


# -- dispatch modes and fake tensors -------------------------------------------------------


def torch_dispatch_mode() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def fake_tensor_mode(**kwargs: Any) -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(**kwargs)


def unset_fake_temporarily() -> Any:
    from torch._subclasses.fake_tensor import unset_fake_temporarily as unset

    return unset()


def reparametrize_module(module: torch.nn.Module, state: dict[str, Any]) -> Any:
    from torch.nn.utils.stateless import _reparametrize_module

    return _reparametrize_module(module, state)


# -- Dynamo, imported on first use ---------------------------------------------------------


#: Dynamo's package: hfadapt waits for its import rather than importing it (see above).
DYNAMO_MODULE = "torch._dynamo"


def dynamo_module(name: str = "") -> ModuleType:
    """``torch._dynamo`` or one of its submodules (``"eval_frame"``, ``"guards"``, ...)."""
    return importlib.import_module(DYNAMO_MODULE + (f".{name}" if name else ""))


def dynamo_reset() -> None:
    import torch._dynamo

    torch._dynamo.reset()


def dynamo_config() -> Any:
    import torch._dynamo

    return torch._dynamo.config


def dynamo_counters() -> Any:
    from torch._dynamo.utils import counters

    return counters


def skip_code(code: Any) -> bool:
    """Mark a code object never to be compiled as a frame (False where this torch lacks it)."""
    try:
        from torch._dynamo.eval_frame import skip_code as skip
    except ImportError:
        return False
    skip(code)
    return True


def set_skip_frame(code: Any) -> None:
    """Dynamo skips this code's frame and every frame it calls (raises where unavailable)."""
    eval_frame = dynamo_module("eval_frame")
    action = eval_frame.FrameAction  # private names, not exported: read as attributes
    strategy = eval_frame.FrameExecStrategy(action.SKIP, action.SKIP)
    eval_frame.set_code_exec_strategy(code, strategy)


def eval_frame_callback() -> Any:
    """Dynamo's current frame callback (None where this torch lacks the probe)."""
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
    except ImportError:
        return None
    return get_eval_frame_callback()


def is_top_frame(resume_prefix: str) -> bool:
    """Whether Dynamo is compiling a frame's start, not a resume function after a graph break
    (True where the probe is unavailable: every graph then starts a new report)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        return tx is None or not tx.f_code.co_name.startswith(resume_prefix)
    except Exception:
        return True


def fw_metadata() -> Any:
    """aot_autograd's metadata of the graph being compiled, or None."""
    ctx = torch._guards.TracingContext.try_get()
    return getattr(ctx, "fw_metadata", None) if ctx is not None else None


def output_type_non_alias() -> Any:
    from torch._functorch._aot_autograd.schemas import OutputType

    return OutputType.non_alias


def aot_autograd(**kwargs: Any) -> Any:
    from torch._dynamo.backends.common import aot_autograd as make

    return make(**kwargs)


def inductor_error() -> type[BaseException]:
    from torch._inductor.exc import InductorError

    return InductorError


def compiler_backend_registered(name: str) -> bool:
    from torch._dynamo.backends.registry import _COMPILER_FNS

    return name in _COMPILER_FNS


def register_compiler_backend(fn: Callable[..., Any], name: str) -> None:
    from torch._dynamo.backends.registry import register_backend

    register_backend(compiler_fn=fn, name=name)


def lookup_backend(name: str) -> Callable[..., Any]:
    from torch._dynamo.backends.registry import lookup_backend as lookup

    return lookup(name)


#: The module whose ``compile_fx`` the default backend imports each time it compiles a graph.
COMPILE_FX_MODULE = "torch._inductor.compile_fx"


def compile_fx_module() -> ModuleType:
    return importlib.import_module(COMPILE_FX_MODULE)


# -- patches to torch's modules, saved and restored ----------------------------------------


@contextmanager
def patched(replacements: list[tuple[ModuleType, str, Any]]) -> Iterator[None]:
    """Set ``module.name = value`` for each replacement whose name the module has (a torch
    without it is left alone), and put every saved value back on exit, in reverse order."""
    saved: list[tuple[ModuleType, str, Any]] = []
    try:
        for module, name, value in replacements:
            if hasattr(module, name):
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, value)
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)
