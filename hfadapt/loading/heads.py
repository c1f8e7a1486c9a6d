"""The modules after a model's transformer (:mod:`hfadapt.loading.pipeline` reads which), built
as one torch module that takes the transformer's token states: Pooling, Dense, Normalize, the
MLM head and SpladePooling of a SparseEncoder, PyLate's token projection, BGE-M3's sparse and
ColBERT heads. With the model's weights, the heads' own files are loaded; in a structural run,
stand-ins of the right shapes are drawn at trained scale. ``attach`` makes a transformer return
what its users get (``PipelineOutput``), so the device runs the whole pipeline in one graph."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import ModelOutput

from hfadapt.loading.pipeline import ACTIVATIONS, Pipeline, PipelineModule
from hfadapt.loading.pooling import PoolingSpec, pool, pooling_mode
from hfadapt.loading.trained_scale import MINILM, draw_trained_scale

if TYPE_CHECKING:
    from hfadapt.loading.load import LoadedModel

__all__ = [
    "HEADS_MASK",
    "HEADS_NAME",
    "BuiltHeads",
    "Heads",
    "PipelineOutput",
    "attach",
    "build_heads",
    "splade_pooling",
]

HEADS_NAME = "sentence_heads"  # the heads' submodule name on an attached transformer
# The input that hands the heads the attention mask in the device dtype, made on the host: the
# card cannot cast an integer tensor to fp16 (the profile's ``dtype.cast``) and its runtime
# prepares masks on the host; a cast inside the forward would split the graph instead.
HEADS_MASK = "sentence_mask"
# SpladePooling's activations (sentence-transformers sparse_encoder/models/SpladePooling.py)
_SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
_SPLADE_STRATEGIES = ("max", "sum")


@dataclass
class PipelineOutput(ModelOutput):
    """A transformer's output with its pipeline's: what sentence-transformers hands users."""

    last_hidden_state: torch.Tensor | None = None
    sentence_embedding: torch.Tensor | None = None  # [batch, dim]
    sparse_embedding: torch.Tensor | None = None  # [batch, vocab] (SPLADE)
    token_weights: torch.Tensor | None = None  # [batch, seq] (BGE-M3 sparse, before the host's max)
    token_vectors: torch.Tensor | None = None  # [batch, seq', dim] (ColBERT / PyLate)


class _GivenStates(nn.Module):
    """Stands in for an MLM model's encoder: hands back the token states it is given."""

    def forward(self, *args: Any, inputs_embeds: Any = None, **kwargs: Any) -> BaseModelOutput:
        return BaseModelOutput(last_hidden_state=inputs_embeds)


class MLMHead(nn.Module):
    """The masked-LM head of ``mlm`` (a ``*ForMaskedLM``), its encoder replaced: token states
    in, vocabulary logits out, through the class's own forward (BERT's ``cls``, RoBERTa's
    ``lm_head``, DistilBERT's ``vocab_*``, ModernBERT's ``head`` + ``decoder``)."""

    def __init__(self, mlm: nn.Module) -> None:
        super().__init__()
        setattr(mlm, str(mlm.base_model_prefix), _GivenStates())
        self.mlm = mlm

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.mlm(inputs_embeds=hidden, attention_mask=mask).logits
        return logits


