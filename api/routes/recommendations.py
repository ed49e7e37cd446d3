"""/v1/recommendations: the best known config for a workload on some hardware."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from api.deps import CallerDep, StoreDep, authenticate
from api.routes import NOT_FOUND, UNAUTHORIZED
from api.schemas.common import Recommendation
from api.schemas.studies import RecommendationHit
from tuner.errors import JobNotFound

router = APIRouter(
    prefix="/v1/recommendations",
    tags=["recommendations"],
    dependencies=[Depends(authenticate)],
    responses=UNAUTHORIZED,
)

PRINTABLE = r"^[^\x00-\x1f\x7f]+$"  # no control character (PostgreSQL stores no NUL)
Text = Annotated[str, Query(min_length=1, max_length=128, pattern=PRINTABLE)]


@router.get("", response_model=RecommendationHit, responses=NOT_FOUND)
def recommend(
    store: StoreDep,
    caller: CallerDep,
    workload: Text,
    preset: Text,
    gpu: Annotated[
        str,
        Query(
            min_length=1,
            max_length=128,
            pattern=PRINTABLE,
            description=("the GPU's name (spaces or '-') as in the fingerprint, or cpu"),
        ),
    ],
) -> RecommendationHit:
    """Across this token's finished jobs (an admin's: everyone's), the recommended config of
    highest throughput for this hardware."""
    hardware = gpu.strip().replace(" ", "-")
    row = store.best_for(workload, preset, hardware, by=caller)
    if row is None or row.recommendation is None:
        raise JobNotFound(
            f"no finished job has a recommendation for workload={workload!r} "
            f"preset={preset!r} on {hardware!r}"
        )
    return RecommendationHit(
        workload=workload,
        preset=preset,
        gpu=hardware,
        job_id=row.id,
        study=row.study,
        throughput=row.rec_throughput,
        config=row.recommendation.get("config"),
        recommendation=Recommendation.model_validate(row.recommendation),
    )
