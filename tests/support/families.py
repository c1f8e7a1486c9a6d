"""The translated families (hfadapt.loading.translate) as the family tests use them: one by
name, and a tiny model of one judged in memory on the eager device."""

from __future__ import annotations

from typing import Any

from hfadapt.loading import translate
from hfadapt.loading.load import LoadedModel


def bundled_family(name: str) -> translate.Family:
    """The bundled family ``name`` (StopIteration names a family the table lacks)."""
    return next(f for f in translate.families() if f.name == name)


def diagnose_tiny(ref: str | LoadedModel, raw: dict[str, Any], **kwargs: Any) -> Any:
    """``ref`` diagnosed without recording, eagerly unless ``execution`` says otherwise: a
    loaded model in its own mode (full unless it is a stand-in), else structurally from the
    remote config ``raw``."""
    from hfadapt.judge.diagnose import diagnose

    loaded = isinstance(ref, LoadedModel)
    mode = "full" if loaded and not ref.structural else "structural"
    return diagnose(
        ref,
        config=None if loaded else raw,
        mode=mode,
        record=False,
        localize_failures=False,
        **{"execution": "eager", **kwargs},
    )