class DenseLayer(nn.Module):
    """sentence-transformers' Dense: ``activation(linear(x))``."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        self.linear = nn.Linear(
            int(cfg["in_features"]), int(cfg["out_features"]), bias=bool(cfg.get("bias", True))
        )
        act = ACTIVATIONS[str(cfg.get("activation_function", "torch.nn.modules.linear.Identity"))]
        self.activation: nn.Module = {
            "identity": nn.Identity,
            "tanh": nn.Tanh,
            "relu": nn.ReLU,
            "gelu": nn.GELU,
            "sigmoid": nn.Sigmoid,
            "silu": nn.SiLU,
        }[act]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.activation(self.linear(x))
        return out


def splade_pooling(cfg: dict[str, Any]) -> nn.Module:
    """sentence-transformers' own SpladePooling with the model's config: the code SparseEncoder
    users run (``log1p(relu(logits * mask))``, max or sum over the tokens), not a copy of it."""
    from sentence_transformers.sparse_encoder.modules.splade_pooling import SpladePooling

    module: nn.Module = SpladePooling(
        pooling_strategy=cfg.get("pooling_strategy", "max"),
        activation_function=cfg.get("activation_function", "relu"),
        embedding_dimension=cfg.get("embedding_dimension", cfg.get("word_embedding_dimension")),
    )
    return module


class Heads(nn.Module):
    """The built modules, run in the module list's order on the transformer's token states."""

    def __init__(self, steps: list[tuple[str, str, dict[str, object]]], multi_vector: bool) -> None:
        super().__init__()
        self.steps = tuple((kind, key, dict(cfg)) for kind, key, cfg in steps)
        self.multi_vector = multi_vector
        self.built = nn.ModuleDict()
        # the mask of the current call, in the device dtype, handed over by ``attach``'s hooks
        # (under "mask"): a dict, as mutating the module itself in a compiled call would make
        # Dynamo name its submodules through ``__dict__`` (``sentence_heads.__dict__._modules``)
        self.given: dict[str, torch.Tensor | None] = {}

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        tokens, sentence, out = hidden, None, {}
        for kind, key, cfg in self.steps:
            if kind == "pooling":
                sentence = pool(tokens, mask, PoolingSpec(mode=pooling_mode(cfg) or "mean"))
            elif kind == "dense" and sentence is not None:
                sentence = self.built[key](sentence)
            elif kind == "dense":
                tokens = self.built[key](tokens)
            elif kind == "normalize" and sentence is not None:
                sentence = nn.functional.normalize(sentence, p=2.0, dim=-1)
            elif kind == "normalize":
                tokens = nn.functional.normalize(tokens, p=2.0, dim=-1)
            elif kind == "splade_pooling":
                logits = self.built["mlm_head"](tokens, mask)
                features = {"token_embeddings": logits, "attention_mask": mask}
                out["sparse_embedding"] = self.built[key](features)["sentence_embedding"]
            elif kind == "m3_sparse":
                out["token_weights"] = torch.relu(self.built[key](hidden)).squeeze(-1)
            elif kind == "m3_colbert":
                # masked, then the first token dropped: slicing the [batch, seq] mask at offset 1
                # would slice its stick dimension (layout.stick_slice); a token slice is not one
                vectors = (self.built[key](hidden) * mask.to(hidden.dtype).unsqueeze(-1))[:, 1:]
                out["token_vectors"] = nn.functional.normalize(vectors, p=2.0, dim=-1)
        if sentence is not None:
            out["sentence_embedding"] = sentence
        if self.multi_vector and "token_vectors" not in out:  # PyLate normalizes every token
            out["token_vectors"] = nn.functional.normalize(tokens, p=2.0, dim=-1)
        return out


@dataclass
class BuiltHeads:
    """The heads of one model, and what of its module list they cover."""

    pipeline: Pipeline
    heads: Heads | None
    built: list[str] = field(default_factory=list)  # module labels built (run on the device)
    left_out: list[dict[str, str]] = field(default_factory=list)  # {"module", "why"}
    weights: str = "none"  # "model files", "stand-in (seed N)", or "none"

    def outputs(self) -> list[str]:
        """The outputs the heads give: what the verdict judges beyond the token states."""
        if self.heads is None:
            return []
        kinds = {k for k, _, _ in self.heads.steps}
        names = []
        if kinds & {"pooling"}:
            names.append("sentence_embedding")
        if "splade_pooling" in kinds:
            names.append("sparse_embedding")
        if "m3_sparse" in kinds:
            names.append("token_weights")
        if "m3_colbert" in kinds or self.heads.multi_vector:
            names.append("token_vectors")
        return names


class HeadUnavailable(Exception):
    """A head that cannot be built: the reason, recorded in the run's evidence."""


def _state_file(folder: Path) -> Path | None:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    return None


