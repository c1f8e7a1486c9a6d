"""The package's layers, lowest first: a module may import its own layer's modules and any
lower layer, never a higher one, and no two modules may import each other (directly or round
a loop). Siblings in one layer are separate parts and never import each other; a package's
``__init__`` is the front of its package and may reach any module inside it. A module belongs
to the layer of the longest prefix listed here. ``tests/package/test_layers.py`` parses every import
in the package (function-level ones too) and checks all of this."""

from __future__ import annotations

LAYERS: tuple[tuple[str, ...], ...] = (
    # the core: typed errors; then option types, verdict strings, the version, this table
    ("hfadapt.errors",),
    # every environment variable hfadapt reads
    ("hfadapt.settings",),
    # hfadapt's own processes: the collector's settings, ending without the teardown
    ("hfadapt.own_process",),
    # every use of torch's private API, and patches to torch's modules with save and restore
    ("hfadapt.torch_internals",),
    # reading what untrusted code or servers produced: bounded JSON, clean text, redaction;
    # a bounded folder of cache entries shared by processes
    ("hfadapt.untrusted", "hfadapt.disk_cache"),
    # what other libraries print (warnings, log records, progress bars): held and counted
    ("hfadapt.noise",),
    # the sandbox's seccomp filter (libseccomp through ctypes)
    ("hfadapt.seccomp",),
    # OS isolation for untrusted code (bubblewrap): usable by every layer above
    ("hfadapt.isolation",),
    # option types, verdict strings, the version, this table, what a model's config is read as
    (
        "hfadapt.options",
        "hfadapt.verdicts",
        "hfadapt.version",
        "hfadapt.layers",
        "hfadapt.model_config",
    ),
    # runs.db: engine, tables, migrations
    ("hfadapt.db",),
    # graphs of ATen ops as data: capture, validation, the allowlist, running one
    ("hfadapt.graphs",),
    # the simulated device's numerics, with plain parameters (never the profile): DL16, the C
    # kernels and AMX, the kernels of ops with DL16 intermediates, the host's float32 state
    ("hfadapt.spyre.numerics",),
    # its rules as data and their judges: the profile, op and layout rules, the card's per-op
    # defects, the lowering report, tracking
    ("hfadapt.spyre.rules",),
    # what both halves share: the decomposition table, the card's memory, Dynamo's frames, the
    # host-built constants; the package front (``hfadapt.spyre``: register, the profile, the
    # lowering report)
    ("hfadapt.spyre",),
    # its two halves: the eager PrivateUse1 device and the torch.compile backend
    ("hfadapt.spyre.eager", "hfadapt.spyre.compile"),
    # running a model on either half
    ("hfadapt.spyre.runner",),
    # the Hub: client, crawl, prefilter, listing, snapshot, configs, where a model is
    ("hfadapt.hub",),
    # loading a model to judge: its weights, or a structural stand-in from its config; the
    # structural signature, remote-code translations, pooling, probe inputs
    ("hfadapt.loading",),
    # adapters: the API, registry, rebind, proofs
    ("hfadapt.adapters",),
    # judging one model: the phases, metrics, localization, the Diagnosis, diagnose
    ("hfadapt.judge",),
    # what is built on judging: batch sweeps, the drafting agent, the load-time library API
    ("hfadapt.sweep", "hfadapt.agent", "hfadapt.api"),
    # what sweeps found: failure census, coverage, diff, HTML
    ("hfadapt.report",),
    # hfadapt as a service: a cycle (crawl, sweep, compare with the last cycle, report)
    ("hfadapt.service",),
    # the command line
    ("hfadapt.cli",),
    # the package itself: ``hfadapt.load`` / ``hfadapt.adapt`` forward to hfadapt.api lazily;
    # ``python -m hfadapt`` runs the command line
    ("hfadapt", "hfadapt.__main__"),
)


def layer_of(module: str) -> tuple[int, str]:
    """(layer index, the prefix that placed it) for a module of the package."""
    best: tuple[int, str] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or (prefix != "hfadapt" and module.startswith(prefix + "."))
            if inside and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    if best is None:
        raise KeyError(f"{module} is in no layer of hfadapt.layers.LAYERS")
    return best
