"""The model to judge, in either mode: its real weights (:mod:`hfadapt.loading.load`) or a
structural stand-in built from its config (:mod:`hfadapt.loading.structural`), optionally from
a config held in memory. ``diagnose`` loads through here, and so does a caller (the drafting
agent) that wants the model and its probes without a verdict."""

from __future__ import annotations

import os

from hfadapt.errors import UsageError
from hfadapt.hub.resolve import HubOptions
from hfadapt.loading.load import LoadedModel
from hfadapt.options import Mode

__all__ = ["load_model"]


def load_model(
    model_ref: str | os.PathLike[str] | LoadedModel,
    mode: Mode | str = Mode.FULL,
    *,
    trust_remote_code: bool = False,
    hub: HubOptions | None = None,
    config: dict[str, object] | None = None,
    config_source: str | None = None,
) -> LoadedModel:
    """``model_ref`` loaded for judging (a ``LoadedModel`` comes back as it is).

    ``mode`` "full": the model's own weights; "structural": its config (a folder, the HF cache,
    the Hub, the bundled configs, else its type's defaults), layers truncated, seeded weights.
    ``config``: the config.json as a dict, used instead of finding one (structural only: a
    config alone has no weights); ``config_source`` labels where it came from (a source of
    :mod:`hfadapt.judge.evidence`, e.g. ``structural:crawl``), which sets the evidence level."""
    if isinstance(model_ref, LoadedModel):
        return model_ref
    structural = Mode.parse(mode, "mode") == Mode.STRUCTURAL
    if config is not None and not structural:
        raise UsageError("config= builds a structural model: it needs mode='structural'")
    if structural:
        from hfadapt.loading import structural as build

        return build.build(
            model_ref,
            trust_remote_code=trust_remote_code,
            hub=hub,
            config=config,
            config_source=config_source,
        )
    from hfadapt.loading import load as loading

    return loading.load(model_ref, trust_remote_code=trust_remote_code, hub=hub)
