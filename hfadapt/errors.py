"""Typed errors of hfadapt. The library raises these; only the CLI turns them into
one-line messages and exit codes: 1 the model failed (and every error not listed below),
2 bad input (options, ids, paths, a database that cannot be used), 3 something this machine
lacks (a package, bubblewrap, the Hub when it was asked for).

    HfadaptError
    ├── InputError                      bad input from the user: exit code 2
    │   ├── NotFoundError               a named thing that does not exist (adapter, attempt, run)
    │   │   └── ModelNotFoundError      no such Hub id, folder or cached model
    │   ├── ConfigError                 config.json missing, unreadable, no/unknown model_type
    │   ├── WeightsError                corrupt or missing weights
    │   ├── TokenizerError              tokenizer missing or unreadable
    │   ├── UsageError                  options that do not fit together
    │   │   └── EnvironmentChangedError a sweep resumed on other packages or arithmetic
    │   └── OutputError                 an output file that cannot be written
    ├── StoreError                      runs.db cannot be used: exit code 2
    │   ├── SchemaVersionError          written by another hfadapt version; says what to do
    │   ├── MigrationImpossible         a table that cannot be brought to the new shape
    │   └── DatabaseUnavailableError    corrupt, read-only or unreachable database
    ├── HubError                        the Hub (or a mirror) did not give a usable answer
    │   ├── HubUnreachableError         connection refused, DNS, timeout: exit code 3
    │   └── HubResponseError            an answer that is not what the Hub API returns
    ├── DeviceError                     the simulated Spyre device
    │   ├── ProfileError                a device profile file that does not load
    │   ├── SpyreUnsupportedModelError  the model cannot run at all (alignment, dtype)
    │   └── SpyreLoweringError          a graph that does not lower; carries the report
    │       └── SpyreOpError            an eager op the device refuses (also a RuntimeError)
    │           └── SpyreOpNotImplementedError  no device kernel (also a NotImplementedError)
    ├── CustomCodeError                 needs the repo's own code, not run unasked (custom_code)
    ├── StandInTooLargeError            no structural stand-in fits the memory budget (skipped)
    ├── SweepError                      the sweep machinery (workers cannot start, Ray unreachable)
    ├── IsolationUnavailableError       no OS sandbox (bubblewrap) here: exit code 3
    ├── MissingDependencyError          a package this needs is not installed (Ray): exit code 3
    ├── UntrustedDataError              data from a sandbox or server out of bounds (also ValueError)
    ├── AdapterError                    an adapter file or its application
    │   └── GraphError                  a drafted graph that does not validate (op, constant, shape)
    └── AgentError                      the adapter-drafting agent
        ├── EndpointError               the OpenAI-compatible endpoint failed
        ├── DraftError                  an answer that holds no usable code
        ├── PromptError                 a prompt template that does not render (missing value)
        └── SandboxError                the sandbox process could not be started or read
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from typing import Any

# A parameter named in a message: ``{option:db}``. The library shows the parameter's name
# (`db`); the CLI shows its flag (--db). No flag text is written into library messages.
_OPTION = re.compile(r"\{option:([a-z_]+)\}")


def option(name: str) -> str:
    """The marker for parameter ``name`` inside an error message."""
    return "{option:" + name + "}"


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """ "; did you mean 'x'?" naming the entry of ``known`` closest to ``word`` (difflib, case
    ignored), or "" when none is close or ``word`` is one of them: the tail of a "no such
    name" message."""
    by_key: dict[str, str] = {}
    for name in known:
        by_key.setdefault(name.lower(), name)
    key = word.strip().lower()
    if not key or key in by_key:
        return ""
    close = difflib.get_close_matches(key, list(by_key), n=1, cutoff=0.75)
    return f"; did you mean {by_key[close[0]]!r}?" if close else ""


def as_flag(name: str) -> str:
    """The CLI flag of a library parameter: ``trust_remote_code`` -> ``--trust-remote-code``."""
    return "--" + name.replace("_", "-")


class HfadaptError(Exception):
    """Base of every error hfadapt raises on purpose."""

    exit_code = 1

    def __str__(self) -> str:
        return _OPTION.sub(lambda m: f"`{m.group(1)}`", super().__str__())

    def one_line(self, *, flags: bool = False) -> str:
        """The message a user sees: a single line, no traceback. ``flags``: parameters named
        as the CLI's flags (``--db``) instead of the library's names (`db`)."""
        text = super().__str__() or self.__class__.__name__
        text = _OPTION.sub(lambda m: as_flag(m.group(1)) if flags else f"`{m.group(1)}`", text)
        return " ".join(text.split())


