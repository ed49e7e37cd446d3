"""Error translation: the tuner's errors to HTTP statuses, every body `{"detail": ...}`.

The database unreachable is a 503 with `Retry-After` on every route (a 500 only for database
errors that are not about reaching it). 422s keep FastAPI's shape (`detail`: a list of
`{loc, msg, type, input}`, `loc` naming the field), also for the checks that only the tuner can
make (an unknown workload, a bad range of the space), and their handler cannot fail on any input:
what it echoes is made JSON-safe first (a non-finite number, a lone surrogate, an integer too long
to print, an exception in `ctx`), and if rendering still failed the answer drops the echo.
"""

from __future__ import annotations

import json
import logging
import math
import typing
from collections.abc import Sequence
from typing import Any

import optuna
import sqlalchemy.exc
from fastapi import FastAPI, Request, Response, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import AliasChoices, BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

import trainers
from api.deps import authenticate, bearer, get_services
from api.schemas.space import without_tags
from tuner.errors import (
    JobConflict,
    JobNotFound,
    NoRecommendation,
    SpecError,
    StudyNotFound,
    TooManyQueued,
)
from tuner.service.spec import MODULE_PATH_HINT
from tuner.store.retry import is_transient

RETRY_AFTER_S = "5"
MAX_ECHO = 200  # characters of an input (and items of a list) echoed back in a 422
MAX_MESSAGE = 4000
"""Characters of a 422's message: ours quote a value cut short (`tuner.errors.named`) and then
list what is allowed, which cut at MAX_ECHO had lost the library families after 200 characters."""
MAX_ERRORS = 20
"""Errors listed in one 422: each unknown key's names every allowed field, and 5,500 unknown keys
in a 64 KiB body had answered 2.5 MB (190x a gzipped request's size)."""
JSON_HINT = "the body must be a JSON object: send it with Content-Type: application/json"
log = logging.getLogger("api.errors")
UNREADABLE = json.dumps(
    {"detail": [{"type": "value_error", "loc": ["body"], "msg": "the request is invalid"}]}
).encode()


def field_error(
    loc: Sequence[str | int], message: str, value: object = None
) -> RequestValidationError:
    """A 422 naming `loc` (e.g. ("body", "space", "num_streams")), as FastAPI words its own."""
    return RequestValidationError(
        [{"loc": tuple(loc), "msg": message, "type": "value_error", "input": value}]
    )


def _text(value: str, limit: int = MAX_ECHO) -> str:
    """A string that encodes as UTF-8 (a lone surrogate escaped), cut to `limit` characters."""
    cut = value if len(value) <= limit else value[:limit] + "..."
    return cut.encode("utf-8", "backslashreplace").decode("utf-8")


def plain(value: object, depth: int = 0) -> Any:
    """`value` as JSON can carry it: non-finite floats and huge integers as text, strings that
    encode, containers cut short, anything else as its (safe) repr."""
    if value is None or isinstance(value, bool | str):
        return value if not isinstance(value, str) else _text(value)
    if isinstance(value, int):
        return value if abs(value) < 2**63 else f"an integer of {value.bit_length()} bits"
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, bytes):
        return _text(value.decode("utf-8", "replace"))
    if depth > 8:
        return "..."
    if isinstance(value, dict):
        items = list(value.items())[:MAX_ECHO]
        return {_text(str(plain(k))): plain(v, depth + 1) for k, v in items}
    if isinstance(value, list | tuple | set):
        return [plain(v, depth + 1) for v in list(value)[:MAX_ECHO]]
    if isinstance(value, Exception):  # a validator's error in `ctx`: its sentence, not its repr
        return _text(str(value))
    return _text(repr(value))


