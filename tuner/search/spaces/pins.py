"""`--fix name=value` pins and the API's `pins`: text or JSON values turned into a setting's
type, each bad one refused naming the setting and what it allows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tuner.errors import SpaceError
from tuner.search.spaces.space import (
    KINDS,
    check_field_name,
    check_value,
)

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def _convert(field: str, text: str) -> Any:
    kind = KINDS[field]
    if kind == "int":
        try:
            return int(text)
        except ValueError:
            raise SpaceError(field, text, "an integer") from None
    if kind == "bool":
        lowered = text.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise SpaceError(field, text, "true/false, 1/0 or yes/no")
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            raise SpaceError(field, text, "a number") from None
    return text


def parse_fix(items: Sequence[str]) -> dict[str, Any]:
    """Parse "name=value" pins into LoopConfig field -> typed, validated value (in item order).

    Integers via int(); booleans accept true/false/1/0/yes/no (any case); sync_mode is a string.
    Errors: no "=" -> SpaceError field "fix"; unknown name, bad value or a setting pinned twice ->
    SpaceError naming the setting.
    """
    pins: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not name:  # "=3" had been "''='3' is invalid", the name not said missing
            raise SpaceError("fix", item, "name=value with name a LoopConfig field")
        check_field_name(name, text)
        if name in pins:
            raise SpaceError(name, text, "each setting pinned once")
        value = _convert(name, text)
        check_value(name, value)
        pins[name] = value
    return pins


def pins_from_mapping(pins: Mapping[str, Any]) -> dict[str, Any]:
    """Typed pins ({field: value}, a job's `fix`), each checked like a `--fix` item."""
    checked: dict[str, Any] = {}
    for name, value in pins.items():
        check_field_name(name, value)
        check_value(name, value)
        checked[name] = value
    return checked
