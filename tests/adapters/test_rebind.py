"""``rebind`` sees through transformers' hub-kernel wrappers and refuses, loudly, a swap that
could not take effect (a target it cannot see into, a name the stock code never reads)."""

from __future__ import annotations

import functools
import types
from typing import Any

import pytest
import torch

from hfadapt.adapters.rebind import globals_read, innermost, rebind
from hfadapt.errors import AdapterError


def _double(x: Any) -> Any:
    return x * 2


def _stock(x: Any) -> Any:
    return _double(x) + 1


def _triple(x: Any) -> Any:
    return x * 3


def _hub_kernel_func(fn: Any) -> torch.nn.Module:
    """What kernels' ``use_kernel_forward_from_hub`` makes of a function: an ``nn.Module``
    instance whose class forward calls the function it closes over."""
    try:
        from kernels import use_kernel_forward_from_hub
    except ImportError:
        pytest.skip("the kernels package is not installed")
    wrapped: torch.nn.Module = use_kernel_forward_from_hub("test_func")(fn)
    return wrapped


def test_a_hub_kernel_func_is_rebound_through_to_its_stock_function() -> None:
    func = _hub_kernel_func(_stock)
    assert isinstance(func, torch.nn.Module), f"kernels made a {type(func)}"
    swapped = rebind(func, _double=_triple)
    got = swapped(torch.tensor(2.0)).item()
    assert isinstance(swapped, types.FunctionType), f"rebind gave a {type(swapped)}"
    assert got == 7.0, f"the swap did not take effect: {got} (stock gives 5.0)"
    assert func(torch.tensor(2.0)).item() == 5.0, "the original changed"
    assert innermost(func) is _stock


def test_a_wraps_chain_is_rebound_down_to_the_wrapped_function() -> None:
    def deco(f: Any) -> Any:
        @functools.wraps(f)
        def wrapper(*a: Any) -> Any:
            return f(*a)

        return wrapper

    chained = deco(deco(_stock))
    assert rebind(chained, _double=_triple)(2) == 7, "the swap did not reach the inner code"
    assert "_double" in globals_read(chained)


def test_a_name_the_stock_code_never_reads_is_refused() -> None:
    with pytest.raises(AdapterError, match=r"never reads rotate_half") as err:
        rebind(_stock, rotate_half=_triple)
    assert "\n" not in str(err.value), f"not one line: {err.value!r}"


def test_a_target_it_cannot_see_into_is_refused() -> None:
    class Opaque:
        def __call__(self, x: Any) -> Any:
            return _double(x)

    with pytest.raises(AdapterError, match=r"cannot take effect"):
        rebind(Opaque(), _double=_triple)
    with pytest.raises(AdapterError, match=r"cannot take effect"):
        rebind(functools.partial(_stock), _double=_triple)


def test_the_copies_globals_are_guarded_as_themselves_under_compile() -> None:
    """Dynamo guards an inlined function's globals through the module named by their
    ``__name__``: a copy that kept it was guarded against the stock module's values."""
    swapped = rebind(_stock, _double=_triple)
    assert "__name__" not in swapped.__globals__
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: swapped(x), backend="eager", fullgraph=True)
    x = torch.tensor([1.0, 2.0])
    got = compiled(x).tolist()
    assert got == [4.0, 7.0], f"compiled copy gave {got}, want x*3+1 = [4.0, 7.0]"
