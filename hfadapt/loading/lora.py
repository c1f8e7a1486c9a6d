"""Task LoRA adapters of a translated remote-code family: read from the checkpoint's
parametrization tensors (jina-embeddings-v3) or from one PEFT adapter folder per task
(jina-embeddings-v5 nano: ``adapters/<task>/``, which an online load downloads with the
weights) in full mode, or drawn as seeded stand-ins of the declared rank (structural mode), and
merged into a copy of the native model one task at a time.

Merging (``W + scaling * B @ A``; an Embedding's ``A @ B``) is what the remote code itself
computes for a selected task: its LoRA is a parametrization of the weight, applied before the
``F.linear`` / ``F.embedding`` of the layer, so the device runs one Linear or one Embedding
with the merged weight either way, as a serving stack for one task does. The product is formed
in float64 and rounded once to the model's dtype."""

from __future__ import annotations

import copy
import dataclasses
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hfadapt.errors import WeightsError
from hfadapt.loading import translate
from hfadapt.loading.task_adapter_files import PEFT_FILES, task_folder

if TYPE_CHECKING:
    from hfadapt.loading.load import LoadedModel

__all__ = [
    "STAND_IN_RATIO",
    "LoRASpec",
    "LowRank",
    "TaskLoRA",
    "read_peft_task_lora",
    "read_task_lora",
    "stand_in_task_lora",
    "task_lora_of",
]

# A stand-in adapter's change, per task and module, as a fraction of the weight's rms. No
# statistics of the trained jina v3 adapters are published: a rank-r change this large moves
# each task's outputs measurably off the base (tests/loading/test_families_jina_v3_lora.py
# prints by how much), so a structural run judges weights that differ per task.
STAND_IN_RATIO = 0.1


@dataclass(frozen=True)
class LoRASpec:
    """The task adapters a config declares (``translate.task_lora_spec``), with the family's
    table entry saying how they sit on the native modules."""

    family: str
    tasks: tuple[str, ...]
    rank: int
    alpha: float
    trained: bool
    instructions: dict[str, str]
    table: dict[str, Any]  # the family's ``task_lora`` entry (remote_families.json)

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def of(cls, translated_from: dict[str, Any] | None) -> LoRASpec | None:
        """The spec a translated model's evidence carries; None when it declares no tasks."""
        spec = (translated_from or {}).get("task_lora")
        if not spec:
            return None
        family = str(translated_from.get("family")) if translated_from else ""
        fam = translate.family_named(family)
        if fam is None or fam.task_lora is None:
            return None
        return cls(
            family,
            tuple(spec["tasks"]),
            int(spec["rank"]),
            float(spec["alpha"]),
            bool(spec["trained"]),
            dict(spec.get("instructions") or {}),
            fam.task_lora,
        )


@dataclass(frozen=True)
class LowRank:
    """One native weight's adapters, every task: ``delta[t] = left[t] @ right[t]``, the shape
    of the weight (a Linear's B @ A, an Embedding's A @ B)."""

    left: torch.Tensor  # [tasks, rows, rank]
    right: torch.Tensor  # [tasks, rank, cols]

    def delta(self, task: int, scaling: float) -> torch.Tensor:
        """The change of the weight for one task, in float64."""
        return scaling * (self.left[task].double() @ self.right[task].double())


@dataclass(frozen=True)
class TaskLoRA:
    """Every task's adapters of one model, by native weight name (``layers.0.mlp.fc1.weight``)."""

    spec: LoRASpec
    factors: dict[str, LowRank]
    origin: str  # "checkpoint (N tensors)" | "stand-ins (seed S, ...)"

    def merged(self, model: torch.nn.Module, task: str) -> torch.nn.Module:
        """A copy of ``model`` with ``task``'s adapters merged into its weights."""
        index = self.spec.tasks.index(task)
        out = copy.deepcopy(model)
        params = dict(out.named_parameters(remove_duplicate=False))
        with torch.no_grad():
            for name, low in self.factors.items():
                weight = params[name]
                weight.copy_(
                    (weight.double() + low.delta(index, self.spec.scaling)).to(weight.dtype)
                )
        return out

    def describe(self) -> dict[str, object]:
        """What a run records of the adapters (``evidence["task_lora"]``)."""
        return {
            "tasks": list(self.spec.tasks),
            "rank": self.spec.rank,
            "alpha": self.spec.alpha,
            "scaling": self.spec.scaling,
            "modules": len(self.factors),
            "origin": self.origin,
            "applied": "merged into the weights, one task per run (W + scaling * B @ A)",
        }


