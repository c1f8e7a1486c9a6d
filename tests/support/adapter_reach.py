"""Whether each bundled adapter's code actually runs: every adapter applied to its own example
(one per family for the per-family adapters: ten RoPE families, seven RMSNorm ones), run
eagerly or compiled (Dynamo with the aot_eager backend, on the CPU: the tracing is what a
hub-kernel wrapper or a guard on the wrong scope breaks), with call counters on the adapter's
function and on every name a ``rebind`` swaps (the rewritten code, not just the wrapper).

Run in a fresh process by tests/adapters/test_adapter_reach.py, with the ``kernels`` package
present or hidden (transformers then decorates its helpers differently):
``python -c "from support.adapter_reach import main; main()" compile|eager|compile,eager
[hide-kernels]``; prints one JSON object per adapter and execution. One process walks the
executions in the order given: the compile walk first (as cold as in a process of its own),
then the eager walk on fresh examples, with Dynamo reset and rebind's cache emptied between
them. The fresh process is for the ``kernels`` state, which transformers fixes at import."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

COUNTS: dict[str, int] = {}
MADE: set[str] = set()  # the counter labels of every swap rebind built


def _counter(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        COUNTS[label] = COUNTS.get(label, 0) + 1
        return fn(*args, **kwargs)

    return counted


def _count_rebinds() -> None:
    """Every swap ``rebind`` builds from now on calls through a counter."""
    import torch

    from hfadapt.adapters import rebind as rb

    build = rb._build

    @torch.compiler.disable
    def counting_build(key: Any, fn: Any, replacements: dict[str, Any]) -> Any:
        where = rb.innermost(fn).__qualname__
        wrapped = {}
        for name, value in replacements.items():
            if isinstance(value, (types.FunctionType, torch.nn.Module)):
                label = f"{where}: {name}"
                MADE.add(label)
                value = _counter(label, value)
            wrapped[name] = value
        return build(key, fn, wrapped)

    rb._CACHE.clear()
    rb._build = counting_build


def _example(a: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any], str | None]:
    """(module to apply to, args, kwargs, the method to call: None for the module itself): the
    adapter's own example; an attention function's example is one call of it, so those run a
    tiny BERT instead."""
    from hfadapt.adapters.examples import tiny_model

    if a.kind == "attention":
        from hfadapt.adapters.registry import Registry

        for heads in (2, 4):  # head size 64 (on a stick) and 32 (off it)
            model, ids, mask = tiny_model("bert", 0, num_attention_heads=heads)
            if Registry(adapters=[a]).matches(model):
                break
        return model, (), {"input_ids": ids, "attention_mask": mask}, None
    module, args, kwargs = a.example(0)
    whole = a.kind == "pre_hook" or a.proof == "model" or a.method_name == "forward"
    return module, args, kwargs, None if whole else a.method_name


def _run(call: Any, args: tuple[Any, ...], kwargs: dict[str, Any], execution: str) -> None:
    import torch

    if execution == "compile":
        torch._dynamo.reset()
        call = torch.compile(call, backend="aot_eager")
    with torch.no_grad():
        call(*args, **kwargs)


def reach(a: Any, execution: str) -> dict[str, Any]:
    """One adapter on its example: applied? its function's calls, and each swap's calls."""
    from hfadapt.adapters.registry import Registry
    from hfadapt.spyre.frames import inline_only

    out: dict[str, Any] = {"adapter": a.name, "execution": execution}
    label = f"adapter {a.name}"
    counted = dataclasses.replace(a, fn=inline_only(_counter(label, a.fn)))
    module, args, kwargs, method = _example(a)
    COUNTS.clear()
    MADE.clear()  # swaps may be built while applying (the RoPE adapters build theirs then)
    handle = Registry(adapters=[counted]).apply(module, device="spyre")
    out["applied"] = a.name in handle.applied
    call = module if method is None else getattr(module, method)  # the patched method
    try:
        _run(call, args, kwargs, execution)
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    out["calls"] = COUNTS.get(label, 0)
    out["swaps"] = {k: COUNTS.get(k, 0) for k in sorted(MADE)}
    return out


def main() -> None:
    executions = sys.argv[1].split(",")
    unknown = [e for e in executions if e not in ("eager", "compile")]
    if unknown:
        raise SystemExit(f"unknown execution {unknown}: compile, eager or compile,eager")
    if "hide-kernels" in sys.argv[2:]:
        sys.modules["kernels"] = None  # type: ignore[assignment]  # find_spec: not installed
    warnings.simplefilter("ignore")
    import torch
    import transformers

    from hfadapt.adapters.registry import default_registry

    torch.manual_seed(0)
    torch.set_num_threads(1)
    _count_rebinds()
    from transformers.utils.import_utils import is_kernels_available

    kernels = is_kernels_available()
    print(json.dumps({"transformers": transformers.__version__, "kernels": kernels}))
    from hfadapt.adapters import rebind as rb

    for execution in executions:
        torch._dynamo.reset()  # nothing of one walk's compiles left for the next
        rb._CACHE.clear()  # each walk builds its own swaps
        for a in default_registry().adapters:
            if a.source == "bundled" and a.example is not None:
                print(json.dumps(reach(a, execution)), flush=True)


if __name__ == "__main__":
    main()
