"""The routes, one module per resource; every one but /healthz needs a bearer token."""

from __future__ import annotations

from typing import Any

from api.schemas.common import ErrorOut

UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "no or a wrong bearer token"}
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": ErrorOut, "description": "unknown"}}
CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"model": ErrorOut, "description": "not in a state that allows it (yet)"}
}
