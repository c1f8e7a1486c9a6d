"""The end-of-sequence pooler of CLIP-type text towers (CLIP, MetaCLIP 2), on the host.

The text model's forward pools the hidden state of each sequence's first end-of-sequence token:
``last_hidden_state[arange(B), (input_ids.to(int32) == eos).int().argmax(-1)]``
(transformers 5.25 ``modeling_clip.py`` CLIPTextModel.forward; ``modeling_metaclip_2.py``
MetaClip2TextModel.forward, lines 487-490). On the device that is an int64 -> int32 and a
bool -> int32 cast (rule dtype.cast), argmax (falls back) and ``aten::index`` with tensors (not
a device op, rule op.unsupported). Those few integer ops and one row gather per sequence are
host work, as hf-adapters does with every index computation.

The adapter is the text model's forward, step by step as the stock one: embeddings, the causal
mask (the model's own ``create_causal_mask``, run on the host and made additive with ``MASKED``,
as adapters/masks.py does; this forward replaces the one that adapter rebinds), the encoder,
the final LayerNorm on the device; then the EOS positions and the gather of one row per
sequence on the host, with the stock formula, including CLIP's pre-#24773 rule (an
``eos_token_id`` of 2: the position of the largest token id). A gather copies values, so the
pooled output is the device's own last hidden state at those rows, bit for bit. It is exact:
the float64 proof compares ``last_hidden_state`` and ``pooler_output`` with the stock forward.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

import torch
from torch import Tensor

from hfadapt.adapters.api import MASKED, adapter, innermost, on_host, stock_method


class EosPooledText(NamedTuple):
    """A text model class whose forward pools at the first end-of-sequence token."""

    module: str
    cls: str
    legacy_eos_2: bool  # CLIP: eos_token_id == 2 pools at the largest token id instead


EOS_POOLED_TEXT: dict[str, EosPooledText] = {
    "clip": EosPooledText("transformers.models.clip.modeling_clip", "CLIPTextModel", True),
    "metaclip-2": EosPooledText(
        "transformers.models.metaclip_2.modeling_metaclip_2", "MetaClip2TextModel", False
    ),
}


def eos_positions(input_ids: Tensor, eos_token_id: int, legacy_eos_2: bool) -> Tensor:
    """Each sequence's pooled position, with the stock formula (int32 ids, as the stock code
    casts them before argmax)."""
    ids = input_ids.to(dtype=torch.int)
    if legacy_eos_2 and eos_token_id == 2:
        return ids.argmax(dim=-1)
    return (ids == eos_token_id).int().argmax(dim=-1)


def _pool(last_hidden_state: Tensor, input_ids: Tensor, eos: int, legacy: bool) -> Tensor:
    rows = torch.arange(last_hidden_state.shape[0])
    return last_hidden_state[rows, eos_positions(input_ids, eos, legacy)]


def _additive_causal_mask(builder: Any, dtype: torch.dtype, **kwargs: Any) -> Tensor | None:
    """The model's causal mask builder in its sdpa (boolean) form, made additive in ``dtype``."""
    mask = builder(**kwargs)
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, MASKED)
    return mask.to(dtype).clamp(min=MASKED)


@torch.compiler.disable
def _causal_mask_on_host(model: torch.nn.Module, embeds: Tensor, attention_mask: Any) -> Any:
    builder = innermost(stock_method(type(model), "forward")).__globals__["create_causal_mask"]
    host_config = copy.copy(model.config)
    host_config.__dict__["_attn_implementation_internal"] = "sdpa"
    shape_only = torch.empty((*embeds.shape[:2], 0), dtype=embeds.dtype)
    return on_host(
        _additive_causal_mask,
        builder,
        embeds.dtype,
        back_to=embeds.device,
        config=host_config,
        inputs_embeds=shape_only,
        attention_mask=attention_mask,
        cache=None,
    )


def _text_forward(legacy: bool) -> Any:
    from transformers.modeling_outputs import BaseModelOutputWithPooling
    from transformers.utils.generic import merge_with_config_defaults
    from transformers.utils.output_capturing import capture_outputs

    def forward(
        self: torch.nn.Module,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        if input_ids is None:
            raise ValueError("You have to specify input_ids")
        input_ids = input_ids.view(-1, input_ids.shape[-1])
        hidden_states = self.embeddings(input_ids=input_ids, position_ids=position_ids)
        mask = _causal_mask_on_host(self, hidden_states, attention_mask)
        kwargs.pop("is_causal", None)
        encoded = self.encoder(
            inputs_embeds=hidden_states, attention_mask=mask, is_causal=True, **kwargs
        )
        last_hidden_state = self.final_layer_norm(encoded.last_hidden_state)
        pooled = on_host(
            _pool,
            last_hidden_state,
            input_ids,
            int(self.eos_token_id),
            legacy,
            back_to=last_hidden_state.device,
        )
        return BaseModelOutputWithPooling(last_hidden_state=last_hidden_state, pooler_output=pooled)

    # the stock forward's own decorators: config defaults, hidden states and attentions
    # collected by hooks, tuple or ModelOutput as asked
    return merge_with_config_defaults(capture_outputs(tie_last_hidden_states=False)(forward))


def _text_config(family: str, seed: int) -> Any:
    """A one-layer text config with stick-aligned shapes; CLIP's odd seeds use eos 2 (the
    legacy rule), every other example a real EOS id."""
    fields: dict[str, Any] = {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "vocab_size": 96,
        "max_position_embeddings": 77,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2 if family == "clip" and seed % 2 else 95,
        "attn_implementation": "sdpa",
    }
    if family == "clip":
        from transformers import CLIPTextConfig

        return CLIPTextConfig(**fields)
    from transformers import MetaClip2TextConfig

    return MetaClip2TextConfig(**fields)


def text_example(family: str, seed: int) -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
    """A tiny text model of ``family`` and a padded 64-token batch whose rows end at different
    lengths, each with its end-of-sequence token (rows 1 and 2 also hold it earlier, to pool at
    the first one), in float64."""
    import transformers

    config = _text_config(family, seed)
    torch.manual_seed(seed)
    model = getattr(transformers, EOS_POOLED_TEXT[family].cls)(config).double().eval()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 95, (3, 64), generator=g)
    mask = torch.ones(3, 64, dtype=torch.long)
    for row, length in enumerate((64, 40, 5)):
        ids[row, length - 1] = config.eos_token_id
        ids[row, length:] = config.pad_token_id
        mask[row, length:] = 0
    ids[1, 17] = config.eos_token_id
    ids[2, 2] = config.eos_token_id
    return model, (), {"input_ids": ids, "attention_mask": mask}


def _register(family: str, text: EosPooledText) -> None:
    forward = _text_forward(text.legacy_eos_2)

    def example(seed: int) -> tuple[torch.nn.Module, tuple[Any, ...], dict[str, Any]]:
        return text_example(family, seed)

    @adapter(
        name=f"text-eos-pool-host-{family}",
        target=f"{text.module}:{text.cls}.forward",
        rule="op.unsupported",
        example=example,
        # applied after attention-mask-host (priority 100), whose rebound forward it replaces
        priority=105,
    )
    def eos_pool_on_host(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        """The text model's forward with its mask and its EOS pooling on the host."""
        return forward(self, *args, **kwargs)


for _family, _text in EOS_POOLED_TEXT.items():
    _register(_family, _text)
