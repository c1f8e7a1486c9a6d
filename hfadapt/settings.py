"""Every environment variable hfadapt reads, read here and nowhere else (as huggingface_hub's
``constants``). Each is a :class:`Variable` with its default and what it holds; ``VARIABLES``
lists them all, and docs/settings.md is that list as a table (a test keeps the two equal).

Values are read when asked for, not at import: the same process may change them (tests do, and
so do sweeps, for the worker processes they start). An empty value counts as unset. Code that
sets variables for itself or for the processes it starts uses :func:`exported` or
:func:`export`; the sandboxes pass on only an allowlist of :func:`environment`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hfadapt.errors import UsageError

__all__ = [
    "VARIABLES",
    "Variable",
    "adapter_folders",
    "agent_api_key",
    "agent_base_url",
    "agent_model",
    "c_compiler",
    "database",
    "device_heap",
    "drafts_home",
    "environment",
    "export",
    "exported",
    "hf_home",
    "hf_hub_cache",
    "hf_token_files",
    "hub_endpoint",
    "hub_offline",
    "kernel_cache",
    "native_dl16",
    "python_path",
    "reference_cache_enabled",
    "reference_cache_mb",
    "replace_environment",
    "scratch_dir",
    "spyre_autoload",
    "spyre_devices",
    "terminal_columns",
    "threads",
    "verbose",
]


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, its default (as a person reads it) and what it
    holds. ``owner``: "hfadapt" for hfadapt's own, else the library whose variable hfadapt
    reads the same way that library does; "set" for one hfadapt sets in processes it starts."""

    name: str
    default: str
    holds: str
    owner: str = "hfadapt"

    def value(self) -> str | None:
        """The value now, or None when unset or empty."""
        raw = os.environ.get(self.name)
        return raw if raw else None


_TRUE = ("1", "true", "yes", "on")

