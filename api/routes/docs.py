"""The OpenAPI schema (/openapi.json) and its Swagger UI (/docs), behind the token like the rest.

The page carries the schema in itself: its script's own fetch of /openapi.json sends no token,
so with tokens set the page had loaded and then failed to read the schema (401)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse

from api.routes import GUARDED

router = APIRouter(dependencies=GUARDED, include_in_schema=False)


@router.get("/openapi.json")
def openapi(request: Request) -> dict[str, Any]:
    schema: dict[str, Any] = request.app.openapi()
    return schema


@router.get("/docs", response_class=HTMLResponse)
def docs(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title=request.app.title,
        swagger_ui_parameters={"spec": request.app.openapi()},  # read before `url`
    )
