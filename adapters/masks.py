"""Attention masks built on the host with the model's own mask code.

On the device, transformers' mask builders cast the 2-D padding mask to bool (an integer ->
bool cast the device refuses, rule dtype.cast), index with tensors (aten::index, unsupported)
and reduce with aten::all (unsupported); causal masks need tril (falls back). This adapter runs
the model's forward with each ``create_*_mask`` function replaced by one that calls the stock
function on the host (sdpa form: a boolean 4-D mask), turns it into an additive mask with
``MASKED`` (fp16's ``finfo.min / 2``, hf-adapters' value, for every dtype: the device has no
-inf, and bf16's own finfo.min / 2 is past DL16's range) and sends it over.
Sliding windows, causal and bidirectional variants all come from the stock code, so every
architecture gets exactly the mask it would have had. A masked position gets weight
exp(min/2 - max) = 0, as with -inf.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from hfadapt.adapters.api import (
    MASKED,
    adapter,
    globals_read,
    inline_only,
    innermost,
    on_host,
    rebind,
    stock_method,
)
from hfadapt.adapters.examples import tiny_model

MASK_BUILDERS = (
    "create_causal_mask",
    "create_bidirectional_mask",
    "create_sliding_window_causal_mask",
    "create_bidirectional_sliding_window_mask",
    "create_chunked_causal_mask",
)
_HOST_BUILDERS: dict[int, Callable[..., Any]] = {}


def _host_builder(stock: Callable[..., Any]) -> Callable[..., Any]:
    found = _HOST_BUILDERS.get(id(stock))
    if found is not None:
        return found

    @torch.compiler.disable
    def build_on_host(*args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("config", args[0] if args else None)
        embeds = kwargs.get("inputs_embeds")
        if config is None or embeds is None:
            return stock(*args, **kwargs)
        host_config = copy.copy(config)
        host_config.__dict__["_attn_implementation_internal"] = "sdpa"
        dtype = embeds.dtype
        # Only the shapes of the embeddings matter to a mask builder: empty stand-ins.
        stand_ins = {"config": host_config, "inputs_embeds": _shape_only(embeds, dtype)}
        if kwargs.get("encoder_hidden_states") is not None:
            stand_ins["encoder_hidden_states"] = _shape_only(kwargs["encoder_hidden_states"], dtype)
        host_kwargs = {**kwargs, **stand_ins}
        return on_host(_additive_mask, stock, dtype, back_to=embeds.device, **host_kwargs)

    build_on_host.__wrapped__ = stock  # type: ignore[attr-defined]
    _HOST_BUILDERS[id(stock)] = build_on_host
    return build_on_host


def _shape_only(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty((*t.shape[:2], 0), dtype=dtype)


def _additive_mask(stock: Callable[..., Any], dtype: torch.dtype, **kwargs: Any) -> Any:
    """The stock builder's mask as an additive ``dtype`` mask (masked: ``MASKED``, -32752)."""
    mask = stock(**kwargs)
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, MASKED)
    return mask.to(dtype).clamp(min=MASKED)


def _builders_of(module: torch.nn.Module, method: str) -> dict[str, Callable[..., Any]]:
    """The mask builders the class's ``method`` reads from its module's globals, each swapped
    for its host version (none: the adapter would change nothing there, so it does not apply)."""
    stock = getattr(type(module), method, None)
    if stock is None:
        return {}
    home = innermost(stock).__globals__
    reads = globals_read(stock)
    return {
        name: _host_builder(home[name]) for name in MASK_BUILDERS if name in reads and name in home
    }


@torch.compiler.disable
def _with_host_masks(module: torch.nn.Module, method: str) -> Callable[..., Any]:
    """The stock ``method`` of the module's class with its mask builders swapped for their host
    versions. Resolved outside compiled graphs: the first call builds closures and fills this
    file's cache, which Dynamo must not trace (it raised KeyError taking the id of a closure it
    had made itself, depending on which test compiled first)."""
    return rebind(stock_method(type(module), method), **_builders_of(module, method))


def _example(seed: int):
    model, ids, mask = tiny_model("bert", seed)
    return (
        model,
        (),
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)},
    )


def _example_direct(seed: int):
    """A model whose forward calls the mask builders itself (the example above uses a helper)."""
    model, ids, mask = tiny_model(
        "qwen3", seed, num_key_value_heads=1, head_dim=64, use_cache=False
    )
    return model, (), {"input_ids": ids, "attention_mask": mask}


@adapter(
    name="attention-mask-host",
    target="transformers.modeling_utils:PreTrainedModel.forward",
    rule="dtype.cast",
    applies=lambda module, config: config is not None and bool(_builders_of(module, "forward")),
    example=_example_direct,
    proof="model",
)
@inline_only  # routes the call to the rebound forward: no frame of its own to compile
def masks_on_host(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The model's own forward, with its mask builders running on the host."""
    return _with_host_masks(self, "forward")(self, *args, **kwargs)


@adapter(
    name="attention-mask-host-helper",
    target="transformers.modeling_utils:PreTrainedModel._create_attention_masks",
    rule="dtype.cast",
    applies=lambda module, config: bool(_builders_of(module, "_create_attention_masks")),
    example=_example,
    proof="model",
)
@inline_only
def mask_helper_on_host(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """BERT-family models build masks in a helper method: the same swap there."""
    return _with_host_masks(self, "_create_attention_masks")(self, *args, **kwargs)
