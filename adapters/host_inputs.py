"""Model inputs built on the host, as hf-adapters does (SPYRE.md §5).

- The attention mask: transformers casts the 2-D padding mask to bool on the device (an
  integer -> bool cast the device does not allow, rule dtype.cast) and builds causal masks with
  ops that fall back (tril). Here the 4-D additive mask is built on the host with
  ``finfo(dtype).min / 2`` (the device has no -inf) and handed to the model, which uses a 4-D
  mask as given. Padding positions get weight exp(min/2 - max) = 0 exactly as with -inf.
- token_type_ids: when none are passed, BERT gathers them from a buffer (aten::gather is not a
  device op); all-zero ids are built on the host instead.
- RoBERTa-family position ids: cumsum (falls back) over an int cast of ``input_ids != pad``
  (a cast the device refuses); computed on the host with the stock formula.

Each hook runs outside compiled graphs (``torch.compiler.disable``): host work, as on the card.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hfadapt.adapter import adapter

_PROV = {"origin": "hand-written", "author": "hfadapt", "date": "2026-11-30"}
_ROOT = "transformers.modeling_utils:PreTrainedModel"
_FORWARD_ORDER = ("input_ids", "attention_mask", "token_type_ids", "position_ids")


def _get(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    if name in kwargs:
        return kwargs[name]
    idx = _FORWARD_ORDER.index(name)
    return args[idx] if len(args) > idx else None


def _set(
    args: tuple[Any, ...], kwargs: dict[str, Any], name: str, value: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    idx = _FORWARD_ORDER.index(name)
    if name not in kwargs and len(args) > idx:
        args = (*args[:idx], value, *args[idx + 1 :])
    else:
        kwargs = {**kwargs, name: value}
    return args, kwargs


def _model_dtype(module: torch.nn.Module) -> torch.dtype:
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def _is_encoder_root(module: torch.nn.Module, config: Any) -> bool:
    return (
        hasattr(module, "embeddings")
        and not getattr(config, "is_decoder", False)
        and not getattr(config, "is_encoder_decoder", False)
    )


def _is_causal_decoder(config: Any) -> bool:
    causal_types = {"qwen2", "qwen3", "llama", "mistral", "gemma", "gemma2", "gemma3_text"}
    if getattr(config, "use_bidirectional_attention", False):
        return False
    return getattr(config, "model_type", "") in causal_types


def host_attention_mask(mask2d: Tensor, dtype: torch.dtype, causal: bool) -> Tensor:
    """(batch, 1, q, kv) additive mask: 0 where attended, finfo(dtype).min / 2 elsewhere."""
    keep = mask2d.to(torch.bool)[:, None, None, :]
    if causal:
        n = mask2d.shape[-1]
        keep = keep & torch.ones(n, n, dtype=torch.bool).tril()[None, None]
    else:
        keep = keep.expand(-1, 1, mask2d.shape[-1], -1)
    neg = torch.finfo(dtype).min / 2
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, neg)


@torch.compiler.disable
def _mask_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    mask = _get(args, kwargs, "attention_mask")
    if mask is None or mask.ndim != 2:
        return None
    config = module.config
    window = getattr(config, "sliding_window", None)
    if window is not None and mask.shape[-1] > window:
        return None  # a single 4-D mask cannot express per-layer sliding windows: stay stock
    device = mask.device
    built = host_attention_mask(mask.cpu(), _model_dtype(module), _is_causal_decoder(config))
    return _set(args, kwargs, "attention_mask", built.to(device))


def _tiny(model_type: str, seed: int) -> tuple[torch.nn.Module, Tensor, Tensor]:
    """A one-layer model of the family with stick-aligned shapes, and a padded 64-token batch."""
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(
        model_type,
        hidden_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=256,
        vocab_size=96,
        hidden_act="relu",
        max_position_embeddings=130,
        attn_implementation="sdpa",
    )
    model = AutoModel.from_config(cfg).double().eval()
    ids = torch.randint(3, 96, (3, 64))
    mask = torch.ones(3, 64, dtype=torch.long)
    mask[1, 40:] = 0
    mask[2, 5:] = 0
    ids[mask == 0] = cfg.pad_token_id or 0
    return model, ids, mask


def _mask_example(seed: int):
    model, ids, mask = _tiny("bert", seed)
    return (
        model,
        (),
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)},
    )


def _token_type_example(seed: int):
    model, ids, _mask = _tiny("bert", seed)
    return model, (), {"input_ids": ids}


def _position_example(seed: int):
    model, ids, _mask = _tiny("xlm-roberta", seed)
    return model, (), {"input_ids": ids, "token_type_ids": torch.zeros_like(ids)}


@adapter(
    name="attention-mask-host",
    kind="pre_hook",
    target=_ROOT,
    rule="dtype.cast",
    applies=lambda module, config: (
        config is not None and (_is_encoder_root(module, config) or _is_causal_decoder(config))
    ),
    example=_mask_example,
    provenance=_PROV,
)
def attention_mask_host(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Replace the 2-D padding mask by a 4-D additive mask built on the host."""
    return _mask_hook(module, args, kwargs)


@torch.compiler.disable
def _token_type_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if _get(args, kwargs, "token_type_ids") is not None:
        return None
    ids = _get(args, kwargs, "input_ids")
    if ids is None:
        return None
    zeros = torch.zeros(tuple(ids.shape), dtype=torch.long).to(ids.device)
    return _set(args, kwargs, "token_type_ids", zeros)


@adapter(
    name="token-type-ids-host",
    kind="pre_hook",
    target=_ROOT,
    rule="op.unsupported",
    applies=lambda module, config: hasattr(getattr(module, "embeddings", None), "token_type_ids"),
    example=_token_type_example,
    provenance=_PROV,
)
def token_type_ids_host(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """All-zero token_type_ids built on the host instead of gathered from a buffer."""
    return _token_type_hook(module, args, kwargs)


@torch.compiler.disable
def _position_hook(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if _get(args, kwargs, "position_ids") is not None:
        return None
    ids = _get(args, kwargs, "input_ids")
    if ids is None:
        return None
    pad = module.embeddings.padding_idx
    host = ids.cpu().long()
    mask = host.ne(pad).int()
    positions = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + pad
    return _set(args, kwargs, "position_ids", positions.to(ids.device))


@adapter(
    name="position-ids-host",
    kind="pre_hook",
    target=_ROOT,
    rule="dtype.cast",
    applies=lambda module, config: (
        hasattr(getattr(module, "embeddings", None), "padding_idx")
        and hasattr(type(module.embeddings), "create_position_ids_from_input_ids")
    ),
    example=_position_example,
    provenance=_PROV,
)
def position_ids_host(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """RoBERTa-family position ids (padding_idx + running count of real tokens) on the host."""
    return _position_hook(module, args, kwargs)
