"""Reading what untrusted code or servers produced: a sandbox's result, an endpoint's answer, a
model's own code's diagnosis. Everything passes through here before it is stored, printed or
sent anywhere: JSON parsed with a byte and nesting bound (no RecursionError, no gigabyte
strings), text stripped of control characters and cut to a length, and secrets redacted.

This module imports only the standard library and :mod:`hfadapt.errors`, so any layer may use it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

from hfadapt import settings
from hfadapt.errors import UntrustedDataError

MAX_DEPTH = 16
MAX_STRING = 4000
MAX_ITEMS = 2000
REDACTED = "[redacted]"

# Terminal escape sequences whole (CSI ... final byte, OSC ... BEL or ST, two-byte ones, the
# 8-bit CSI), then any other control character but newline and tab (ESC starts escape
# sequences, and the others have no business in a stored reason or name), DEL, the C1
# controls, the line and paragraph separators, and the bidirectional overrides and isolates.
_CONTROL = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|\x9b[0-?]*[ -/]*[@-~]"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
# A line ending of another system (CRLF, a lone CR) becomes a newline before the rest goes.
_CR = re.compile(r"\r\n?")
# The password in a URL's userinfo (scheme://user:password@host), and the value of a query
# parameter that names a secret (?password=..., ?sslpassword=..., ?api_key=...).
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s:/?#@]*):(?P<pw>[^\s/?#]*)@"
)
_URL_SECRET_PARAM = re.compile(
    r"(?P<head>[?&](?:[A-Za-z0-9_\-]*(?:passw|secret|token|api_?key)[A-Za-z0-9_\-]*)=)(?P<value>[^&\s#]*)",
    re.IGNORECASE,
)
HIDDEN = "***"

# Token-shaped strings: Hugging Face, OpenAI-style, GitHub, AWS, Slack tokens, JWTs, private
# keys. A false positive costs a redacted word; a miss would send a credential to an endpoint.
_TOKEN_PATTERNS = (
    r"hf_[A-Za-z0-9]{20,}",
    r"sk-[A-Za-z0-9_\-]{16,}",
    r"(?:ghp|gho|ghs|ghu|ghr|github_pat)_[A-Za-z0-9_]{20,}",
    r"AKIA[0-9A-Z]{16}",
    r"xox[abprs]-[A-Za-z0-9\-]{10,}",
    r"eyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}",
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)",
)
_TOKENS = re.compile("|".join(f"(?:{p})" for p in _TOKEN_PATTERNS))
# Environment variables whose value is a secret (the same rule the sandbox's environment uses).
SECRET_NAME = re.compile(
    r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE", re.IGNORECASE
)


def strip_control(value: object) -> str:
    """``value`` as a string without control characters: escape sequences removed whole,
    CRLF and a lone CR turned into a newline, newlines and tabs kept, nothing cut."""
    return _CONTROL.sub("", _CR.sub("\n", str(value)))


def clean_text(value: object, max_len: int = MAX_STRING) -> str:
    """``value`` as a string without control characters (:func:`strip_control`: newlines and
    tabs kept), cut to ``max_len`` characters (with an ellipsis)."""
    text = strip_control(value)
    return text if len(text) <= max_len else text[: max(0, max_len - 3)] + "..."


def one_line(value: object, max_len: int = 300) -> str:
    """``value`` as one clean line (whitespace runs folded), cut to ``max_len``."""
    return clean_text(" ".join(str(value).split()), max_len)


# A JSON string (escapes included), or an unterminated one running to the end of the text.
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]+")
_DEPTH_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _depth_ok(text: str, max_depth: int) -> bool:
    """Whether no array/object nests deeper than ``max_depth`` (brackets inside strings are
    skipped): checked before ``json.loads``, whose recursion a deep document would exhaust.
    The strings go first and the scan then walks the brackets alone (in C but for them)."""
    depth = 0
    for run in _BRACKETS.findall(_JSON_STRING.sub("", text)):
        for ch in run.encode("ascii"):
            depth += _DEPTH_STEP[ch]
            if depth > max_depth:
                return False
    return True


def parse_json(
    data: bytes | str, *, max_bytes: int = 32 * 1024 * 1024, max_depth: int = MAX_DEPTH
) -> Any:
    """Parse untrusted JSON: at most ``max_bytes``, nesting at most ``max_depth``, no NaN or
    Infinity literals. Raises UntrustedDataError with one line saying what was wrong."""
    if len(data) > max_bytes:
        raise UntrustedDataError(f"{len(data)} bytes, more than the {max_bytes} allowed")
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    if not _depth_ok(text, max_depth):
        raise UntrustedDataError(f"nested deeper than {max_depth} levels")

    def no_constant(name: str) -> Any:
        raise UntrustedDataError(f"the JSON constant {name} is not allowed")

    try:
        return json.loads(text, parse_constant=no_constant)
    except UntrustedDataError:
        raise
    except (ValueError, RecursionError) as exc:
        raise UntrustedDataError(f"not valid JSON: {one_line(exc, 200)}") from exc


def bounded(
    value: object,
    *,
    max_depth: int = 8,
    max_string: int = MAX_STRING,
    max_items: int = 200,
    _depth: int = 0,
) -> Any:
    """A copy of a JSON-like value fit to store: strings cleaned and cut, lists and objects
    cut to ``max_items``, nesting past ``max_depth`` replaced by a marker, keys as clean
    strings, non-finite floats as strings; anything that is not JSON becomes its clean text."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**63 else clean_text(value, 40)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return clean_text(value, max_string)
    if _depth >= max_depth:
        return "[nested too deep]"
    kw = {"max_depth": max_depth, "max_string": max_string, "max_items": max_items}
    if isinstance(value, dict):
        items = list(value.items())[:max_items]
        return {clean_text(k, 200): bounded(v, _depth=_depth + 1, **kw) for k, v in items}
    if isinstance(value, (list, tuple)):
        return [bounded(v, _depth=_depth + 1, **kw) for v in list(value)[:max_items]]
    return clean_text(value, max_string)


