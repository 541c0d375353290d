"""Errors as the one line a user reads: a dependency's first line, a pydantic error's fields and values."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError


def first_line(error: BaseException) -> str:
    """transformers' and torch's messages run to many lines; the first says what failed."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def field_and_value(item: dict) -> str:
    """`field=value` of one pydantic error (a whole-object value, a nested config, is not repeated)."""
    field = ".".join(str(part) for part in item["loc"]) or "(root)"
    value = item.get("input")
    return field + ("" if isinstance(value, dict) else f"={value!r}")


def validation_line(
    error: ValidationError,
    explain: Callable[[dict], str | None] = lambda item: None,
    label: Callable[[dict], str] = field_and_value,
) -> str:
    """Every bad field as `label: what is wrong` (pydantic's words without its URL, or `explain(item)`'s), joined by
    '; '; `label` names the field (default `field=value`; an empty label leaves the message alone)."""
    parts = []
    for item in error.errors():
        head, message = label(item), explain(item) or item["msg"].removeprefix("Value error, ")
        parts.append(f"{head}: {message}" if head else message)
    return "; ".join(parts)
