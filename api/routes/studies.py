"""/v1/studies: every study in the storage, the jobs' and `python -m tuner run`'s alike."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from api.deps import ReaderDep, authenticate
from api.routes import CONFLICT, NOT_FOUND, UNAUTHORIZED
from api.schemas.common import Recommendation
from api.schemas.studies import StudyOut, StudyPage

router = APIRouter(
    prefix="/v1/studies",
    tags=["studies"],
    dependencies=[Depends(authenticate)],
    responses=UNAUTHORIZED,
)


@router.get("", response_model=StudyPage)
def list_studies(
    reader: ReaderDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> StudyPage:
    """Studies by name: workload, preset, fingerprint, trial counts, best so far."""
    names = reader.names()
    items = [StudyOut.of(reader.summary(n)) for n in names[offset : offset + limit]]
    return StudyPage(items=items, total=len(names), limit=limit, offset=offset)


@router.get("/{name}", response_model=StudyOut, responses=NOT_FOUND)
def get_study(name: str, reader: ReaderDep) -> StudyOut:
    return StudyOut.of(reader.summary(name))


@router.get("/{name}/best", response_model=Recommendation, responses=NOT_FOUND | CONFLICT)
def study_best(name: str, reader: ReaderDep) -> Recommendation:
    """The study's recommendation; 409 while it has none."""
    return Recommendation.model_validate(reader.recommendation(name).to_dict())
