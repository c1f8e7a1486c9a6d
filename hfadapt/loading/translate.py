"""Native translations of remote-code model families: judge a model whose config.json maps its
classes to code in its repository (``auto_map``) with transformers' own implementation of the
same architecture, without running anyone's code.

The families are data (``hfadapt/data/remote_families.json``): which remote configs a family
matches, the native model_type, field renames, the values the native class computes the same
way, fields that do not change the computation, the rope rewrite, and checkpoint key renames.
A translation applies only when every field of the remote config is understood: an unknown
field, an unsupported value or a foreign architecture keeps the model ``custom_code``, with that
field named. A snapshot row without a config.json is matched to one of the family's published
shapes by its exact parameter count, or not at all.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hfadapt.errors import ConfigError

FAMILIES_FILE = Path(__file__).resolve().parents[1] / "data" / "remote_families.json"

__all__ = [
    "Family",
    "Refusal",
    "TextTower",
    "Translation",
    "families",
    "family_for",
    "family_for_row",
    "family_named",
    "native_keys",
    "not_mapped",
    "rename_checkpoint",
    "task_lora_spec",
    "text_model_class",
    "text_tower",
    "text_towers",
    "tower_of",
    "translate",
    "translate_row",
    "translate_snapshot_row",
    "translated",
]


@dataclass(frozen=True)
class Family:
    """One remote-code family and how it maps onto a native transformers model_type."""

    name: str
    native: str
    remote_classes: tuple[str, ...]
    remote_model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    renames: dict[str, str]
    required: dict[str, tuple[Any, ...]]
    ignored: frozenset[str]
    set: dict[str, Any]
    rope: str
    checkpoint: dict[str, Any]
    variants: tuple[dict[str, Any], ...]
    note: str | None = None
    # fields the remote config must state itself, with one of the required values (a
    # bidirectional decoder's own ``is_causal: false``): absent is not the same computation
    stated: tuple[str, ...] = ()
    # the auto_map AutoModel classes (``module.Class``) whose code was reviewed for the family
    auto_models: tuple[str, ...] = ()
    source: str | None = None  # where the family's mapping was read (code, card, config)
    # the repositories whose auto_map AutoModel code the native class re-implements (a
    # ``repo--module.Class`` target); empty: any repository
    auto_repos: tuple[str, ...] = ()
    # a native model_type the family's configs and snapshot rows carry (jina-bert v2: "bert"):
    # such a row is the family's only when one of its architectures is
    shared_model_type: str | None = None
    # task LoRA adapters the remote model applies for a selected task (jina v3): which config
    # fields declare them, how they sit on the native modules, where they were read
    # (hfadapt.loading.lora); None: the family has none
    task_lora: dict[str, Any] | None = None
    # fields the remote config must state (its base config class's own: jina v5 nano's EuroBERT
    # mask_token_id), so a config of another base with the same class name is never taken
    own_fields: tuple[str, ...] = ()
    # fields that mark a config of another base sharing the remote class (jina v5 small's
    # Qwen3 fields), each with the reason it keeps custom_code
    foreign_fields: dict[str, str] = field(default_factory=dict)
    # snapshot parameter counts of the class known to be another base, with the reason
    refused_shapes: dict[str, str] = field(default_factory=dict)
    # the pooling the remote code computes itself (jina v5's custom_st.py: last token +
    # normalize), recorded on the translation; None: the model folder's modules.json says
    pooling: dict[str, Any] | None = None


@dataclass
class Translation:
    """A remote config rewritten as a native one, with what was done to it."""

    family: str
    native_type: str
    remote_class: str | None
    config: dict[str, Any]  # a native config.json dict (model_type = the native type)
    source: str  # "config.json" | "snapshot shape <variant>"
    renamed: dict[str, str] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # the task adapters the config declares (``task_lora_spec``): judged one task at a time
    task_lora: dict[str, Any] | None = None
    # the pooling the family's remote code computes (Family.pooling), None: the folder's own
    pooling: dict[str, Any] | None = None

    def evidence(self) -> dict[str, Any]:
        """What a run records as ``evidence["translated_from"]``."""
        out = {
            "family": self.family,
            "remote_class": self.remote_class,
            "native_model_type": self.native_type,
            "source": self.source,
            "renamed": dict(self.renamed),
            "ignored": sorted(self.ignored),
            "notes": list(self.notes),
        }
        if self.task_lora is not None:
            out["task_lora"] = dict(self.task_lora)
        if self.pooling is not None:
            out["pooling"] = dict(self.pooling)
        return out


@dataclass(frozen=True)
class Refusal:
    """Why a remote config keeps ``custom_code``: the field (or row attribute) and the reason."""

    field: str
    reason: str

    def one_line(self) -> str:
        return f"no native translation ({self.field}: {self.reason})"


# ---- the table -----------------------------------------------------------------------------


@functools.cache
def _table() -> dict[str, Any]:
    try:
        data = json.loads(FAMILIES_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{FAMILIES_FILE.name} is unreadable: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("families"), list):
        raise ConfigError(f"{FAMILIES_FILE.name} has no list of families")
    return data


@functools.cache
def families() -> tuple[Family, ...]:
    """Every family of the table, in file order."""
    out = []
    for entry in _table()["families"]:
        out.append(
            Family(
                name=entry["name"],
                native=entry["native"],
                remote_classes=tuple(entry["remote_classes"]),
                remote_model_types=tuple(entry["remote_model_types"]),
                architectures=tuple(entry["architectures"]),
                renames=dict(entry["renames"]),
                required={k: tuple(v) for k, v in entry["required"].items()},
                ignored=frozenset(entry["ignored"]) | frozenset(_table()["common_ignored"]),
                set=dict(entry["set"]),
                rope=entry["rope"],
                checkpoint=dict(entry["checkpoint"]),
                variants=tuple(entry["variants"]),
                note=entry.get("lora_note"),
                stated=tuple(entry.get("stated", ())),
                auto_models=tuple(entry.get("auto_models", ())),
                source=entry.get("source"),
                auto_repos=tuple(entry.get("auto_repos", ())),
                shared_model_type=entry.get("shared_model_type"),
                task_lora=entry.get("task_lora"),
                own_fields=tuple(entry.get("own_fields", ())),
                foreign_fields=dict(entry.get("foreign_fields", {})),
                refused_shapes=dict(entry.get("refused_shapes", {})),
                pooling=entry.get("pooling"),
            )
        )
    return tuple(out)


def family_named(name: str) -> Family | None:
    """The table's family called ``name``; None when there is none."""
    return next((f for f in families() if f.name == name), None)