HFADAPT_DB = Variable(
    "HFADAPT_DB",
    "./runs.db",
    "the database every command uses without --db: a path to an SQLite file, or a URL "
    "(postgresql://user:password@host/db)",
)
HFADAPT_HOME = Variable(
    "HFADAPT_HOME",
    "~/.local/share/hfadapt",
    "hfadapt's data folder; accepted agent drafts are kept in its adapters/ folder",
)
HFADAPT_ADAPTERS_PATH = Variable(
    "HFADAPT_ADAPTERS_PATH",
    "(none)",
    "more folders of adapter files for the registry, separated like PATH",
)
HFADAPT_CACHE_DIR = Variable(
    "HFADAPT_CACHE_DIR",
    "$XDG_CACHE_HOME/hfadapt, else ~/.cache/hfadapt",
    "where hfadapt keeps what it builds for itself: the DL16 kernels (built with the C "
    "compiler), the compile cache (compile/) and the CPU reference cache (reference/); all of "
    "it can be deleted at any time",
)
HFADAPT_COMPILE_CACHE = Variable(
    "HFADAPT_COMPILE_CACHE",
    "1",
    "0: the simulated device's compile cache ($HFADAPT_CACHE_DIR/compile) is neither read nor "
    "written",
)
HFADAPT_COMPILE_CACHE_MB = Variable(
    "HFADAPT_COMPILE_CACHE_MB",
    "256",
    "the compile cache's size bound in MB (least recently used entries go first)",
)
HFADAPT_REFERENCE_CACHE = Variable(
    "HFADAPT_REFERENCE_CACHE",
    "1",
    "0: diagnose neither reads nor writes the CPU reference cache ($HFADAPT_CACHE_DIR/reference: "
    "a model's fp32 reference on the probes, keyed by its weights, config, code and inputs)",
)
HFADAPT_REFERENCE_CACHE_MB = Variable(
    "HFADAPT_REFERENCE_CACHE_MB",
    "256",
    "the CPU reference cache's size bound in MB (least recently used entries go first)",
)
HFADAPT_NATIVE_DL16 = Variable(
    "HFADAPT_NATIVE_DL16",
    "1",
    "0: never build or load the C DL16 kernels; the same arithmetic runs as torch ops, slower",
)
HFADAPT_NATIVE_AMX = Variable(
    "HFADAPT_NATIVE_AMX",
    "1",
    "0: the device's products of DL16 operands never use AMX's bf16 tiles (where the CPU has "
    "them); MKL's fp32 products make every piece, as on a CPU without AMX",
)
HFADAPT_DEVICE_HEAP = Variable(
    "HFADAPT_DEVICE_HEAP",
    "1",
    "0: the simulated device leaves glibc's malloc settings alone; by default its first op "
    "raises malloc's mmap and trim thresholds to 1 GiB, so freed memory is reused as a card's "
    "caching allocator reuses its pool (the process keeps its peak memory)",
)
HFADAPT_SPYRE_AUTOLOAD = Variable(
    "HFADAPT_SPYRE_AUTOLOAD",
    "1",
    "0: import torch does not register the simulated spyre device (register it explicitly "
    "with hfadapt.register_device())",
)
HFADAPT_SPYRE_DEVICES = Variable(
    "HFADAPT_SPYRE_DEVICES",
    "1",
    "how many simulated spyre cards this process has (torch.spyre.device_count())",
)
HFADAPT_VERBOSE = Variable(
    "HFADAPT_VERBOSE",
    "0",
    "1: hfadapt.load and hfadapt.diagnose let other libraries' warnings, log records and "
    "progress bars through (by default they are held back and counted: "
    "hfadapt.held_message_counts())",
)
HFADAPT_AGENT_MODEL = Variable(
    "HFADAPT_AGENT_MODEL", "(none)", "the model name hfadapt draft asks the endpoint for"
)
OPENAI_BASE_URL = Variable(
    "OPENAI_BASE_URL",
    "(none)",
    "the OpenAI-compatible endpoint hfadapt draft and agent-eval use without --base-url",
    owner="openai",
)
OPENAI_API_KEY = Variable(
    "OPENAI_API_KEY",
    "(none)",
    "the endpoint's API key without --api-key (never passed into a sandbox)",
    owner="openai",
)
HF_HUB_OFFLINE = Variable(
    "HF_HUB_OFFLINE",
    "0",
    "1: no Hub requests; crawl reads the bundled snapshot, models come from the HF cache",
    owner="huggingface_hub",
)
TRANSFORMERS_OFFLINE = Variable(
    "TRANSFORMERS_OFFLINE", "0", "1: the same as HF_HUB_OFFLINE", owner="transformers"
)
HF_ENDPOINT = Variable(
    "HF_ENDPOINT",
    "https://huggingface.co",
    "the Hub (or a mirror) that crawl, config downloads and model downloads use",
    owner="huggingface_hub",
)
HF_HOME = Variable(
    "HF_HOME",
    "$XDG_CACHE_HOME/huggingface, else ~/.cache/huggingface",
    "the Hugging Face folder: the login token files, and the hub cache unless HF_HUB_CACHE",
    owner="huggingface_hub",
)
HF_HUB_CACHE = Variable(
    "HF_HUB_CACHE",
    "$HF_HOME/hub",
    "the Hugging Face cache of models and configs (HUGGINGFACE_HUB_CACHE is the old name)",
    owner="huggingface_hub",
)
HUGGINGFACE_HUB_CACHE = Variable(
    "HUGGINGFACE_HUB_CACHE", "(none)", "the old name of HF_HUB_CACHE", owner="huggingface_hub"
)
HF_TOKEN_PATH = Variable(
    "HF_TOKEN_PATH",
    "$HF_HOME/token",
    "the login token file, whose token is redacted from everything stored",
    owner="huggingface_hub",
)
HF_STORED_TOKENS_PATH = Variable(
    "HF_STORED_TOKENS_PATH",
    "$HF_HOME/stored_tokens",
    "the stored tokens file, whose tokens are redacted from everything stored",
    owner="huggingface_hub",
)
XDG_CACHE_HOME = Variable(
    "XDG_CACHE_HOME", "~/.cache", "the base of the default cache folders", owner="XDG"
)
TORCH_DEVICE_BACKEND_AUTOLOAD = Variable(
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
    "1",
    "0: import torch loads no device backend, the simulated spyre device included",
    owner="torch",
)
OMP_NUM_THREADS = Variable(
    "OMP_NUM_THREADS",
    "1 inside a sandbox",
    "torch's thread count; a sandboxed judge inherits it, and sweep workers set it",
    owner="OpenMP",
)
CC = Variable("CC", "cc, else gcc", "the C compiler that builds the DL16 kernels", owner="make")
COLUMNS = Variable(
    "COLUMNS",
    "(none)",
    "the width of tables when output is piped (unset: as wide as their content)",
    owner="POSIX",
)
TMPDIR = Variable(
    "TMPDIR", "/tmp", "inside a drafting sandbox: the one folder a draft may write", owner="POSIX"
)
PYTHONPATH = Variable(
    "PYTHONPATH",
    "(none)",
    "kept (after hfadapt's own folder) in the sandboxes' import path",
    owner="Python",
)
HFADAPT_SANDBOX = Variable(
    "HFADAPT_SANDBOX", "(unset)", "1 inside every sandbox hfadapt starts", owner="set"
)
HFADAPT_CAPTURE_ROUND = Variable(
    "HFADAPT_CAPTURE_ROUND",
    "(unset)",
    "2 while a draft is captured a second time under changed state (threads, environment), "
    "so a draft that reads its environment captures differently and is refused",
    owner="set",
)
HFADAPT_TEST_WORKERS = Variable(
    "HFADAPT_TEST_WORKERS",
    "auto",
    "how many pytest worker processes scripts/check starts (0: the tests run in one process)",
    owner="scripts/check",
)

