"""Getting the adapter file out of an answer: the fenced code blocks, and which one is the
draft. No code, or two different drafts in one answer, is a DraftError whose text goes back
to the agent as feedback."""

from __future__ import annotations

import ast
import re

from hfadapt.errors import DraftError

FENCE = re.compile(
    r"^[ \t]*(`{3,}|~{3,})[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.M | re.S
)
PYTHON_TAGS = {"", "python", "py", "python3"}


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language tag, body) of every fenced block, in order."""
    return [(m.group(2).lower(), m.group(3)) for m in FENCE.finditer(text)]


def normalized(code: str) -> str:
    """A form of a draft that ignores formatting and comments (for "identical draft" checks)."""
    try:
        return ast.dump(ast.parse(code))
    except SyntaxError:
        return "\n".join(line.rstrip() for line in code.strip().splitlines())


def extract_code(text: str) -> str:
    """The one adapter file an answer holds."""
    blocks = [body for tag, body in code_blocks(text) if tag in PYTHON_TAGS]
    if not blocks:
        if "@adapter" in text and "def " in text and "```" not in text:
            try:
                ast.parse(text)
                return text.strip() + "\n"  # an answer that is nothing but the file
            except SyntaxError:
                pass
        raise DraftError(
            "the answer holds no ```python code block; answer with the complete adapter file in one"
        )
    drafts = [b for b in blocks if "@adapter" in b] or blocks
    distinct = list(dict.fromkeys(normalized(b) for b in drafts))
    if len(distinct) > 1:
        raise DraftError(
            f"the answer holds {len(drafts)} different code blocks with an adapter; answer with exactly one complete file"
        )
    return drafts[0].strip() + "\n"