def unprocessable(
    errors: Sequence[Any], *, hint: str | None = None, model: type[BaseModel] | None = None
) -> Response:
    """A 422 with FastAPI's shape for `errors`; it renders whatever the errors hold. `hint`:
    said after an error of the whole body. `model`, the route's request body model, names the
    allowed fields beside an unknown one."""
    try:
        detail = []
        for error in errors[:MAX_ERRORS]:
            # The field as the client named it: without the tag of the reading that was checked
            # (`api.schemas.space`, e.g. ("body", "space", "settings", "num_streams", "choices")).
            error = {**error, "loc": without_tags(tuple(error.get("loc") or ()))}
            entry = {key: plain(error.get(key)) for key in ("type", "loc", "input")}
            msg = error.get("msg")
            entry["msg"] = _text(msg, MAX_MESSAGE) if isinstance(msg, str) else plain(msg)
            if entry["type"] == "value_error" and isinstance(entry["msg"], str):
                # Pydantic words a validator's ValueError "Value error, allowed ...": ours are
                # sentences that name the field already.
                entry["msg"] = entry["msg"].removeprefix("Value error, ")
            if entry["type"] == "string_pattern_mismatch" and _module_path(entry):
                entry["msg"] = f"{entry['msg']}; {MODULE_PATH_HINT}"
            if entry["type"] == "extra_forbidden":
                # Pydantic says only "Extra inputs are not permitted".
                entry["msg"] = unknown_field(model, tuple(error.get("loc") or ())) or entry["msg"]
            if error.get("ctx"):
                entry["ctx"] = plain(error["ctx"])
            if hint and tuple(entry["loc"] or ()) == ("body",):
                entry["msg"] = f"{entry['msg']}: {hint}"
            detail.append(entry)
        if len(errors) > MAX_ERRORS:
            detail.append(
                {
                    "type": "too_many_errors",
                    "loc": ["body"],
                    "msg": f"and {len(errors) - MAX_ERRORS} more errors, not listed: the first "
                    f"{MAX_ERRORS} above",
                    "input": None,
                }
            )
        body = json.dumps(
            {"detail": detail}, allow_nan=False, ensure_ascii=False, separators=(",", ":")
        ).encode()
    # Not expected after `plain`; but this handler answers 422 whatever the errors hold (a 500
    # here would be the server failing on the client's input).
    except Exception as exc:  # noqa: BLE001
        log.warning("a 422 answered without its details: %s", type(exc).__name__)
        body = UNREADABLE
    return Response(body, status_code=422, media_type="application/json")


async def _unauthenticated(request: Request) -> Response | None:
    """The 401 a caller without a valid token gets, None for one with it. FastAPI parses a
    body before it runs the route's dependencies, the token's check among them: a malformed
    body had answered 422, naming what the body got wrong, to a caller with no token."""
    route = request.scope.get("route")
    if not _calls(getattr(route, "dependant", None), authenticate):
        return None  # a public route (`/healthz`): its own 422
    try:
        authenticate(get_services(request), await bearer(request))
    except StarletteHTTPException as denied:
        return await http_exception_handler(request, denied)
    return None


def _calls(dependant: Any, function: object) -> bool:
    """Whether FastAPI's dependency tree `dependant` calls `function` anywhere."""
    if dependant is None:
        return False
    if dependant.call is function:
        return True
    return any(_calls(d, function) for d in dependant.dependencies)


def unknown_field(body: type[BaseModel] | None, loc: tuple[object, ...]) -> str | None:
    """What an unknown field at `loc` (("body", ..., key)) should have been: the closest names
    and every field of the model it was sent in, or that it is another name of a field sent
    too (`n_trials` beside `trials`); None where `loc` leads to no model of `body`."""
    model = body
    for step in loc[1:-1]:
        if model is not None and step == model.__name__:
            continue  # the union member pydantic tried (a union without tags)
        if model is None or not isinstance(step, str) or step not in model.model_fields:
            return None
        model = _model_in(model.model_fields[step].annotation)
    key = loc[-1] if loc else None
    if model is None or not isinstance(key, str):
        return None
    names: dict[str, str] = {}  # every name a field is read by -> that field
    for name, info in model.model_fields.items():
        alias = info.validation_alias
        choices = alias.choices if isinstance(alias, AliasChoices) else [alias or name]
        names |= {choice: name for choice in [name, *choices] if isinstance(choice, str)}
    if key in names:
        return f"{key!r} is another name of {names[key]!r}, which is given too: send one of them"
    fields = ", ".join(model.model_fields)
    hint = trainers.did_you_mean(key, names)
    return f"unknown field {_text(key)!r}{hint}: allowed {fields}"  # the key as it encodes