def _fits(name: str, low: LowRank, weight: torch.Tensor, spec: LoRASpec) -> None:
    tasks, rank = len(spec.tasks), spec.rank
    got = (low.left.shape[0], low.left.shape[2], low.right.shape[0], low.right.shape[1])
    shape = (low.left.shape[1], low.right.shape[2])
    if got != (tasks, rank, tasks, rank) or shape != tuple(weight.shape):
        raise WeightsError(
            f"task adapters of {name} do not fit: left {tuple(low.left.shape)}, right "
            f"{tuple(low.right.shape)} for {tasks} tasks of rank {rank} on a weight "
            f"{tuple(weight.shape)}"
        )


def _is_embedding(model: torch.nn.Module, weight_name: str) -> bool:
    module = model.get_submodule(weight_name.rsplit(".", 1)[0])
    return isinstance(module, torch.nn.Embedding)


def _read_lora_tensors(files: list[Path], suffixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The checkpoint tensors whose keys end in one of ``suffixes``, and only those."""
    out: dict[str, torch.Tensor] = {}
    for file in files:
        if file.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(file), framework="pt") as fh:
                out.update({k: fh.get_tensor(k) for k in fh.keys() if k.endswith(suffixes)})  # noqa: SIM118
        else:
            state = torch.load(str(file), map_location="cpu", weights_only=True, mmap=True)
            out.update({k: v for k, v in state.items() if k.endswith(suffixes)})
    return out


def read_task_lora(files: list[Path], spec: LoRASpec, model: torch.nn.Module) -> TaskLoRA | None:
    """The task adapters in a remote-named checkpoint, on ``model``'s native weight names; None
    when the checkpoint holds none. A fused adapter (Wqkv) is split row-wise like its weight."""
    fam = next(f for f in translate.families() if f.name == spec.family)
    a_end, b_end, weight_end = (spec.table["checkpoint"][k] for k in ("A", "B", "weight"))
    found = _read_lora_tensors(files, (a_end, b_end))
    if not found:
        return None
    params = dict(model.named_parameters(remove_duplicate=False))
    factors: dict[str, LowRank] = {}
    for a_key in sorted(k for k in found if k.endswith(a_end)):
        base = a_key[: -len(a_end)]
        if base + b_end not in found:
            raise WeightsError(f"the checkpoint holds {a_key} without {base + b_end}")
        names = translate.native_keys(fam, base + weight_end)
        if not names or any(n not in params for n in names):
            raise WeightsError(f"{a_key} is the adapter of no weight of the native model")
        a, b = found.pop(a_key).float(), found.pop(base + b_end).float()
        if _is_embedding(model, names[0]):  # F.embedding(weight + A @ B): rows are tokens
            parts = [LowRank(a, b)]
        else:  # F.linear(weight + B @ A): a fused weight's parts share A, each its rows of B
            parts = [LowRank(chunk, a) for chunk in b.chunk(len(names), dim=1)]
        for name, low in zip(names, parts, strict=True):
            _fits(name, low, params[name], spec)
            factors[name] = low
    if found:
        raise WeightsError(f"the checkpoint holds {sorted(found)[0]} without its {a_end}")
    return TaskLoRA(spec, factors, f"checkpoint ({len(factors)} native weights adapted)")


def _weight(model: torch.nn.Module, path: str) -> torch.Tensor:
    weight = model.get_submodule(path).weight
    if not isinstance(weight, torch.Tensor):
        raise WeightsError(f"{path} of the native model has no weight tensor")
    return weight


def _draw(shape: tuple[int, ...], seed: int, name: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def _targeted(path: str, module: torch.nn.Module, targets: list[str] | None) -> bool:
    """Whether the remote code puts an adapter on ``module``: every Linear and Embedding (jina
    v3), or the Linears whose name is one of the family's PEFT ``targets`` (jina v5)."""
    if targets is None:
        return isinstance(module, (torch.nn.Linear, torch.nn.Embedding))
    return isinstance(module, torch.nn.Linear) and path.rsplit(".", 1)[-1] in targets


def stand_in_task_lora(model: torch.nn.Module, spec: LoRASpec, seed: int) -> TaskLoRA:
    """Seeded stand-in adapters of the declared tasks and rank on every weight the remote code
    adapts (every Linear and Embedding, or the family's ``targets``; a fused group such as
    q/k/v shares one A, as the remote Wqkv does), each task's change STAND_IN_RATIO of the
    weight's rms."""
    tasks, rank = len(spec.tasks), spec.rank
    fused = [tuple(g) for g in spec.table.get("fused", [])]
    targets = spec.table.get("targets")
    factors: dict[str, LowRank] = {}
    for path, module in model.named_modules():
        if not _targeted(path, module, targets):
            continue
        group = next((g for g in fused if path.endswith(g[0])), None)
        if any(path.endswith(m) for g in fused for m in g[1:]):
            continue  # drawn with the group's first member
        members = [path[: -len(group[0])] + m for m in group] if group else [path]
        weights = [_weight(model, m) for m in members]
        heights = [int(w.shape[0]) for w in weights]
        left = _draw((tasks, sum(heights), rank), seed, path + ":left")
        right = _draw((tasks, rank, int(weights[0].shape[1])), seed, path + ":right")
        stacked = torch.cat([w.detach().double() for w in weights])
        target = STAND_IN_RATIO * float(stacked.pow(2).mean().sqrt())
        for t in range(tasks):
            rms = float((spec.scaling * left[t] @ right[t]).pow(2).mean().sqrt())
            left[t] *= target / rms if rms > 0 else 0.0
        for member, chunk in zip(members, left.float().split(heights, dim=1), strict=True):
            factors[member + ".weight"] = LowRank(chunk.contiguous(), right.float())
    origin = f"stand-ins (seed {seed}, rank {rank}, each task's change {STAND_IN_RATIO:g} of the weight's rms)"
    return TaskLoRA(spec, factors, origin)


def task_lora_of(loaded: LoadedModel, seed: int = 0) -> tuple[TaskLoRA | None, str | None]:
    """(the task adapters to judge ``loaded`` with, a note when there are none to judge): the
    checkpoint's in full mode, seeded stand-ins in a structural run; (None, None) for a model
    whose translation declares no task adapters."""
    spec = LoRASpec.of(loaded.translated_from)
    if spec is None:
        return None, None
    if not spec.trained:
        return (
            None,
            "the config loads no trained task adapters: every task computes the base weights",
        )
    if loaded.structural:
        return stand_in_task_lora(loaded.model, spec, seed), None
    from hfadapt.loading.load import check_weights

    if loaded.path is None:
        raise WeightsError(f"{loaded.model_id} has no folder to read its task adapters from")
    if spec.table.get("format") == "peft":
        _refuse_absent_on_hub(loaded, spec)
        folder = Path(loaded.path) / str(spec.table["adapters"])
        found = read_peft_task_lora(folder, spec, loaded.model)
        if found is None:
            where = (
                "in the HF cache (offline, so the Hub was not asked; judge it online to fetch them)"
                if loaded.source == "cache"
                else "beside the weights"
            )
            return None, (
                f"no adapter folder {folder.name}/<task>/ {where}: every task computes the base weights"
            )
        return found, None
    files = check_weights(Path(loaded.path), loaded.model_id)
    found = read_task_lora(files, spec, loaded.model)
    if found is None:
        return None, "the checkpoint holds no task adapters: every task computes the base weights"
    return found, None


def _refuse_absent_on_hub(loaded: LoadedModel, spec: LoRASpec) -> None:
    """WeightsError naming the task adapter files the Hub answered 404 for: the remote code
    loads every declared task's adapter, so without one the model does not load as users run
    it, and judging base weights in its place would be silently wrong."""
    root = str(spec.table["adapters"]) + "/"
    absent = {f: why for f, why in loaded.absent_on_hub.items() if f.startswith(root)}
    if not absent:
        return
    tasks = [t for t in spec.tasks if any(f.startswith(f"{root}{t}/") for f in absent)]
    first, why = next(iter(absent.items()))
    more = f" and {len(absent) - 1} more" if len(absent) > 1 else ""
    raise WeightsError(
        f"{loaded.model_id}: task adapter(s) of {', '.join(map(repr, tasks))} not on the Hub: "
        f"{first} ({why}){more}; its code loads every declared task's adapter, so it does not "
        "load as users run it"
    )


# PEFT LoraConfig fields whose non-default value changes what the adapter computes: read, so an
# adapter hfadapt would merge differently is refused rather than merged wrong.
_PEFT_PLAIN = {
    "use_dora": (False, None),
    "use_rslora": (False, None),
    "fan_in_fan_out": (False, None),
    "bias": ("none", None),
    "lora_bias": (False, None),
    "modules_to_save": (None,),
    "layers_to_transform": (None,),
    "rank_pattern": ({}, None),
    "alpha_pattern": ({}, None),
    "layer_replication": (None,),
    "trainable_token_indices": (None,),
    "alora_invocation_tokens": (None,),
    "target_parameters": (None, []),
    "use_qalora": (False, None),
}


def _peft_scaling(folder: Path, task: str) -> tuple[int, float]:
    """(rank, alpha) of one task's ``adapter_config.json``; WeightsError for an adapter that
    is not a plain LoRA (DoRA, rsLoRA, a bias, per-module ranks, saved modules, ...)."""
    path = folder / task_folder(task) / PEFT_FILES[0]
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WeightsError(f"task {task!r}: {path.name} is unreadable: {exc}") from exc
    if not isinstance(cfg, dict) or cfg.get("peft_type") != "LORA":
        raise WeightsError(f"task {task!r}: {path} is not a PEFT LORA adapter config")
    for key, plain in _PEFT_PLAIN.items():
        if key in cfg and not any(cfg[key] == p and type(cfg[key]) is type(p) for p in plain):
            raise WeightsError(
                f"task {task!r}: adapter {key}={cfg[key]!r} is not a plain LoRA merge"
            )
    rank, alpha = cfg.get("r"), cfg.get("lora_alpha")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise WeightsError(f"task {task!r}: adapter r={rank!r} is not a positive integer")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise WeightsError(f"task {task!r}: adapter lora_alpha={alpha!r} is not a number")
    return rank, float(alpha)


def read_peft_task_lora(folder: Path, spec: LoRASpec, model: torch.nn.Module) -> TaskLoRA | None:
    """Every task's PEFT adapter from ``folder/<task>/`` (``adapter_config.json``,
    ``adapter_model.safetensors``: ``base_model.model.<module>.lora_A.weight`` [r, fan_in] and
    ``lora_B.weight`` [fan_out, r]) on ``model``'s native weight names; None when ``folder``
    does not exist. The spec's rank and alpha are the adapters' own (every task the same); a
    weight one task does not adapt gets a zero change for it."""
    if not folder.is_dir():
        return None
    from safetensors import safe_open

    fam = next(f for f in translate.families() if f.name == spec.family)
    ckpt = spec.table["checkpoint"]
    prefix, a_end, b_end, weight_end = (ckpt[k] for k in ("prefix", "A", "B", "weight"))
    scalings = {task: _peft_scaling(folder, task) for task in spec.tasks}
    if len(set(scalings.values())) != 1:
        raise WeightsError(f"the task adapters differ in rank or alpha: {scalings}")
    rank, alpha = scalings[spec.tasks[0]]
    params = dict(model.named_parameters(remove_duplicate=False))
    pairs: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
    for index, task in enumerate(spec.tasks):
        path = folder / task_folder(task) / PEFT_FILES[1]
        if not path.is_file():
            raise WeightsError(f"task {task!r} has no {path.name} in {path.parent}")
        with safe_open(str(path), framework="pt") as fh:
            found = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
        for a_key in sorted(k for k in found if k.endswith(a_end)):
            base = a_key[: -len(a_end)]
            if base + b_end not in found:
                raise WeightsError(f"task {task!r}: {a_key} without {base + b_end}")
            names = translate.native_keys(fam, base.removeprefix(prefix) + weight_end)
            if len(names) != 1 or names[0] not in params:
                raise WeightsError(f"task {task!r}: {a_key} is the adapter of no native weight")
            pairs.setdefault(names[0], {})[index] = (found.pop(a_key), found.pop(base + b_end))
        if found:
            raise WeightsError(f"task {task!r}: {sorted(found)[0]} is not a LoRA A/B pair tensor")
    factors: dict[str, LowRank] = {}
    for name, by_task in sorted(pairs.items()):
        rows, cols = params[name].shape
        left = torch.zeros(len(spec.tasks), rows, rank)
        right = torch.zeros(len(spec.tasks), rank, cols)
        for index, (a, b) in by_task.items():  # F.linear(x, W + scaling * B @ A)
            if tuple(a.shape) != (rank, cols) or tuple(b.shape) != (rows, rank):
                raise WeightsError(
                    f"task {spec.tasks[index]!r}: adapter of {name} does not fit: A "
                    f"{tuple(a.shape)}, B {tuple(b.shape)} at rank {rank} on a weight {(rows, cols)}"
                )
            left[index], right[index] = b.float(), a.float()
        factors[name] = LowRank(left, right)
    if not factors:
        raise WeightsError(f"the adapter files in {folder} hold no LoRA A/B tensors")
    read = dataclasses.replace(spec, rank=rank, alpha=alpha)
    return TaskLoRA(read, factors, f"PEFT adapters ({len(factors)} native weights adapted)")
