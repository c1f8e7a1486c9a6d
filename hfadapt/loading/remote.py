"""Remote-code models without their code: refuse those no native translation covers (the
``custom_code`` verdict, with the field that blocks it), translate the others
(hfadapt.loading.translate), and load a translated model's remote-named checkpoint onto the
native class. Used by full-mode loading (hfadapt.loading.load) and structural mode."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from hfadapt.errors import ConfigError, CustomCodeError, WeightsError, option
from hfadapt.hub.resolve import snapshot_row
from hfadapt.loading import translate
from hfadapt.loading.signature import config_from_dict

if TYPE_CHECKING:
    from hfadapt.loading.pooling import PoolingSpec

# Missing checkpoint keys that are expected: a pooler embedding models do not use.
_OPTIONAL_KEYS = ("pooler.",)
SNAPSHOT_REASON = "the Hub marks it custom_code (bundled snapshot)"

__all__ = [
    "declared_pooling",
    "load_translated",
    "refuse_untranslatable",
    "snapshot_custom_row",
    "text_tower_model",
    "text_tower_of",
    "translation_note",
    "translation_of",
]


def _refuse(where: str, reason: str, why: str | None) -> NoReturn:
    extra = f"; {why}" if why else ""
    raise CustomCodeError(
        f"{where} needs its own code: {reason}{extra}; review it, then rerun with {option('trust_remote_code')}"
    )


def snapshot_custom_row(ref: str | os.PathLike[str]) -> Any | None:
    """The bundled snapshot's row of a Hub id it marks custom_code (None for folders, others)."""
    text = os.fspath(ref)
    if Path(text).expanduser().exists():
        return None
    row = snapshot_row(text)
    return row if row is not None and row.is_custom_code else None


def refuse_untranslatable(ref: str | os.PathLike[str], trust_remote_code: bool) -> None:
    """A Hub id the snapshot marks custom_code, of no family hfadapt translates, is refused
    before any network or cache lookup: the verdict does not depend on its files."""
    row = snapshot_custom_row(ref)
    if trust_remote_code or row is None:
        return
    if translate.family_for_row(row.config_class, row.model_type, row.architectures) is None:
        got = translate.translate_row(
            os.fspath(ref),
            row.config_class,
            row.model_type,
            row.parameters,
            architectures=row.architectures,
        )
        _refuse(
            os.fspath(ref),
            SNAPSHOT_REASON,
            got.one_line() if isinstance(got, translate.Refusal) else None,
        )


def translation_of(
    where: str, raw: dict[str, object], reason: str, row: object = None
) -> translate.Translation:
    """The native translation of a remote-code config (of a snapshot ``row`` when there is no
    config.json); CustomCodeError naming the field that keeps it custom_code otherwise."""
    if row is not None:
        got = translate.translate_snapshot_row(where, row)
    else:
        got = translate.translate(raw)
    if isinstance(got, translate.Refusal):
        _refuse(where, reason, got.one_line())
    return got


def text_tower_of(raw: dict[str, object], reason: str | None) -> translate.Translation | None:
    """The text tower judged for a composite (vision + text) config that needs no code of its
    own (hfadapt.loading.translate.text_tower); None for any other config."""
    return None if reason else translate.text_tower(raw)


def text_tower_model(
    model: object, translation: translate.Translation, where: str
) -> tuple[Any, Any, list[str]]:
    """(text model, its config, notes) out of a loaded composite model: the module the
    composite's own forward runs for text, with the composite's weights."""
    tower = translate.tower_of(translation)
    text = getattr(model, tower.attribute, None) if tower is not None else None
    if text is None or not hasattr(text, "config"):
        raise WeightsError(
            f"{where} loaded as {type(model).__name__}, which holds no text model to judge"
        )
    return text, text.config, [translation_note(translation)]


def translation_note(translation: translate.Translation) -> str:
    if translate.tower_of(translation) is not None:
        return (
            f"multimodal: judged as its text model, native {translation.native_type} "
            f"({translation.source})"
        )
    return (
        f"remote code not run: judged as native {translation.native_type} "
        f"(translated from {translation.family}, {translation.source})"
    )


def declared_pooling(translation: translate.Translation | None) -> PoolingSpec | None:
    """The pooling a translated family's remote code computes itself (jina v5 nano's
    ``custom_st.py``: the last real token, then L2 normalize), which no ``1_Pooling`` folder
    declares; None when the translation declares none (the folder's modules.json says)."""
    from hfadapt.loading.pooling import POOLING_MODES, PoolingSpec

    if translation is None or not translation.pooling:
        return None
    mode = translation.pooling.get("mode")
    if mode not in POOLING_MODES:
        raise ConfigError(
            f"family {translation.family} declares pooling {mode!r}: not one of {POOLING_MODES}"
        )
    return PoolingSpec(
        mode=str(mode),
        normalize=bool(translation.pooling.get("normalize")),
        source=f"the remote code of {translation.family}",
    )


def _read_checkpoint(files: list[Path]) -> dict[str, object]:
    import torch

    state: dict[str, Any] = {}
    for file in files:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            state.update(load_file(str(file)))
        else:
            state.update(torch.load(str(file), map_location="cpu", weights_only=True))
    return state


def load_translated(
    files: list[Path],
    translation: translate.Translation,
    where: str,
    model_class: Callable[[Any], Any],
) -> tuple[Any, Any, list[str]]:
    """(model, config, notes): the native model of ``translation`` with the remote-named
    checkpoint ``files`` renamed onto it; WeightsError when a tensor the model needs is missing
    or does not fit."""
    import torch

    config = config_from_dict(translation.config)
    state, dropped = translate.rename_checkpoint(translation.family, _read_checkpoint(files))
    model = model_class(config).from_config(config, dtype=torch.float32)
    try:
        info = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise WeightsError(
            f"weights of {where} do not fit its translated config: {' '.join(str(exc).split())[:200]}"
        ) from exc
    missing = sorted(k for k in info.missing_keys if not k.startswith(_OPTIONAL_KEYS))
    if missing:
        raise WeightsError(
            f"weights of {where} lack {len(missing)} tensor(s) the translated model needs, e.g. {missing[0]}"
        )
    notes = [translation_note(translation)]
    # task adapters are not native tensors: the judge merges them one task at a time
    lora = [k for k in dropped if translation.task_lora and ".lora_" in k]
    if lora:
        notes.append(
            f"task LoRA tensors: {len(lora)}, judged one task at a time, merged into the "
            "weights (hfadapt.loading.lora)"
        )
    if translation.task_lora and (folder := _adapter_folder(translation, files)) is not None:
        notes.append(
            f"task adapters: one PEFT folder per task in {folder.name}/, judged one task at a "
            "time, merged into the weights (hfadapt.loading.lora)"
        )
    if len(dropped) > len(lora):
        notes.append(f"remote-only checkpoint tensors not used: {len(dropped) - len(lora)}")
    if info.unexpected_keys:
        notes.append(
            f"unexpected checkpoint keys left unloaded: {len(info.unexpected_keys)}, e.g. {info.unexpected_keys[0]}"
        )
    return model, config, notes


def _adapter_folder(translation: translate.Translation, files: list[Path]) -> Path | None:
    """The PEFT adapter folder of a family keeping its task adapters beside the weights."""
    fam = translate.family_named(translation.family)
    table = fam.task_lora if fam is not None else None
    if not table or table.get("format") != "peft" or not files:
        return None
    folder = files[0].parent / str(table["adapters"])
    return folder if folder.is_dir() else None
