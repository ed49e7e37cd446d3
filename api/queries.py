"""Query strings are checked whole: a parameter the endpoint does not take, or a single-valued
one given twice, is a 422 naming it and what the endpoint takes.

FastAPI alone ignores the first and keeps the last of the second, so `?limt=5` answered the
default page and `?limit=5&limit=500` the last: a caller's mistake read as a request it did not
make. Each router lists this check after its token check, so a caller without a token learns
nothing about the parameters.
"""

from __future__ import annotations

import typing
from collections import Counter

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute


def _takes(route: APIRoute) -> tuple[list[str], set[str]]:
    """The query parameters `route` takes, and those of them that may repeat (lists)."""
    params = []
    todo: list[Dependant] = [route.dependant]
    while todo:  # the route's own parameters and its dependencies'
        dependant = todo.pop()
        params.extend(dependant.query_params)
        todo.extend(dependant.dependencies)
    repeatable = set()
    for param in params:
        annotation = param.field_info.annotation
        kinds = typing.get_args(annotation) if typing.get_args(annotation) else (annotation,)
        if any(typing.get_origin(kind) in (list, tuple, set) for kind in kinds):
            repeatable.add(param.alias)
    return sorted(param.alias for param in params), repeatable


def strict_query(request: Request) -> None:
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    takes, repeatable = _takes(route)
    allowed = ", ".join(takes) if takes else "no query parameters"
    errors = []
    for name, count in Counter(key for key, _ in request.query_params.multi_items()).items():
        if name not in takes:
            message = f"unknown query parameter; this endpoint takes {allowed}"
        elif count > 1 and name not in repeatable:
            message = f"given {count} times; give it once"
        else:
            continue
        given = request.query_params.getlist(name)
        errors.append(
            {"loc": ("query", name), "msg": message, "type": "value_error", "input": given}
        )
    if errors:
        raise RequestValidationError(errors)
