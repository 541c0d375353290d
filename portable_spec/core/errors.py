"""Errors as the one line a user reads: a dependency's first line, a pydantic error's fields and values."""

from __future__ import annotations

from collections.abc import Callable

from pydantic import ValidationError


def first_line(error: BaseException) -> str:
    """transformers' and torch's messages run to many lines; the first says what failed."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def validation_line(error: ValidationError, explain: Callable[[dict], str | None] = lambda item: None) -> str:
    """Every bad field as `field=value: what is wrong` (pydantic's words without its URL, or `explain(item)`'s),
    joined by '; '. Whole-object values (a nested config) are not repeated."""
    parts = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"]) or "(root)"
        value = item.get("input")
        shown = "" if isinstance(value, dict) else f"={value!r}"
        parts.append(f"{field}{shown}: {explain(item) or item['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)
