"""The module list a sentence-transformers model declares (``modules.json``): what runs after its
transformer, read as data. Pooling, Dense, Normalize; SparseEncoder's MLM head and SpladePooling;
PyLate's token projection (multi-vector); FlagEmbedding's BGE-M3 sparse and ColBERT heads
(``sparse_linear.pt``, ``colbert_linear.pt`` beside the weights). A module type hfadapt does not
build is kept by name with the reason, never dropped. No torch here: reports read these."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ACTIVATIONS",
    "M3_FILES",
    "M3_REPOS",
    "Pipeline",
    "PipelineModule",
    "head_files",
    "read_pipeline",
]

# ST Dense names its activation by import path; only these are built (anything else would mean
# importing a string from the model's files: never done).
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.SiLU": "silu",
}
# FlagEmbedding's BGEM3 loads these from the repository root (FlagEmbedding
# inference/embedder/encoder_only/m3.py): colbert_linear hidden -> hidden, sparse_linear hidden -> 1.
M3_FILES = ("sparse_linear.pt", "colbert_linear.pt")
# Repositories known to ship them, for a structural run whose folder holds only config.json
# (the Hub's BAAI/bge-m3 lists both files beside pytorch_model.bin).
M3_REPOS = frozenset({"BAAI/bge-m3"})

# module kinds, by the last component of the ST type name
_KINDS = {
    "Transformer": "transformer",
    "MLMTransformer": "mlm_transformer",
    "Pooling": "pooling",
    "Dense": "dense",
    "Normalize": "normalize",
    "SpladePooling": "splade_pooling",
}


@dataclass(frozen=True)
class PipelineModule:
    """One entry of the module list: its folder name, ST type, kind and its own config."""

    name: str  # the folder (``2_Dense``) or ``name`` of modules.json; "" for the transformer
    type: str  # as modules.json spells it
    kind: str  # transformer, mlm_transformer, pooling, dense, normalize, splade_pooling,
    # m3_sparse, m3_colbert, or unsupported
    config: dict[str, Any] = field(default_factory=dict)
    why_not: str | None = None  # set for a module that is not built: the reason

    def label(self) -> str:
        short = self.type.rsplit(".", 1)[-1] if self.type else self.kind
        return f"{self.name}:{short}" if self.name else short

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "type": self.type, "kind": self.kind}
        if self.why_not:
            out["why_not"] = self.why_not
        return out


@dataclass(frozen=True)
class Pipeline:
    """What a model's users run: the transformer, then these modules, in order."""

    modules: tuple[PipelineModule, ...] = ()
    source: str = "none"  # "modules.json", or "none" when the model declares no module list
    multi_vector: bool = False  # PyLate / ColBERT: the output is one vector per token

    @property
    def declared(self) -> bool:
        return self.source != "none"

    def unsupported(self) -> list[PipelineModule]:
        return [m for m in self.modules if m.kind == "unsupported"]

    def heads(self) -> list[PipelineModule]:
        """Every module after the transformer that hfadapt builds."""
        return [
            m
            for m in self.modules
            if m.kind not in ("transformer", "mlm_transformer", "unsupported")
        ]

    @property
    def sparse(self) -> bool:
        return any(m.kind in ("splade_pooling", "m3_sparse") for m in self.modules)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _module(root: Path, entry: dict[str, object]) -> PipelineModule:
    kind_name = str(entry.get("type", ""))
    path = str(entry.get("path") or "")
    name = path or ("" if str(entry.get("idx", "")) == "0" else str(entry.get("name", "")))
    kind = _KINDS.get(kind_name.rsplit(".", 1)[-1])
    config = _read_json(root / path / "config.json") if path else None
    config = config if isinstance(config, dict) else {}
    if kind is None:
        why = f"module type {kind_name or '(none)'} is not one hfadapt builds"
        return PipelineModule(name, kind_name, "unsupported", config, why)
    if kind == "dense":
        act = str(config.get("activation_function", "torch.nn.modules.linear.Identity"))
        missing = [k for k in ("in_features", "out_features") if not isinstance(config.get(k), int)]
        if missing:
            why = f"its config.json has no {missing[0]}"
            return PipelineModule(name, kind_name, "unsupported", config, why)
        if act not in ACTIVATIONS:
            why = f"activation {act} is not one hfadapt builds (it would import the model's string)"
            return PipelineModule(name, kind_name, "unsupported", config, why)
    return PipelineModule(name, kind_name, kind, config)


def _multi_vector(root: Path, types: list[str]) -> bool:
    st = _read_json(root / "config_sentence_transformers.json")
    maxsim = isinstance(st, dict) and (
        st.get("similarity_fn_name") == "MaxSim" or st.get("model_type") == "ColBERT"
    )
    return maxsim or any(t.startswith("pylate.") for t in types)


def read_pipeline(folder: str | Path | None, model_id: str | None = None) -> Pipeline:
    """The module list of the sentence-transformers folder ``folder`` (None: no folder, e.g. a
    config held in memory), with BGE-M3's heads when their files sit in it or ``model_id`` is a
    repository known to ship them. ``Pipeline()`` when the model declares nothing."""
    root = Path(folder) if folder is not None else None
    modules: list[PipelineModule] = []
    entries = _read_json(root / "modules.json") if root is not None else None
    source = "none"
    multi = False
    if root is not None and isinstance(entries, list):
        modules = [_module(root, e) for e in entries if isinstance(e, dict)]
        source = "modules.json"
        multi = _multi_vector(root, [m.type for m in modules])
    has_m3 = root is not None and all((root / f).is_file() for f in M3_FILES)
    if has_m3 or (model_id in M3_REPOS):
        if not modules:
            modules = [PipelineModule("", "transformer", "transformer")]
        modules += [
            PipelineModule("sparse_linear", "FlagEmbedding BGEM3 sparse_linear", "m3_sparse"),
            PipelineModule("colbert_linear", "FlagEmbedding BGEM3 colbert_linear", "m3_colbert"),
        ]
        source = "modules.json + FlagEmbedding M3" if source != "none" else "FlagEmbedding M3"
    return Pipeline(tuple(modules), source, multi)


def head_files(folder: str | Path) -> list[str]:
    """The files a model's heads need, relative to its repository (each module's config.json
    and weights as its modules.json lists them, BGE-M3's head files): what a Hub load fetches."""
    entries = _read_json(Path(folder) / "modules.json")
    names = (
        [str(e.get("path")) for e in entries if isinstance(e, dict) and e.get("path")]
        if isinstance(entries, list)
        else []
    )
    files = [
        f"{n}/{f}" for n in names for f in ("config.json", "model.safetensors", "pytorch_model.bin")
    ]
    return files + list(M3_FILES)