# -- secrets ------------------------------------------------------------------------------------


# Credential-named variables that hold where something is, not a secret (HF_TOKEN_PATH).
_LOCATION = re.compile(r"_(PATH|DIR|FILE|HOME|URL)$", re.IGNORECASE)


def known_secrets(extra: Iterable[str | None] = ()) -> list[str]:
    """Secret values this process knows of: ``extra`` (an API key), every credential-named
    environment variable, and the Hugging Face tokens on disk (``token``, ``stored_tokens``).
    Values shorter than 8 characters are left out (they would redact ordinary words)."""
    found = [s for s in extra if s]
    found += [
        v
        for k, v in settings.environment().items()
        if SECRET_NAME.search(k) and not _LOCATION.search(k)
    ]
    for path in settings.hf_token_files():
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            # stored_tokens is an INI file: "token = hf_..."; token holds the bare token
            value = line.split("=", 1)[1] if "=" in line else line
            found.append(value.strip())
    return sorted({s for s in found if len(s) >= 8}, key=len, reverse=True)


def hide_url_credentials(text: str) -> str:
    """``text`` with the password of every URL in it (``scheme://user:password@host``) and
    every secret-named query parameter's value (``?password=...``) replaced by ``***``:
    what a message, a hint or a log line may show of a database or endpoint URL."""
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{HIDDEN}@", text)
    if "=" in text:
        text = _URL_SECRET_PARAM.sub(lambda m: f"{m['head']}{HIDDEN}", text)
    return text


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every known secret value and every token-shaped string replaced by
    ``[redacted]``, and the passwords of URLs in it hidden (:func:`hide_url_credentials`)."""
    for secret in secrets:
        if secret and len(secret) >= 8:
            text = text.replace(secret, REDACTED)
    return hide_url_credentials(_TOKENS.sub(REDACTED, text))


def redact_value(value: object, secrets: Iterable[str] = ()) -> Any:
    """:func:`redact` applied to every string inside a JSON-like value (keys included)."""
    secrets = list(secrets)
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {redact_value(k, secrets): redact_value(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v, secrets) for v in value]
    return value


__all__ = [
    "HIDDEN",
    "REDACTED",
    "SECRET_NAME",
    "bounded",
    "clean_text",
    "hide_url_credentials",
    "known_secrets",
    "one_line",
    "parse_json",
    "redact",
    "redact_value",
    "strip_control",
]
