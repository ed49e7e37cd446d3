"""`create_app(settings)`: the FastAPI application of the tuning service.

Opens the job store and the Optuna storage of `settings.storage` (tables made when missing),
checks the plug-in workloads, and mounts the routes. Running jobs is the workers' business
(`tuner.service.worker`); `api.server.serve` starts both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from api import errors, metrics
from api.deps import Services
from api.limits import BodyLimit
from api.methods import Methods
from api.routes import docs, health, jobs, recommendations, studies
from api.settings import ApiSettings
from tuner.evidence.reader import StudyReader
from tuner.service.reports import ReportCache
from tuner.service.spec import WorkloadRegistry
from tuner.service.submissions import Submissions
from tuner.store import storage

ROUTERS = (jobs.router, studies.router, recommendations.router, health.router, docs.router)
DESCRIPTION = """Submit tuning jobs, watch them, and read the recommended loop settings.

Every endpoint but `/healthz` needs `Authorization: Bearer <token>` (a token of
`TUNER_API_TOKENS`)."""


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    settings = settings or ApiSettings()
    registry = WorkloadRegistry(settings.workloads, settings.programs)
    registry.check(served=True)
    store = Submissions(settings.storage)
    optuna_storage = storage.open_storage(settings.storage)
    reader = StudyReader(optuna_storage)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            # The databases' connections go back when the app stops, not when it is collected:
            # a process that makes apps (the tests, an embedding server) would run the server out.
            store.close()
            storage.close_storage(optuna_storage)

    app = FastAPI(
        title="streamtune",
        version="1",
        description=DESCRIPTION,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
    )
    app.state.services = Services(
        settings=settings,
        store=store,
        reader=reader,
        registry=registry,
        tokens=settings.tokens(),
        reports=ReportCache(optuna_storage),
    )
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s
    )
    errors.install(app)
    for router in ROUTERS:
        app.include_router(router)
    # Outermost: a HEAD runs as its GET through every layer below (api.methods).
    app.add_middleware(Methods, routes=[r for router in ROUTERS for r in router.routes])
    return app


def create_metrics_app(store: Submissions, *, lease_s: float) -> FastAPI:
    """The operator's scrape port (`TUNER_METRICS_PORT`): `GET /metrics` of every job, without a
    token, and nothing else. The operator opts in and binds it where only the scraper reaches
    it; the API's own /metrics scopes the counts by token."""
    app = FastAPI(title="streamtune metrics", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/metrics")
    def scrape() -> PlainTextResponse:
        return PlainTextResponse(
            metrics.render(store, lease_s=lease_s, by=None), media_type=metrics.CONTENT_TYPE
        )

    app.add_middleware(Methods, routes=app.router.routes)
    return app
