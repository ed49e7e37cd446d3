"""A JSON body whose object names a key twice is a 422 naming the key, not read as its last value.

Python's JSON parser keeps the last of a repeated key, so `{"trials": 1, "trials": 5}` queued a
job of 5 trials (a client's probe, 2026-12-05): a mistake read as a request the client may not
have meant, where a repeated query parameter is refused (`api.queries`). Bodies that do not
parse are left to FastAPI's own answer.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError


async def strict_body(request: Request) -> None:
    """The check, a dependency of every route (the body is read once and kept for the route)."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    body = await request.body()
    if not body:
        return
    # Each object's parent and the keys to it, recorded as the parser makes them: an object a
    # repeated outer key dropped is named by its whole path too. The objects are kept alive
    # (`made`), so no id is reused by a later one.
    made: list[dict[str, Any]] = []
    parent: dict[int, tuple[dict[str, Any], tuple[str | int, ...]]] = {}
    repeated: list[tuple[dict[str, Any], str, int]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        made.append(obj := dict(items))
        counts: dict[str, int] = {}
        for key, value in items:
            counts[key] = counts.get(key, 0) + 1
            for child, keys in _objects_in(value, (key,)):
                parent[id(child)] = (obj, keys)
        repeated.extend((obj, key, n) for key, n in counts.items() if n > 1)
        return obj

    def path(obj: dict[str, Any]) -> tuple[str | int, ...]:
        keys: tuple[str | int, ...] = ()
        while id(obj) in parent:
            obj, above = parent[id(obj)]
            keys = (*above, *keys)
        return keys

    try:
        parsed = json.loads(body, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # FastAPI says why it does not parse
        return
    if isinstance(parsed, list):  # a top-level list: its objects are named by their index
        top: dict[str, Any] = {}
        parent.update({id(child): (top, keys) for child, keys in _objects_in(parsed, ())})
    if not repeated:
        return
    raise RequestValidationError(
        [
            {
                "loc": ("body", *path(where), key),
                "msg": f"given {n} times; give it once",
                "type": "value_error",
                "input": key,
            }
            for where, key, n in repeated
        ]
    )


def _objects_in(
    value: Any, keys: tuple[str | int, ...]
) -> list[tuple[dict[str, Any], tuple[str | int, ...]]]:
    """The objects directly in `value` (itself, or inside its lists), with the keys to each."""
    if isinstance(value, dict):
        return [(value, keys)]
    if isinstance(value, list):
        return [found for i, v in enumerate(value) for found in _objects_in(v, (*keys, i))]
    return []