def not_mapped() -> dict[str, str]:
    """Remote config classes looked at and not mapped, with why."""
    return dict(_table().get("not_mapped", {}))


def _auto_config_class(raw: dict[str, object]) -> str | None:
    auto_map = raw.get("auto_map")
    if not isinstance(auto_map, dict):
        return None
    target = auto_map.get("AutoConfig")
    if isinstance(target, list):
        target = target[0] if target else None
    return str(target).split("--")[-1].split(".")[-1] if target else None


def family_for(raw: dict[str, object]) -> Family | None:
    """The family a remote config belongs to: by its auto_map AutoConfig class, else its
    model_type; None when no family claims it."""
    cls = _auto_config_class(raw)
    for fam in families():
        if cls is not None and cls in fam.remote_classes:
            return fam
    if cls is None:
        for fam in families():
            if raw.get("model_type") in fam.remote_model_types:
                return fam
    return None


def family_for_row(
    config_class: str | None, model_type: str | None, architectures: tuple[str, ...] = ()
) -> Family | None:
    """The family of a snapshot row (no config.json): its config_class, else its model_type (a
    model_type a family shares with a native one, with one of the family's architectures)."""
    for fam in families():
        if config_class and config_class in fam.remote_classes:
            return fam
    if not config_class:
        for fam in families():
            if model_type and model_type in fam.remote_model_types:
                return fam
            if (
                model_type
                and model_type == fam.shared_model_type
                and set(architectures) & set(fam.architectures)
            ):
                return fam
    return None