def _model_in(annotation: object) -> type[BaseModel] | None:
    """The request model a field's annotation holds (`SpaceIn | str | None`: SpaceIn)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def unparsable(cause: BaseException | None) -> str:
    """Why FastAPI could not parse a body (it says only "There was an error parsing the body"),
    from what its JSON parser raised. Syntax errors never get here (FastAPI answers those itself,
    as `json_invalid`)."""
    if isinstance(cause, RecursionError):
        # Python's parser recurses once per level and stops near its recursion limit (~1,000
        # levels); a job's body needs 3 (the body, `space`, a setting's choices).
        return (
            "the body could not be parsed: its arrays or objects are nested too deeply for the "
            "JSON parser (a job's body needs 3 levels)"
        )
    if isinstance(cause, UnicodeDecodeError):
        return f"the body could not be parsed: it is not valid UTF-8 ({cause.reason})"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        # Python's parser reads no integer of more than 4,300 digits; no field takes one.
        return (
            "the body could not be parsed: it holds an integer of more than 4,300 digits, "
            "larger than any field allows"
        )
    return "the body could not be parsed: send JSON in UTF-8"


def _module_path(entry: dict[str, Any]) -> bool:
    """Whether a job's `workload` looks like `package.module:factory`, which the CLI takes."""
    loc, given = tuple(entry.get("loc") or ()), entry.get("input")
    return loc[-1:] == ("workload",) and isinstance(given, str) and ":" in given


def _json(status_code: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status_code, headers=headers)


def _body_hint(request: Request, errors: Sequence[Any]) -> str | None:
    """What an error of the whole body adds: to send JSON as JSON, or, sent so already, that it
    must be an object. No body at all is told what to send whatever its type: an empty one sent
    as JSON had got a bare "Field required" where one without the type got the hint."""
    if request.method != "POST":
        return None
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        return JSON_HINT
    if any(e.get("type") == "missing" for e in errors):
        return JSON_HINT.split(":")[0]
    return None


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

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        denied = await _unauthenticated(request)
        if denied is not None:
            return denied
        hint = _body_hint(request, exc.errors())
        field = getattr(request.scope.get("route"), "body_field", None)
        model = _model_in(getattr(getattr(field, "field_info", None), "annotation", None))
        return unprocessable(exc.errors(), hint=hint, model=model)

    @app.exception_handler(SpecError)
    async def _bad_spec(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, SpecError)
        return unprocessable(field_error(("body", *exc.loc), exc.message, exc.value).errors())

    # What only a library model's adapter knows (an unknown family or model): a 422 naming the
    # field, wherever it is raised (tuner.service.spec.check_spec turns the known ones into
    # SpecErrors first; this is the net under it).
    @app.exception_handler(trainers.WorkloadError)
    async def _bad_workload(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, trainers.WorkloadError)
        head, _, rest = (exc.field or "workload").partition(".")
        body = ("body", "model_args", rest) if head == "model_arg" and rest else ("body", head)
        if request.method not in ("GET", "HEAD"):
            return unprocessable(field_error(body, str(exc)).errors())
        # A lookup's query, with the value refused, as every other 422 echoes it.
        given = request.query_params.getlist(head)
        value = given[0] if len(given) == 1 else (given or None)
        return unprocessable(field_error(("query", head), str(exc), value).errors())

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == status.HTTP_400_BAD_REQUEST:  # FastAPI could not parse the body
            denied = await _unauthenticated(request)
            if denied is not None:
                return denied
            error = field_error(("body",), unparsable(exc.__cause__))
            return unprocessable(error.errors())
        return await http_exception_handler(request, exc)

    _install_database(app)


def _install_database(app: FastAPI) -> None:
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