VARIABLES: tuple[Variable, ...] = (
    HFADAPT_DB,
    HFADAPT_HOME,
    HFADAPT_ADAPTERS_PATH,
    HFADAPT_CACHE_DIR,
    HFADAPT_NATIVE_DL16,
    HFADAPT_NATIVE_AMX,
    HFADAPT_DEVICE_HEAP,
    HFADAPT_COMPILE_CACHE,
    HFADAPT_COMPILE_CACHE_MB,
    HFADAPT_REFERENCE_CACHE,
    HFADAPT_REFERENCE_CACHE_MB,
    HFADAPT_SPYRE_AUTOLOAD,
    HFADAPT_SPYRE_DEVICES,
    HFADAPT_VERBOSE,
    HFADAPT_AGENT_MODEL,
    OPENAI_BASE_URL,
    OPENAI_API_KEY,
    HF_HUB_OFFLINE,
    TRANSFORMERS_OFFLINE,
    HF_ENDPOINT,
    HF_HOME,
    HF_HUB_CACHE,
    HUGGINGFACE_HUB_CACHE,
    HF_TOKEN_PATH,
    HF_STORED_TOKENS_PATH,
    XDG_CACHE_HOME,
    TORCH_DEVICE_BACKEND_AUTOLOAD,
    OMP_NUM_THREADS,
    CC,
    COLUMNS,
    TMPDIR,
    PYTHONPATH,
    HFADAPT_SANDBOX,
    HFADAPT_CAPTURE_ROUND,
    HFADAPT_TEST_WORKERS,
)


def _home() -> Path:
    return Path(os.path.expanduser("~"))


def _cache_base() -> Path:
    return Path(XDG_CACHE_HOME.value() or _home() / ".cache").expanduser()


# ---- hfadapt's own --------------------------------------------------------------------------


def database() -> str | None:
    """``$HFADAPT_DB``: the database URL or SQLite path (None: ./runs.db)."""
    return HFADAPT_DB.value()


def drafts_home() -> Path:
    """``$HFADAPT_HOME``: hfadapt's data folder (accepted drafts go to its ``adapters/``)."""
    raw = HFADAPT_HOME.value()
    return Path(raw).expanduser() if raw else _home() / ".local" / "share" / "hfadapt"


def adapter_folders() -> list[Path]:
    """The folders ``$HFADAPT_ADAPTERS_PATH`` names, in order."""
    return [Path(p) for p in (HFADAPT_ADAPTERS_PATH.value() or "").split(os.pathsep) if p]


def kernel_cache() -> Path:
    """``$HFADAPT_CACHE_DIR``: where built DL16 kernels are cached."""
    raw = HFADAPT_CACHE_DIR.value()
    return Path(raw).expanduser() if raw else _cache_base() / "hfadapt"


def compile_cache_enabled() -> bool:
    """Whether the compile cache is read and written (``HFADAPT_COMPILE_CACHE`` not 0)."""
    return HFADAPT_COMPILE_CACHE.value() != "0"


def _megabytes(variable: Variable, default: float) -> float:
    raw = variable.value()
    try:
        return float(raw) if raw else default
    except ValueError:
        return default


def compile_cache_mb(default: float) -> float:
    """``HFADAPT_COMPILE_CACHE_MB``: the compile cache's bound (``default`` when unset or not a
    number)."""
    return _megabytes(HFADAPT_COMPILE_CACHE_MB, default)


def reference_cache_enabled() -> bool:
    """Whether diagnose reads and writes the CPU reference cache (``HFADAPT_REFERENCE_CACHE``
    not 0)."""
    return HFADAPT_REFERENCE_CACHE.value() != "0"


def reference_cache_mb(default: float) -> float:
    """``HFADAPT_REFERENCE_CACHE_MB``: the reference cache's bound (``default`` when unset or
    not a number)."""
    return _megabytes(HFADAPT_REFERENCE_CACHE_MB, default)


def native_dl16() -> bool:
    """Whether the C DL16 kernels may be built and loaded (``HFADAPT_NATIVE_DL16`` not 0)."""
    return HFADAPT_NATIVE_DL16.value() != "0"