# ---- config translation --------------------------------------------------------------------

# Consumed by the family's rope rewrite (``_rope``), not copied.
_ROPE_FIELDS = frozenset({"rope_theta", "rope_scaling", "rotary_emb_base"})
# Copied as they are for a family whose native class reads the remote rope fields (rope "native").
_NATIVE_ROPE_FIELDS = frozenset({"rope_theta", "rope_scaling", "rope_parameters"})


def _auto_target(raw: dict[str, object], auto: str) -> str | None:
    """``module.Class`` of an auto_map entry, without a ``repo--`` prefix."""
    auto_map = raw.get("auto_map")
    target = auto_map.get(auto) if isinstance(auto_map, dict) else None
    if isinstance(target, list):
        target = target[0] if target else None
    return str(target).split("--")[-1] if target else None


def _auto_code(raw: dict[str, object], auto: str) -> str | None:
    """The repository an auto_map entry's ``repo--module.Class`` names (None: no repository,
    the model's own files)."""
    auto_map = raw.get("auto_map")
    target = auto_map.get(auto) if isinstance(auto_map, dict) else None
    if isinstance(target, list):
        target = target[0] if target else None
    return str(target).split("--")[0] if target and "--" in str(target) else None


def _same(value: object, allowed: object) -> bool:
    """``value`` is ``allowed``: bools and None only match themselves, numbers by value."""
    if isinstance(allowed, bool) or allowed is None or isinstance(value, bool) or value is None:
        return value is allowed
    if isinstance(allowed, (int, float)) and isinstance(value, (int, float)):
        return float(value) == float(allowed)
    return bool(value == allowed)


def _rope(fam: Family, raw: dict[str, Any], head_dim: int) -> dict[str, object] | Refusal:
    """The native ``rope_parameters`` for the family's remote rope fields."""
    if fam.rope in ("nomic", "jina"):
        base = raw.get("rotary_emb_base")
        if base is None:
            return Refusal("rotary_emb_base", "missing: the rope base cannot be known")
        return {"rope_type": "default", "rope_theta": float(base)}
    if fam.rope == "llama":
        return {"rope_type": "default", "rope_theta": float(raw.get("rope_theta", 10000.0))}
    if fam.rope in ("native", "none"):  # read as they are; or no rope at all (ALiBi)
        return {}
    if fam.rope == "new":
        theta = float(raw.get("rope_theta", 10000.0))
        scaling = raw.get("rope_scaling")
        if scaling is None:
            return {"rope_type": "default", "rope_theta": theta}
        if not isinstance(scaling, dict) or scaling.get("type") != "ntk":
            return Refusal("rope_scaling", f"{scaling!r} is not the fixed NTK scaling")
        if scaling.get("mixed_b") is not None:
            return Refusal("rope_scaling.mixed_b", "mixed NTK has no native rope type")
        extra = set(scaling) - {"type", "factor", "mixed_b"}
        if extra:
            return Refusal(f"rope_scaling.{sorted(extra)[0]}", "unknown rope scaling field")
        factor = float(scaling.get("factor", 1.0))
        # Fixed NTK (Alibaba new-impl): base * factor, then every inverse frequency divided by
        # factor ** (2 / dim): native "linear" scaling divides them by its factor.
        return {
            "rope_type": "linear",
            "rope_theta": theta * factor,
            "factor": factor ** (2.0 / head_dim),
        }
    return Refusal("rope", f"family {fam.name} has an unknown rope rewrite {fam.rope!r}")


