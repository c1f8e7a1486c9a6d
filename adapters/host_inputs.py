"""Model inputs built on the host, as hf-adapters does (docs/device-profile.md, "Rewrites").

- token_type_ids: when none are passed, BERT gathers them from a buffer (aten::gather is not a
  device op); all-zero ids are built on the host instead.
- RoBERTa-family position ids: cumsum (falls back) over an int cast of ``input_ids != pad``
  (a cast the device refuses); computed on the host with the stock formula.

Each hook runs outside compiled graphs (``torch.compiler.disable``): host work, as on the card.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import Tensor

from hfadapt.adapters.api import adapter, forward_arg, inline_only, on_host, replace_forward_arg
from hfadapt.adapters.examples import tiny_model

_ROOT = "transformers.modeling_utils:PreTrainedModel"


def _token_type_example(seed: int):
    model, ids, _mask = tiny_model("bert", seed)
    return model, (), {"input_ids": ids}


def _position_example(seed: int):
    model, ids, _mask = tiny_model("xlm-roberta", seed)
    return model, (), {"input_ids": ids, "token_type_ids": torch.zeros_like(ids)}


@torch.compiler.disable
def _token_type_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if forward_arg(module, args, kwargs, "token_type_ids") is not None:
        return None
    ids = forward_arg(module, args, kwargs, "input_ids")
    if ids is None:
        return None
    zeros = on_host(torch.zeros, tuple(ids.shape), dtype=torch.long, back_to=ids.device)
    return replace_forward_arg(module, args, kwargs, "token_type_ids", zeros)


@adapter(
    name="token-type-ids-host",
    kind="pre_hook",
    target=_ROOT,
    rule="op.unsupported",
    applies=lambda module, config: hasattr(getattr(module, "embeddings", None), "token_type_ids"),
    example=_token_type_example,
)
@inline_only  # the host hook does the work: no frame of its own to compile
def token_type_ids_host(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """All-zero token_type_ids built on the host instead of gathered from a buffer."""
    return _token_type_hook(module, args, kwargs)


def _counts_positions(module: torch.nn.Module) -> bool:
    """RoBERTa-style embeddings modules: a padding_idx, position embeddings and
    create_position_ids_from_input_ids, as a method (roberta, xlm-roberta, camembert...) or a
    module function (mpnet). The ids go to the embeddings call only, as the stock code computes
    them there: passed to the whole model, transformers 5.25+ also hands them to the mask
    builder (which reads padded positions as packed sequences) and the encoder."""
    if not hasattr(module, "padding_idx") or not hasattr(module, "position_embeddings"):
        return False
    home = sys.modules.get(type(module).__module__)
    return hasattr(type(module), "create_position_ids_from_input_ids") or hasattr(
        home, "create_position_ids_from_input_ids"
    )


@torch.compiler.disable
def _position_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if forward_arg(module, args, kwargs, "position_ids") is not None:
        return None
    ids = forward_arg(module, args, kwargs, "input_ids")
    if ids is None:
        return None
    positions = on_host(_positions, ids, module.padding_idx, back_to=ids.device)
    return replace_forward_arg(module, args, kwargs, "position_ids", positions)


def _positions(input_ids: Tensor, pad: int) -> Tensor:
    """transformers' create_position_ids_from_input_ids: padding_idx + running count."""
    mask = input_ids.long().ne(pad).int()
    return (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + pad


@adapter(
    name="position-ids-host",
    kind="pre_hook",
    target="torch.nn.modules.module:Module",
    rule="dtype.cast",
    applies=lambda module, config: _counts_positions(module),
    example=_position_example,
    proof="model",  # hooks the embeddings inside the example's model: judged on its output
)
@inline_only
def position_ids_host(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """RoBERTa-family position ids (padding_idx + running count of real tokens) on the host."""
    return _position_hook(module, args, kwargs)
