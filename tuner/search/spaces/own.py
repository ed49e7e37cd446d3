"""A user's own search space: a mapping (the API's `space` object, `--space` given as one) or a
.json file of {LoopConfig field: [choices] | {"low", "high", "log"?} | fixed value}, and what
`--fix` pins override of it (`pins_over`: the pin wins, `load_space`, and a line says so)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.errors import SpaceError
from tuner.search.spaces.pins import parse_fix, pins_from_mapping
from tuner.search.spaces.space import (
    Choice,
    SearchSpace,
    Spec,
    check_field_name,
    check_value,
    spec_from_json,
)

MAPPING_SPACE = "custom"
"""The name of a space given as a mapping (the study records its settings, not a file)."""


def own_space(spec: str | Mapping[str, Any]) -> SearchSpace | None:
    """The user's own space `spec` gives (a mapping, or a .json file's path); None: a name."""
    if isinstance(spec, Mapping):
        return space_from_mapping(spec)
    if isinstance(spec, str) and spec.lower().endswith(".json"):
        return space_from_mapping(read_space_file(spec), name=spec)
    return None


def pins_over(spec: str | Mapping[str, Any], fix: Sequence[str] | Mapping[str, Any]) -> list[str]:
    """One line per pin (`--fix`, the API's `pins`) that overrides what the user's own space
    `spec` says of the same setting: the pin wins (`load_space`), which went unsaid where a
    space written to search a setting, or to fix it otherwise, then ran it pinned. Nothing for
    a named space, whose settings a pin is there to narrow."""
    own = own_space(spec)
    if own is None:
        return []
    pins = pins_from_mapping(fix) if isinstance(fix, Mapping) else parse_fix(fix)
    lines = []
    for name, value in pins.items():
        if name in own.params:
            said = f"searched {_described(own.params[name])}"
        elif name in own.fixed and own.fixed[name] != value:
            said = f"fixed it to {own.fixed[name]!r}"
        else:
            continue
        lines.append(f"pinned {name}={value!r}: the pin wins over space {own.name!r}, which {said}")
    return lines


PINNED_ALL = (
    "nothing left to search: the pins fix every setting the space searched, so each trial "
    "measures the same config again, and their windows pool"
)


def noted_pins(
    space: SearchSpace, spec: str | Mapping[str, Any], fix: Sequence[str] | Mapping[str, Any]
) -> SearchSpace:
    """`space` (`spec` loaded with `fix`) with `pins_over`'s lines among its notes, where the
    recommendation, `best` and a job show them (they had been progress lines only), and
    PINNED_ALL where the pins left none of the user's searched settings to search."""
    lines = pins_over(spec, fix)
    own = own_space(spec) if lines else None
    if own is not None and own.params and not space.params:
        lines.append(PINNED_ALL)
    return dataclasses.replace(space, notes=(*space.notes, *lines)) if lines else space


def _described(spec: Spec) -> str:
    if isinstance(spec, Choice):
        return ", ".join(repr(v) for v in spec.values)
    return f"{spec.low}..{spec.high}" + (" (log)" if spec.log else "")


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise SpaceError(key, value, "each setting listed once")
        seen[key] = value
    return seen


def read_space_file(path: str) -> Mapping[str, Any]:
    try:
        # utf-8-sig: a byte-order mark (Windows editors write one) is read past, as the API does.
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise SpaceError("space", path, f"a readable .json file ({reason})") from exc
    try:
        data = json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as exc:
        where = f"{exc.msg} at line {exc.lineno} column {exc.colno}"
        raise SpaceError("space", path, f"a valid JSON file ({where})") from exc
    if not isinstance(data, dict):
        raise SpaceError("space", data, "a JSON object of LoopConfig field -> list, range or value")
    return data


def space_from_mapping(data: Mapping[str, Any], *, name: str = MAPPING_SPACE) -> SearchSpace:
    """A space from {field: [choices] | {"low", "high", "log"?} | fixed value} (a file's shape)."""
    if not isinstance(data, Mapping):
        raise SpaceError("space", data, "an object of LoopConfig field -> list, range or value")
    params: dict[str, Spec] = {}
    fixed: dict[str, Any] = {}
    for field, raw in data.items():
        check_field_name(field, raw)
        spec = spec_from_json(field, raw)
        if spec is None:
            check_value(field, raw)
            fixed[field] = raw
        else:
            params[field] = spec
    return SearchSpace(name=name, params=params, fixed=fixed)
