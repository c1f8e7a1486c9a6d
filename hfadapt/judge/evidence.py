"""What a verdict rests on. Every run names its *config source* (where the model, or its
config, came from) and the *evidence level* that source gives (hfadapt.options.EvidenceLevel):

- ``weights``: the model's own weights were loaded and run (full mode);
- ``config``: the model's own config.json, from a folder, the HF cache, the Hub, a crawl, or
  the real configs bundled with hfadapt (structural mode: seeded weights, truncated layers);
- ``architecture``: only the model type's default config, so this model's own shapes were
  not checked (an architecture pass says the *type* lowers, not this model).

A run also says which cache entries it rests on (``evidence["caches"]``, written by
hfadapt.judge.phases.judge): ``describe_caches`` puts that in one line.

No torch here: reports and ``hfadapt show`` read these labels without importing a model."""

from __future__ import annotations

from hfadapt.options import EvidenceLevel

__all__ = [
    "ADAPTABLE",
    "LEVELS",
    "UNKNOWN",
    "describe_caches",
    "describe_source",
    "level_label",
    "level_of_source",
    "pass_note",
    "without_adapters_step",
]

# Strongest first: the order reports list them in.
LEVELS: tuple[str, ...] = tuple(level.value for level in EvidenceLevel)
UNKNOWN = "unknown"  # rows written before evidence levels, or a model that never loaded

# Config source -> (evidence level, what a user reads).
_SOURCES: dict[str, tuple[EvidenceLevel, str]] = {
    "folder": (EvidenceLevel.WEIGHTS, "its own weights and config, from a local folder"),
    "cache": (EvidenceLevel.WEIGHTS, "its own weights and config, from the HF cache"),
    "hub": (EvidenceLevel.WEIGHTS, "its own weights and config, from the Hub"),
    "structural:folder": (EvidenceLevel.CONFIG, "its own config.json, from a local folder"),
    "structural:cache": (EvidenceLevel.CONFIG, "its own config.json, from the HF cache"),
    "structural:hub": (EvidenceLevel.CONFIG, "its own config.json, from the Hub"),
    "structural:crawl": (EvidenceLevel.CONFIG, "its own config.json, stored by the crawl"),
    "structural:bundled": (
        EvidenceLevel.CONFIG,
        "its own config.json, from the real configs bundled with hfadapt",
    ),
    "structural:given": (EvidenceLevel.CONFIG, "its own config.json, handed over by the caller"),
    "structural:defaults": (
        EvidenceLevel.ARCHITECTURE,
        "the model_type's default config (transformers): this model's own shapes were not checked",
    ),
}


def level_of_source(source: str | None) -> EvidenceLevel | None:
    """The evidence level a config source gives; None when the source is unknown."""
    if source is None:
        return None
    known = _SOURCES.get(source)
    return known[0] if known else None


def describe_source(source: str | None) -> str:
    """One phrase: where the model's config came from (``unknown`` when not recorded)."""
    if source is None:
        return "not recorded"
    known = _SOURCES.get(source)
    return known[1] if known else source


def level_label(level: str | None) -> str:
    """The level as shown in tables: its value, or ``unknown`` for None / an old row."""
    return level if level in LEVELS else UNKNOWN


# Failures an adapter can fix: a run judged without the registry's adapters tries them first.
ADAPTABLE = ("lowering_failed", "verification_failed")


def without_adapters_step(model_id: str) -> str:
    """The next step of a failure judged without the registry's adapters (--no-adapters)."""
    return (
        "this run left the registry's adapters out (--no-adapters): run it without that flag "
        f"first, as the adapters may already fix it: hfadapt diagnose {model_id}"
    )


def pass_note(level: str | None) -> str:
    """What a pass at this level means, in one phrase (rows and tables show it)."""
    if level == EvidenceLevel.WEIGHTS:
        return "passes with its own weights"
    if level == EvidenceLevel.CONFIG:
        return "passes on its own config (seeded weights)"
    if level == EvidenceLevel.ARCHITECTURE:
        return "architecture passes; this model's shapes were not checked"
    return "passes; what it rests on was not recorded"


def _reference_use(use: object) -> str:
    kind, _, key = str(use).partition(":")
    return {
        "hit": f"reference read from entry {key}",
        "miss": f"reference computed, entry {key}",
        "unkeyed": "reference not cacheable",
    }.get(kind, "reference off")


def _compile_use(use: object) -> str:
    if not isinstance(use, dict):
        return "compile off"
    counts = {k: len(v) if isinstance(v, list) else v for k, v in use.items()}
    words = (("hits", "hit", "hits"), ("misses", "miss", "misses"), ("stored", "stored", "stored"))
    parts = [
        f"{counts[k]} {one if counts[k] == 1 else many}" for k, one, many in words if counts.get(k)
    ]
    parts += [f"{counts[k]} {k}" for k in ("unkeyed", "rejected") if counts.get(k)]
    return "compile " + (", ".join(parts) if parts else "unused")


def describe_caches(caches: object) -> str | None:
    """One line: what the reference and compile caches gave a run (its ``evidence["caches"]``);
    None when the run did not record it."""
    if not isinstance(caches, dict):
        return None
    if caches.get("skipped"):
        return "caches: skipped for this run (--no-cache)"
    return (
        f"caches: {_reference_use(caches.get('reference'))}; {_compile_use(caches.get('compile'))}"
    )
