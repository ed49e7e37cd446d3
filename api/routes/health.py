"""/healthz (no token) and /metrics (Prometheus), at the root and under /v1."""

from __future__ import annotations

import sqlalchemy.exc
from fastapi import APIRouter, Response, status
from fastapi.responses import PlainTextResponse

from api import metrics
from api.deps import CallerDep, ServicesDep
from api.routes import OPEN, UNAUTHORIZED
from api.schemas.health import HealthOut

router = APIRouter(tags=["operations"], dependencies=OPEN)


@router.get(
    "/healthz",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "the database is unreachable"}},
)
@router.get("/v1/healthz", response_model=HealthOut, include_in_schema=False)
# HEAD as well, as on every GET route (api.methods): load balancers probe with it.
def healthz(services: ServicesDep, response: Response) -> HealthOut:
    """The database answers (else 503), and how many workers are alive. No token needed."""
    try:
        services.store.ping()
        alive = services.store.workers_alive(services.settings.lease_s)
    except sqlalchemy.exc.SQLAlchemyError:
        response.status_code = status.HTTP_503_SERVICE_UNAVAILABLE
        return HealthOut(status="database_unreachable", database=False, workers_alive=0)
    return HealthOut(status="ok" if alive else "no_workers", database=True, workers_alive=alive)


@router.get(
    "/metrics",
    response_class=Response,
    responses=UNAUTHORIZED
    | {
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "Prometheus text format 0.0.4",
        }
    },
)
@router.get("/v1/metrics", include_in_schema=False)
def prometheus(services: ServicesDep, caller: CallerDep) -> PlainTextResponse:
    """Jobs by state, workers alive, trials finished by state and their durations: of this
    token's jobs, or of every job for an admin token."""
    text = metrics.render(services.store, lease_s=services.settings.lease_s, by=caller)
    return PlainTextResponse(text, media_type=metrics.CONTENT_TYPE)