def _load_state(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return dict(load_file(str(path)))
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise HeadUnavailable(
            f"{path.name} does not load: {' '.join(str(exc).split())[:120]}"
        ) from exc
    if not isinstance(state, dict):
        raise HeadUnavailable(f"{path.name} holds no state dict")
    return state


def _fill(module: nn.Module, state: dict[str, torch.Tensor], where: str) -> None:
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise HeadUnavailable(
            f"{where} does not fit its config: {str(exc).splitlines()[0]}"
        ) from exc


def _linear(in_features: int, out_features: int) -> nn.Linear:
    return nn.Linear(in_features, out_features, bias=True)


def _mlm_head(loaded: LoadedModel, structural: bool, seed: int) -> MLMHead:
    from transformers import AutoModelForMaskedLM

    from hfadapt.loading.load import quiet_transformers

    with quiet_transformers():
        if structural:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                mlm = AutoModelForMaskedLM.from_config(loaded.config, dtype=torch.float32)
            draw_trained_scale(mlm, seed, MINILM, getattr(loaded.config, "vocab_size", None))
            out, table = mlm.get_output_embeddings(), loaded.model.get_input_embeddings()
            if out is not None and table is not None and out.weight.shape == table.weight.shape:
                with torch.no_grad():  # SPLADE's decoder is tied to the word embeddings
                    out.weight.copy_(table.weight)
        elif loaded.path is None:
            raise HeadUnavailable("no model folder to read the MLM head from")
        else:
            try:
                mlm = AutoModelForMaskedLM.from_pretrained(
                    loaded.path, dtype=torch.float32, use_kernels=False
                )
            except Exception as exc:
                why = " ".join(str(exc).split())[:160]
                raise HeadUnavailable(f"the masked-LM head does not load: {why}") from exc
    return MLMHead(mlm.eval())


def _build_one(
    module: PipelineModule, loaded: LoadedModel, hidden: int, structural: bool, seed: int
) -> nn.Module | None:
    """The torch module of one pipeline entry (None: it has no weights, e.g. Pooling)."""
    folder = Path(loaded.path) if loaded.path else None
    if module.kind == "dense":
        layer: nn.Module = DenseLayer(module.config)
        if structural:
            draw_trained_scale(layer, seed, MINILM)
            return layer
        state = _state_file(folder / module.name) if folder is not None else None
        if state is None:
            raise HeadUnavailable(
                f"no weights in {module.name}/ (model.safetensors or pytorch_model.bin)"
            )
        _fill(layer, _load_state(state), f"{module.name}/{state.name}")
        return layer
    if module.kind in ("m3_sparse", "m3_colbert"):
        layer = _linear(hidden, 1 if module.kind == "m3_sparse" else hidden)
        if structural:
            draw_trained_scale(layer, seed, MINILM)
            return layer
        path = folder / f"{module.name}.pt" if folder is not None else None
        if path is None or not path.is_file():
            raise HeadUnavailable(f"no {module.name}.pt beside the weights")
        _fill(layer, _load_state(path), path.name)
        return layer
    if module.kind == "splade_pooling":
        cfg = module.config
        if cfg.get("activation_function", "relu") not in _SPLADE_ACTIVATIONS:
            raise HeadUnavailable(
                f"SpladePooling activation {cfg.get('activation_function')!r} is not built"
            )
        if cfg.get("pooling_strategy", "max") not in _SPLADE_STRATEGIES:
            raise HeadUnavailable(
                f"SpladePooling strategy {cfg.get('pooling_strategy')!r} is not built"
            )
        return _mlm_head(loaded, structural, seed)
    return None


def _hidden_size(loaded: LoadedModel) -> int:
    table = (
        loaded.model.get_input_embeddings()
        if hasattr(loaded.model, "get_input_embeddings")
        else None
    )
    size = getattr(loaded.config, "hidden_size", None) or getattr(loaded.config, "dim", None)
    if isinstance(size, int):
        return size
    return int(table.weight.shape[1]) if table is not None else 0


def build_heads(loaded: LoadedModel, pipeline: Pipeline, seed: int = 0) -> BuiltHeads:
    """The heads of ``loaded`` (a ``LoadedModel``) as its ``pipeline`` declares them: real
    weights from its folder, or seeded stand-ins in a structural run. A module that cannot be
    built is left out with its reason, and so is everything after it on its path."""
    structural = bool(loaded.structural)
    result = BuiltHeads(
        pipeline, None, weights=f"stand-in (seed {seed})" if structural else "model files"
    )
    steps: list[tuple[str, str, dict[str, Any]]] = []
    modules: dict[str, nn.Module] = {}
    broken: str | None = None  # the first module not built: what follows it cannot run
    hidden = _hidden_size(loaded)
    for module in pipeline.modules:
        if module.kind in ("transformer", "mlm_transformer"):
            continue
        if module.kind == "unsupported":
            result.left_out.append({"module": module.label(), "why": module.why_not or ""})
            broken = broken or module.label()
            continue
        if broken is not None and module.kind not in ("m3_sparse", "m3_colbert"):
            result.left_out.append(
                {"module": module.label(), "why": f"follows {broken}, which is not built"}
            )
            continue
        try:
            built = _build_one(module, loaded, hidden, structural, seed)
        except HeadUnavailable as exc:
            result.left_out.append({"module": module.label(), "why": str(exc)})
            broken = broken or module.label()
            continue
        key = module.name or module.kind
        if module.kind == "splade_pooling" and built is not None:
            modules["mlm_head"] = built  # the logits SpladePooling pools
            built = splade_pooling(module.config)
        if built is not None:
            modules[key] = built
        steps.append((module.kind, key, module.config))
        result.built.append(module.label())
    if steps or pipeline.multi_vector:
        heads = Heads(steps, pipeline.multi_vector and broken is None)
        for key, mod in modules.items():
            heads.built[key] = mod
        result.heads = heads.eval()
    return result


def _token_states(out: Any) -> torch.Tensor:
    value = out if isinstance(out, torch.Tensor) else getattr(out, "last_hidden_state", None)
    if value is None:
        value = out[0]
    return value


def _take_heads_mask(
    model: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
) -> tuple[tuple[object, ...], dict[str, object]]:
    """Forward pre-hook: the HEADS_MASK input taken out of the model's inputs (its forward
    never sees it) and handed to the heads for this call (None: the attention mask is used)."""
    getattr(model, HEADS_NAME).given["mask"] = kwargs.get(HEADS_MASK)  # every call: never stale
    if HEADS_MASK not in kwargs:
        return args, kwargs
    return args, {k: v for k, v in kwargs.items() if k != HEADS_MASK}


def _run_heads(
    model: nn.Module, args: tuple[object, ...], kwargs: dict[str, object], output: object
) -> PipelineOutput:
    """Forward hook: the heads run on the model's token states, in the model's call (and so in
    its compiled graph); the output is what users get."""
    heads = getattr(model, HEADS_NAME)
    hidden = _token_states(output)
    mask = heads.given.pop("mask", None)
    if mask is None:
        mask = kwargs.get("attention_mask")
    if mask is None:
        mask = torch.ones(hidden.shape[:2], dtype=hidden.dtype, device=hidden.device)
    return PipelineOutput(last_hidden_state=hidden, **heads(hidden, mask))


def attach(model: nn.Module, heads: Heads) -> nn.Module:
    """Make ``model`` (a transformer instance, changed in place) run ``heads`` after itself and
    return a ``PipelineOutput``. The heads sit under HEADS_NAME and take the mask from the
    HEADS_MASK input (else the attention mask). They run from forward hooks: the model keeps
    its class and its forward, so every adapter matches it exactly as without heads (the
    mask adapter reads the builders ``type(model).forward`` calls), its submodule names stay,
    and a deep copy stays attached (the hooks are the module's own, module-level functions)."""
    attached = HEADS_NAME in model._modules
    model.add_module(HEADS_NAME, heads)
    if attached:  # attached before: the new heads replace the old, run by the same hooks
        return model
    model.register_forward_pre_hook(_take_heads_mask, with_kwargs=True, prepend=True)
    model.register_forward_hook(_run_heads, with_kwargs=True)
    return model