def _other_base(fam: Family, raw: dict[str, object]) -> Refusal | None:
    """A config of another base sharing the family's remote class (jina v5: EuroBERT nano, Qwen3
    small): a field only the other base's config has, or one of the family's own not stated."""
    for key, why in fam.foreign_fields.items():
        if key in raw:
            return Refusal(key, why)
    for key in fam.own_fields:
        if key not in raw:
            return Refusal(
                key, f"not stated: every {fam.name} config states it (its base class's own field)"
            )
    return None


def translate(raw: dict[str, Any], fam: Family | None = None) -> Translation | Refusal:
    """Translate a remote config.json dict to the native config of its family, or say why not."""
    fam = fam or family_for(raw)
    if fam is None:
        cls = _auto_config_class(raw) or raw.get("model_type")
        why = not_mapped().get(str(cls), "no native family in hfadapt's table")
        return Refusal("auto_map.AutoConfig", f"{cls}: {why}")
    archs = raw.get("architectures") or []
    foreign = [a for a in archs if a not in fam.architectures]
    if foreign:
        return Refusal("architectures", f"{foreign[0]} is not an architecture of {fam.name}")
    if fam.auto_models:
        target = _auto_target(raw, "AutoModel")
        if target not in fam.auto_models:
            return Refusal(
                "auto_map.AutoModel",
                f"{target} is not the reviewed code of {fam.name} ({', '.join(fam.auto_models)})",
            )
    if fam.auto_repos:
        code = _auto_code(raw, "AutoModel")
        if code not in fam.auto_repos:
            return Refusal(
                "auto_map.AutoModel",
                f"code of {code or 'the model repository itself'} is not the code "
                f"{fam.name} re-implements ({', '.join(fam.auto_repos)})",
            )
    if (base := _other_base(fam, raw)) is not None:
        return base
    for key in fam.stated:
        if key not in raw:
            return Refusal(
                key,
                f"not stated: {fam.name} is translated only when its config says {key}={fam.required[key][0]!r}",
            )
    lora = task_lora_spec(fam, raw)
    if isinstance(lora, Refusal):
        return lora
    native: dict[str, Any] = {"model_type": fam.native, **fam.set}
    renamed: dict[str, str] = {}
    ignored: list[str] = []
    for key, value in raw.items():
        if key in _lora_fields(fam):  # read by task_lora_spec: the task adapters
            continue
        if key in fam.required and not any(_same(value, a) for a in fam.required[key]):
            return Refusal(
                key,
                f"{value!r} is not supported by native {fam.native} (it computes {fam.required[key][0]!r})",
            )
        if key in fam.renames:
            native[fam.renames[key]] = value
            if fam.renames[key] != key:
                renamed[key] = fam.renames[key]
        elif key in fam.ignored:
            ignored.append(key)
        elif fam.rope == "native" and key in _NATIVE_ROPE_FIELDS:
            native[key] = value
        elif key not in fam.required and key not in _ROPE_FIELDS:
            return Refusal(
                key,
                f"unknown field of {fam.name} configs (value {value!r}): it may change the computation",
            )
    heads = int(native.get("num_attention_heads") or 1)
    head_dim = int(native.get("head_dim") or int(native.get("hidden_size") or 0) // heads or 1)
    rope = _rope(fam, raw, head_dim)
    if isinstance(rope, Refusal):
        return rope
    if rope:
        native["rope_parameters"] = rope
    return Translation(
        family=fam.name,
        native_type=fam.native,
        remote_class=_auto_config_class(raw),
        config=native,
        source="config.json",
        renamed=renamed,
        ignored=ignored,
        notes=_lora_notes(fam, lora),
        task_lora=lora,
        pooling=dict(fam.pooling) if fam.pooling else None,
    )


def _lora_fields(fam: Family) -> set[str]:
    """The remote config fields of the family's task adapters (its ``task_lora`` roles)."""
    roles = ("tasks", "rank", "alpha", "instructions", "trained")
    table = fam.task_lora or {}
    return {str(table[r]) for r in roles if table.get(r)}


def _lora_notes(fam: Family, lora: dict[str, object] | None) -> list[str]:
    if fam.task_lora is not None and lora is None:
        return [f"no task adapters declared ({fam.task_lora['tasks']}): the task-free path"]
    return [fam.note] if fam.note else []


def task_lora_spec(fam: Family, raw: dict[str, object]) -> dict[str, object] | Refusal | None:
    """The task adapters a remote config declares (tasks, rank, alpha, scaling = alpha / rank,
    the instruction prefixed to each task's text, whether the checkpoint holds trained ones), or
    the Refusal naming a malformed field; None when the family or the config declares none."""
    table = fam.task_lora
    if table is None or raw.get(table["tasks"]) is None:
        return None
    # a family whose config names no rank/alpha field (jina v5: PEFT adapter folders) declares
    # the published adapters' values; full mode reads each adapter's own (hfadapt.loading.lora)
    declared = table.get("declared") or {}
    tasks = raw.get(table["tasks"])
    rank, alpha = (
        raw.get(table[k]) if table.get(k) else declared.get(k) for k in ("rank", "alpha")
    )
    rank_field, alpha_field = (table.get(k) or f"{k} (declared)" for k in ("rank", "alpha"))
    if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
        return Refusal(table["tasks"], f"{tasks!r} is not a list of task names")
    if len(set(tasks)) != len(tasks):
        return Refusal(table["tasks"], f"{tasks!r} names a task twice")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        return Refusal(rank_field, f"{rank!r}: the adapters' rank must be a positive integer")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        return Refusal(alpha_field, f"{alpha!r}: the adapters' alpha must be a number")
    instructions = (raw.get(table["instructions"]) if table.get("instructions") else None) or {}
    if not isinstance(instructions, dict) or not set(instructions) <= set(tasks):
        return Refusal(table["instructions"], f"{instructions!r} is not a map of the tasks")
    # absent: the checkpoint says (full mode)
    trained = raw.get(table["trained"], True) if table.get("trained") else True
    if not isinstance(trained, bool):
        return Refusal(table["trained"], f"{trained!r} is not true or false")
    return {
        "tasks": list(tasks),
        "rank": rank,
        "alpha": float(alpha),
        "scaling": float(alpha) / rank,
        "trained": trained,
        "instructions": {str(k): str(v) for k, v in instructions.items()},
    }


def translate_row(
    model_id: str,
    config_class: str | None,
    model_type: str | None,
    parameters: int | None,
    *,
    approximate: bool = False,
    architectures: tuple[str, ...] = (),
) -> Translation | Refusal:
    """Translate a snapshot row with no config.json: the family's published shape whose
    parameter count equals the row's (within 2% when the count was read off the model's name;
    plus a classification head of 1-16 labels when the row names a *Classification class)."""
    fam = family_for_row(config_class, model_type, architectures)
    if fam is None:
        name = config_class or (architectures[0] if architectures else None) or model_type
        return Refusal(
            "config_class",
            f"{name}: {not_mapped().get(str(name), 'no native family in hfadapt table')}",
        )
    if parameters is None:
        return Refusal(
            "parameters", "no config.json and no parameter count to match a published shape"
        )
    for variant in fam.variants:
        expected = int(variant["parameters"])
        head = _classification_head(variant, parameters - expected, architectures)
        if (
            parameters == expected
            or model_id == variant.get("model_id")  # the published shape of this very model
            or head
            or (approximate and abs(parameters - expected) <= 0.02 * expected)
        ):
            got = translate(variant["config"], fam)
            if isinstance(got, Translation):
                got.source = f"snapshot shape {variant['name']} ({expected} parameters)"
                if head:
                    got.notes.append(head)
                got.notes.append(
                    f"no config.json of {model_id}: judged as the published {variant['name']} shape, "
                    f"whose parameter count matches the snapshot's"
                )
            return got
    if str(parameters) in fam.refused_shapes:
        return Refusal("parameters", fam.refused_shapes[str(parameters)])
    shapes = ", ".join(f"{v['name']} {v['parameters']}" for v in fam.variants)
    return Refusal(
        "parameters",
        f"{parameters} matches no published {fam.name} shape ({shapes}): without its config.json the "
        "fields that differ cannot be checked",
    )


def _classification_head(variant: dict[str, Any], extra: int, archs: tuple[str, ...]) -> str | None:
    """A note when ``extra`` parameters are exactly a k-label linear head (hidden*k + k) of a
    *Classification architecture the row lists; embeddings do not use it."""
    hidden = int(variant["config"].get("hidden_size") or variant["config"].get("n_embd") or 0)
    if extra <= 0 or not hidden or not any("Classification" in a for a in archs):
        return None
    labels, rest = divmod(extra, hidden + 1)
    if rest or not 1 <= labels <= 16:
        return None
    return f"{extra} more parameters than {variant['name']}: a {labels}-label classification head, not used for embeddings"


def translated(model_id: str, raw: dict[str, object] | None) -> Translation | Refusal:
    """A remote-code model's translation: of its config.json when it has one (``auto_map``),
    else of its bundled snapshot row (a published shape matched by parameter count)."""
    if raw and raw.get("auto_map"):
        return translate(raw)
    from hfadapt.hub.resolve import snapshot_row

    row = snapshot_row(model_id)
    if row is None:
        return Refusal("config.json", "none to read, and the bundled snapshot does not list it")
    return translate_snapshot_row(model_id, row)


def translate_snapshot_row(model_id: str, row: Any) -> Translation | Refusal:
    """translate_row of a bundled snapshot row (hfadapt.hub.resolve.snapshot_row): its parameter
    count approximate where the snapshot read it off the model's name."""
    return translate_row(
        model_id,
        row.config_class,
        row.model_type,
        row.parameters,
        approximate=row.parameters_from_name,
        architectures=row.architectures,
    )


# ---- text towers of multimodal embedders ---------------------------------------------------


@dataclass(frozen=True)
class TextTower:
    """A composite (vision + text) model whose text model transformers ships: an embedder of
    text is judged as that text model, built from the composite's ``text_config``."""

    composite: str  # the composite model_type
    text_type: str | None  # the text_config's model_type (None: any, its AutoModel)
    model_class: str | None  # the transformers class of the text model (None: its AutoModel)
    attribute: str  # the composite base model's attribute holding the text model
    source: str  # where transformers makes the text model of the composite


_M = "transformers/models/"
# Each composite's base model (its AutoModel class) holds exactly this text model: built from
# ``config.text_config`` at ``attribute`` (transformers 5.25, the lines cited).
_TEXT_TOWERS: dict[str, TextTower] = {
    t.composite: t
    for t in (
        TextTower(
            composite="qwen3_vl",
            text_type="qwen3_vl_text",
            model_class="Qwen3VLTextModel",
            attribute="language_model",
            source=_M + "qwen3_vl/modeling_qwen3_vl.py, Qwen3VLModel.__init__: "
            "self.language_model = AutoModel.from_config(config.text_config)",
        ),
        TextTower(
            composite="qwen2_vl",
            text_type="qwen2_vl_text",
            model_class="Qwen2VLTextModel",
            attribute="language_model",
            source=_M + "qwen2_vl/modeling_qwen2_vl.py, Qwen2VLModel.__init__: "
            "self.language_model = Qwen2VLTextModel._from_config(config.text_config)",
        ),
        TextTower(
            composite="llava_next",
            text_type=None,
            model_class=None,
            attribute="language_model",
            source=_M + "llava_next/modeling_llava_next.py, LlavaNextModel.__init__: "
            "self.language_model = AutoModel.from_config(config.text_config)",
        ),
        TextTower(
            composite="metaclip_2",
            text_type="metaclip_2_text_model",
            model_class="MetaClip2TextModel",
            attribute="text_model",
            source=_M + "metaclip_2/modeling_metaclip_2.py, MetaClip2Model.__init__: "
            "self.text_model = MetaClip2TextModel._from_config(text_config)",
        ),
        TextTower(
            composite="clip",
            text_type="clip_text_model",
            model_class="CLIPTextModel",
            attribute="text_model",
            source=_M + "clip/modeling_clip.py, CLIPModel.__init__: "
            "self.text_model = CLIPTextModel._from_config(text_config)",
        ),
        TextTower(
            composite="siglip",
            text_type="siglip_text_model",
            model_class="SiglipTextModel",
            attribute="text_model",
            source=_M + "siglip/modeling_siglip.py, SiglipModel.__init__: "
            "self.text_model = SiglipTextModel._from_config(text_config)",
        ),
    )
}


def text_towers() -> dict[str, TextTower]:
    """Every composite model_type whose text model is judged, by model_type."""
    return dict(_TEXT_TOWERS)


_TOWER_FAMILY = "text tower of "


def tower_of(translation: Translation) -> TextTower | None:
    """The text tower a translation judges (None for a remote-code family's translation)."""
    name = translation.family
    return _TEXT_TOWERS.get(name[len(_TOWER_FAMILY) :]) if name.startswith(_TOWER_FAMILY) else None


def text_tower(raw: dict[str, object]) -> Translation | None:
    """The text model of a composite (vision + text) config as a native config of its own, or
    None when ``raw`` is not a composite hfadapt knows the text model of. Fields the composite
    leaves out take its ``text_config`` defaults, as transformers builds them."""
    from hfadapt.loading.signature import config_from_dict

    tower = _TEXT_TOWERS.get(str(raw.get("model_type")))
    if tower is None:
        return None
    text = getattr(config_from_dict(raw), "text_config", None)
    if text is None or not hasattr(text, "to_dict"):
        return None
    config = text.to_dict()
    return Translation(
        family=_TOWER_FAMILY + tower.composite,
        native_type=str(config["model_type"]),
        remote_class=None,
        config=config,
        source=f"text_config of {tower.composite}",
        notes=[
            f"judged as the text model of {tower.composite} ({tower.source}): the embedding of "
            "text; the vision tower is not judged"
        ],
    )


def text_model_class(model_type: str) -> str | None:
    """The transformers class of a text tower's model_type (``metaclip_2_text_model`` ->
    MetaClip2TextModel, which AutoModel does not map); None for any other model_type."""
    return next((t.model_class for t in _TEXT_TOWERS.values() if t.text_type == model_type), None)


# ---- checkpoint keys -----------------------------------------------------------------------


def rename_checkpoint(family: str, state: dict[str, Any]) -> tuple[dict[str, object], list[str]]:
    """A remote-named state dict as the native model names it: (renamed tensors, dropped keys).
    Renames apply in table order; a fused tensor (qkv, up+gate) is chunked along dim 0."""
    fam = family_named(family)
    if fam is None:
        raise ConfigError(f"family={family!r} is not in {FAMILIES_FILE.name}")
    out: dict[str, Any] = {}
    dropped: list[str] = []
    for key, tensor in state.items():
        names = native_keys(fam, key)
        if not names:
            dropped.append(key)
        elif len(names) == 1:
            out[names[0]] = tensor
        else:  # a fused tensor: its parts in order along dim 0
            for name, chunk in zip(names, tensor.chunk(len(names), dim=0), strict=True):
                out[name] = chunk.contiguous()
    return out, dropped


def native_keys(fam: Family, key: str) -> list[str]:
    """The native state-dict key(s) of one remote checkpoint key: one, the parts of a fused
    tensor in order (split along dim 0), or none for a key the native model does not hold."""
    table = fam.checkpoint
    if any(re.search(p, key) for p in table.get("drop", [])):
        return []
    name = key
    for pattern, repl in table.get("rename", []):
        name = re.sub(pattern, repl, name)
    for pattern, parts in table.get("split", []):
        if re.search(pattern, name):
            return [re.sub(pattern, part, name) for part in parts]
    return [name]
