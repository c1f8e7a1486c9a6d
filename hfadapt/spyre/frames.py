"""Which Python frames Dynamo compiles on its own: glue that never holds a device op.

After a graph break Dynamo compiles every function it enters as a frame of its own, and a
break deep inside nested calls makes it trace the whole chain again at each level (the
adapter dispatch, the host mask adapter, transformers' forward decorators: 18 of the 20
frames of a compiled all-MiniLM-L6-v2, none with a graph). ``inline_only(fn)`` marks a
function that only routes a call (picks the code to run, passes arguments on): where Dynamo
traces it, it is inlined as before, so the graphs keep every op they had; where it would
start a frame of its own, Dynamo runs it as plain Python and compiles the functions it calls.
Its graphs are the same; the tracing of the glue is gone.

Inside such a frame ``torch.compiler.is_compiling()`` is False: glue that must know whether
torch.compile is running it asks ``compile_running()``, which also sees Dynamo's frame
callback (set while compiled code runs, so that the functions it calls get compiled).
Both rest on private Dynamo API (``set_code_exec_strategy``, ``get_eval_frame_callback``);
where it is missing, nothing is marked and ``compile_running`` is ``is_compiling``."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from hfadapt import torch_internals as ti

__all__ = ["compile_running", "inline_only"]

F = TypeVar("F", bound=Callable[..., Any])


def _code_of(fn: object) -> types.CodeType | None:
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    return code if isinstance(code, types.CodeType) else None


def inline_only(fn: F) -> F:
    """Mark ``fn`` (a function or method) as glue: inlined where Dynamo traces it, never
    compiled as a frame of its own. Returns ``fn`` itself (its code object is marked, so every
    closure made from the same ``def`` is). A function holding device ops must not be marked:
    called after a graph break, its ops would run uncompiled."""
    code = _code_of(fn)
    if code is None:
        return fn
    ti.skip_code(code)  # a torch without it: the frame is compiled, as before
    return fn


def compile_running() -> bool:
    """Whether torch.compile is tracing or running the caller: ``is_compiling()`` in traced
    code, Dynamo's frame callback in an ``inline_only`` frame that compiled code called. False
    inside ``torch.compiler.disable`` and in plain eager code."""
    if torch.compiler.is_compiling():
        return True
    return callable(ti.eval_frame_callback())
