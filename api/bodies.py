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
    repeated: list[tuple[int, str, int]] = []

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        made = dict(items)
        counts: dict[str, int] = {}
        for key, _ in items:
            counts[key] = counts.get(key, 0) + 1
        repeated.extend((id(made), key, n) for key, n in counts.items() if n > 1)
        return made

    try:
        parsed = json.loads(body, object_pairs_hook=pairs)
    except (ValueError, RecursionError):  # FastAPI says why it does not parse
        return
    if not repeated:
        return
    paths = _paths(parsed)
    raise RequestValidationError(
        [
            {
                "loc": ("body", *paths.get(where, ()), key),
                "msg": f"given {n} times; give it once",
                "type": "value_error",
                "input": key,
            }
            for where, key, n in repeated
        ]
    )


def _paths(value: Any) -> dict[int, tuple[str | int, ...]]:
    """The path to every object in `value`, keyed by its id."""
    found: dict[int, tuple[str | int, ...]] = {}
    todo: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while todo:
        item, path = todo.pop()
        if isinstance(item, dict):
            found[id(item)] = path
            todo.extend((v, (*path, k)) for k, v in item.items())
        elif isinstance(item, list):
            todo.extend((v, (*path, i)) for i, v in enumerate(item))
    return found
