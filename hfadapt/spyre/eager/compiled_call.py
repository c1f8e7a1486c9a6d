"""Whether the device is running ops inside a ``torch.compile`` call that compiles for it.

On the card, ``torch.compile(model)`` with the default backend (inductor) compiles for the
device the tensors are on; ``backend="spyre"`` is hfadapt's alias of that. Dynamo cannot trace
the simulated device's tensors (Python wrapper subclasses), so such a call on tensors already on
``spyre`` falls back to running op by op. The card compiles it; so that each op is then judged
by the compiled mode's rules (``gelu`` and ``amax`` compile-only, ``stack`` eager-only, casts),
the device asks this module. Other backends (``"eager"``, ``"aot_eager"``) run the ops eagerly,
on the card too: they keep the eager rules. Private Dynamo frames are read: where their layout
is not what this expects, the answer is False (the ops keep the eager rules), never an error."""

from __future__ import annotations

import sys

_EVAL_FRAME = "/_dynamo/eval_frame.py"
_MAX_DEPTH = 400


# The backends that compile for the device the tensors are on: torch.compile's default
# (inductor, which torch-spyre extends to the card) and hfadapt's "spyre" alias.
COMPILING_BACKENDS = frozenset({"inductor", "spyre"})


def _backend_name(callback: object) -> str | None:
    seen = 0
    while callback is not None and seen < 8:
        name = getattr(callback, "__name__", None)
        if isinstance(name, str) and name in COMPILING_BACKENDS:
            return name
        callback = getattr(callback, "_torchdynamo_orig_backend", None) or getattr(
            callback, "_torchdynamo_orig_callable", None
        )
        seen += 1
    return None


def spyre_compiled_call() -> bool:
    """True when a frame of Dynamo's ``compile_wrapper`` for a backend that compiles for the
    device (``COMPILING_BACKENDS``) is on this thread's stack (the compiled function is
    running, its ops on the eager device)."""
    try:
        frame = sys._getframe(1)
        depth = 0
        while frame is not None and depth < _MAX_DEPTH:
            code = frame.f_code
            if code.co_name == "compile_wrapper" and code.co_filename.replace("\\", "/").endswith(
                _EVAL_FRAME
            ):
                return _backend_name(frame.f_locals.get("callback")) is not None
            frame = frame.f_back  # type: ignore[assignment]
            depth += 1
    except Exception:  # a Dynamo whose frames look different: keep the eager rules
        return False
    return False
