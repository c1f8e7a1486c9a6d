"""Prompt templates: files in ``prompts/`` with ``{{ name }}`` placeholders. Rendering is strict
both ways: a placeholder without a value is an error (never an empty string), and so is a
value the template does not use (a renamed placeholder would otherwise vanish silently)."""

from __future__ import annotations

import re
from pathlib import Path

from hfadapt.errors import PromptError

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


def prompts_dir() -> Path:
    """``prompts/`` of a checkout, else the copy the wheel carries in ``hfadapt/_bundled``."""
    package = Path(__file__).resolve().parent.parent
    checkout = package.parent / "prompts"
    if checkout.is_dir() and (package.parent / "pyproject.toml").exists():
        return checkout
    return package / "_bundled" / "prompts"


def load_template(name: str, folder: Path | None = None) -> str:
    path = (folder or prompts_dir()) / f"{name}.md"
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PromptError(f"prompt template {path} cannot be read: {exc.strerror}") from exc


def placeholders(template: str) -> list[str]:
    """The placeholder names of a template, in order of first use."""
    return list(dict.fromkeys(PLACEHOLDER.findall(template)))


def render_text(template: str, values: dict[str, object], *, name: str = "template") -> str:
    """Fill every placeholder; values are inserted verbatim (no further substitution)."""
    wanted = placeholders(template)
    missing = [p for p in wanted if values.get(p) is None or not str(values[p]).strip()]
    if missing:
        raise PromptError(f"prompt {name}: no value (or an empty one) for {', '.join(missing)}")
    unused = sorted(set(values) - set(wanted))
    if unused:
        raise PromptError(f"prompt {name}: value(s) {', '.join(unused)} match no placeholder")
    # One pass with a callback, so a value containing "{{ x }}" is never expanded again.
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), template)


def render(name: str, folder: Path | None = None, **values: object) -> str:
    """Render ``prompts/<name>.md``."""
    return render_text(load_template(name, folder), values, name=f"{name}.md")