class InputError(HfadaptError):
    exit_code = 2


class NotFoundError(InputError):
    """A name that matches nothing: no such adapter, attempt, sweep or recorded run."""


class ModelNotFoundError(NotFoundError):
    pass


class ConfigError(InputError):
    pass


class WeightsError(InputError):
    pass


class TokenizerError(InputError):
    pass


class UsageError(InputError):
    pass


class EnvironmentChangedError(UsageError):
    """A sweep resumed in an environment (packages, numeric path) other than the one its runs
    recorded, without leave to; ``changes`` names each key that differs."""

    def __init__(self, message: str, changes: Any = ()) -> None:
        super().__init__(message)
        self.changes = list(changes)


class OutputError(InputError):
    """An output path that cannot be written (no such folder, a directory, read-only, full)."""


class StoreError(HfadaptError):
    exit_code = 2


class SchemaVersionError(StoreError):
    pass


class MigrationImpossible(StoreError):
    """Raised inside a migration when an existing table cannot be brought to the new shape."""


class DatabaseUnavailableError(StoreError):
    pass


class HubError(HfadaptError):
    pass


class HubUnreachableError(HubError):
    exit_code = 3


class HubResponseError(HubError):
    pass


class DeviceError(HfadaptError):
    pass


class ProfileError(DeviceError):
    exit_code = 2


class SpyreUnsupportedModelError(DeviceError):
    """Raised before compiling when the model's shape cannot be lowered at all."""

    def __init__(self, message: str, rule_id: str | None = None) -> None:
        super().__init__(message)
        self.rule_id = rule_id


class SpyreLoweringError(DeviceError):
    """A graph with one or more violations; ``report`` holds every one of them."""

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class SpyreOpError(SpyreLoweringError, RuntimeError):
    """An op the eager device refuses (layout, dtype): raised where the op runs, with the text
    the card prints; ``violations`` says which profile rules and where in the model."""

    def __init__(self, message: str, violations: Any = (), report: Any = None) -> None:
        super().__init__(message, report)
        self.violations = list(violations)


class SpyreOpNotImplementedError(SpyreOpError, NotImplementedError):
    """An op the eager device has no kernel for: torch-spyre's ``NotImplementedError``
    ("Could not run 'aten::X' with arguments from the 'PrivateUse1' backend...")."""


class AdapterError(HfadaptError):
    pass


class GraphError(AdapterError):
    """A graph artifact (an agent's draft captured as ATen ops) that does not validate: an op
    outside the allowlist, a reference out of order, a constant or shape hfadapt does not know."""


class UntrustedDataError(HfadaptError, ValueError):
    """Data from a sandbox or a server that is out of bounds (too large, too deep, malformed)."""


class AgentError(HfadaptError):
    pass


class EndpointError(AgentError):
    """The agent endpoint failed; ``retries`` is how many retries were spent before it did."""

    def __init__(self, message: str, *, retries: int = 0) -> None:
        super().__init__(message)
        self.retries = retries


class DraftError(AgentError):
    pass


class PromptError(AgentError):
    """A prompt template names a placeholder no value was given for (never rendered empty)."""

    exit_code = 2


class SandboxError(AgentError):
    pass


class IsolationUnavailableError(HfadaptError):
    """OS isolation (bubblewrap) cannot be had here; untrusted code is refused, not run bare."""

    exit_code = 3


class MissingDependencyError(HfadaptError):
    """An optional package an option needs is not installed (``--executor ray`` without Ray)."""

    exit_code = 3


class CustomCodeError(HfadaptError):
    """The model needs code from its repository (``auto_map``) and running it was not asked for
    (``--trust-remote-code``): judged as the ``custom_code`` verdict, never run unasked."""


class StandInTooLargeError(HfadaptError):
    """A structural stand-in that no sizing fits in the memory budget of a judge
    (hfadapt.loading.sizing): judged as the ``skipped`` verdict, with the memory it needs."""


class SweepError(HfadaptError):
    """The sweep machinery itself failed (workers cannot start, Ray is unreachable)."""
