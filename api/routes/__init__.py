"""The routes, one module per resource; every one but /healthz needs a bearer token."""

from __future__ import annotations

from typing import Any

from fastapi import Depends
from fastapi.params import Depends as DependsParam

from api.bodies import strict_body
from api.deps import authenticate
from api.queries import strict_query
from api.schemas.common import ErrorOut

# Every router's checks: the token first (a caller without one learns nothing more), then the
# query string and the body (an unknown or repeated parameter, a key repeated in the body's
# JSON, is a 422, not ignored).
GUARDED: list[DependsParam] = [
    Depends(authenticate),
    Depends(strict_query),
    Depends(strict_body),
]
OPEN: list[DependsParam] = [Depends(strict_query), Depends(strict_body)]

UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "no or a wrong bearer token"}
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "unknown"}}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorOut, "description": "not in a state that allows it (yet)"}
}
