"""Error translation: the tuner's errors to HTTP statuses, every body `{"detail": ...}`.

The database unreachable is a 503 with `Retry-After` on every route (a 500 only for database
errors that are not about reaching it). 422s keep FastAPI's shape (`detail`: a list of
`{loc, msg, type}`, `loc` naming the field), also for the checks that only the tuner can make
(an unknown workload, a bad range of the space).
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
import sqlalchemy.exc
from fastapi import FastAPI, Request, Response, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuner.errors import (
    JobConflict,
    JobNotFound,
    NoRecommendation,
    SpecError,
    StudyNotFound,
    TooManyQueued,
)
from tuner.store.retry import is_transient

RETRY_AFTER_S = "5"


def field_error(
    loc: Sequence[str | int], message: str, value: object = None
) -> RequestValidationError:
    """A 422 naming `loc` (e.g. ("body", "space", "num_streams")), as FastAPI words its own."""
    return RequestValidationError(
        [{"loc": tuple(loc), "msg": message, "type": "value_error", "input": value}]
    )


def _json(status_code: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status_code, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(JobNotFound)
    @app.exception_handler(StudyNotFound)
    async def _not_found(_: Request, exc: Exception) -> JSONResponse:
        return _json(status.HTTP_404_NOT_FOUND, str(exc))

    @app.exception_handler(JobConflict)
    @app.exception_handler(NoRecommendation)
    async def _conflict(_: Request, exc: Exception) -> JSONResponse:
        return _json(status.HTTP_409_CONFLICT, str(exc))

    @app.exception_handler(TooManyQueued)
    async def _too_many(_: Request, exc: Exception) -> JSONResponse:
        return _json(status.HTTP_429_TOO_MANY_REQUESTS, str(exc), {"Retry-After": "60"})

    @app.exception_handler(SpecError)
    async def _bad_spec(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SpecError)
        error = field_error(("body", *exc.loc), exc.message, exc.value)
        return JSONResponse(
            {"detail": error.errors()}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == status.HTTP_400_BAD_REQUEST:  # FastAPI could not parse the body
            error = field_error(("body",), "the body could not be parsed: send JSON in UTF-8")
            return JSONResponse(
                {"detail": error.errors()}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT
            )
        return await http_exception_handler(request, exc)

    # The database away (down, restarting, unreachable): 503 with Retry-After on every route.
    # The next request after it is back gets a fresh connection (`pool_pre_ping`).
    @app.exception_handler(sqlalchemy.exc.SQLAlchemyError)
    @app.exception_handler(optuna.exceptions.StorageInternalError)
    async def _database_down(request: Request, exc: Exception) -> Response:
        if not is_transient(exc):
            raise exc  # a bug, not an outage: a 500, logged
        return _json(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"the database is unavailable: {type(exc.__cause__ or exc).__name__}",
            {"Retry-After": RETRY_AFTER_S},
        )