def native_amx() -> bool:
    """Whether the device's products may use AMX's bf16 tiles (``HFADAPT_NATIVE_AMX`` not 0)."""
    return HFADAPT_NATIVE_AMX.value() != "0"


def device_heap() -> bool:
    """Whether the simulated device may raise malloc's thresholds (``HFADAPT_DEVICE_HEAP``
    not 0)."""
    return HFADAPT_DEVICE_HEAP.value() != "0"


def c_compiler() -> str | None:
    """``$CC``, or None (the caller looks for cc or gcc on PATH)."""
    return CC.value()


def spyre_autoload() -> bool:
    """Whether ``import torch`` registers the simulated device: neither
    ``HFADAPT_SPYRE_AUTOLOAD=0`` nor torch's ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``."""
    return (
        HFADAPT_SPYRE_AUTOLOAD.value() != "0"
        and (TORCH_DEVICE_BACKEND_AUTOLOAD.value() or "1") == "1"
    )


def spyre_devices() -> int:
    """``$HFADAPT_SPYRE_DEVICES``: how many simulated cards (at least 1)."""
    raw = HFADAPT_SPYRE_DEVICES.value()
    if raw is None:
        return 1
    try:
        count = int(raw)
    except ValueError:
        raise UsageError(
            f"{HFADAPT_SPYRE_DEVICES.name} must be a whole number of cards, not {raw!r}"
        ) from None
    return max(1, count)


def verbose() -> bool:
    """Whether library calls let other libraries' messages through (``HFADAPT_VERBOSE``)."""
    return (HFADAPT_VERBOSE.value() or "").lower() in _TRUE


def agent_model() -> str | None:
    """``$HFADAPT_AGENT_MODEL``: the model the drafting agent asks for."""
    return HFADAPT_AGENT_MODEL.value()


def agent_base_url() -> str | None:
    """``$OPENAI_BASE_URL``: the agent's OpenAI-compatible endpoint."""
    return OPENAI_BASE_URL.value()


def agent_api_key() -> str | None:
    """``$OPENAI_API_KEY``: the agent endpoint's key."""
    return OPENAI_API_KEY.value()


# ---- the Hugging Face libraries' own, read the way they read them ---------------------------


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE``, read now (huggingface_hub reads it once,
    at import)."""
    return any(
        (v.value() or "").strip().lower() in _TRUE for v in (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE)
    )


def hub_endpoint() -> str | None:
    """``$HF_ENDPOINT`` without a trailing slash, or None (huggingface.co)."""
    raw = HF_ENDPOINT.value()
    return raw.rstrip("/") if raw else None


def hf_home() -> Path:
    """``$HF_HOME``, else ``$XDG_CACHE_HOME/huggingface``."""
    raw = HF_HOME.value()
    return Path(raw).expanduser() if raw else _cache_base() / "huggingface"


def hf_hub_cache() -> Path:
    """The HF hub cache as the environment says now: ``$HF_HUB_CACHE`` (or its old name),
    else ``$HF_HOME/hub``."""
    raw = HF_HUB_CACHE.value() or HUGGINGFACE_HUB_CACHE.value()
    return Path(raw).expanduser() if raw else hf_home() / "hub"


def hf_token_files() -> list[Path]:
    """The files huggingface_hub keeps login tokens in."""
    home = hf_home()
    return [
        Path(HF_TOKEN_PATH.value() or home / "token"),
        Path(HF_STORED_TOKENS_PATH.value() or home / "stored_tokens"),
    ]


# ---- the process's own ----------------------------------------------------------------------


def threads() -> str | None:
    """``$OMP_NUM_THREADS``, as given."""
    return OMP_NUM_THREADS.value()


def terminal_columns() -> str | None:
    """``$COLUMNS``: a width the user asked for."""
    return COLUMNS.value()


def scratch_dir() -> str:
    """``$TMPDIR``, else /tmp."""
    return TMPDIR.value() or "/tmp"


def python_path() -> list[str]:
    """The folders of ``$PYTHONPATH``."""
    return [p for p in (PYTHONPATH.value() or "").split(os.pathsep) if p]


def environment() -> Mapping[str, str]:
    """The whole environment, read-only: for the sandboxes' allowlist (which passes only named
    variables on) and the scan that redacts secret-looking values."""
    return dict(os.environ)


def replace_environment(values: Mapping[str, str]) -> None:
    """Make ``values`` this process's whole environment (a forked child taking the environment
    its parent has now, not the one its fork server started with)."""
    os.environ.clear()
    os.environ.update(values)


def export(values: Mapping[str, str]) -> None:
    """Set ``values`` for the rest of this process (a worker process preparing itself)."""
    os.environ.update(values)


@contextlib.contextmanager
def exported(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` while inside, then put back what was there (or nothing)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
