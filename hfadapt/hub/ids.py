"""What a Hugging Face model id may be: ``name`` or ``namespace/name``, ASCII letters, digits,
``-``, ``_`` and ``.``, at most 96 characters a part, no ``--`` or ``..``, not ending in
``.git`` (huggingface_hub's ``validate_repo_id``, which the Hub enforces, restricted to ASCII
as the Hub's names are). The crawler refuses listing entries whose id breaks it (a mirror or a
lying ``--endpoint`` could send anything, and the id becomes a path in the HF cache, a URL in
the report and a line on the terminal); ``diagnose`` refuses such an id in every mode."""

from __future__ import annotations

__all__ = ["invalid_model_id"]


def invalid_model_id(model_id: object) -> str | None:
    """Why ``model_id`` is not a Hub model id, or None when it is one."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not isinstance(model_id, str) or not model_id:
        return "a model id must be a non-empty string"
    if not model_id.isascii():
        return "a Hub model id is ASCII letters, digits, '-', '_' and '.'"
    try:
        validate_repo_id(model_id)
    except HFValidationError as exc:
        return " ".join(str(exc).split()).split(": '")[0]
    return None
