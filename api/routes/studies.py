"""/v1/studies: every study in the storage, the jobs' and `python -m tuner run`'s alike."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from api.deps import CallerDep, ReaderDep, StoreDep
from api.routes import CONFLICT, GUARDED, NOT_FOUND, UNAUTHORIZED
from api.schemas.common import Recommendation
from api.schemas.studies import StudyOut, StudyPage
from tuner.errors import NoRecommendation, StudyNotFound, named
from tuner.service.owners import Owner
from tuner.service.submissions import Submissions
from tuner.service.tables import no_recommendation_yet, study_not_made

router = APIRouter(
    prefix="/v1/studies",
    tags=["studies"],
    dependencies=GUARDED,
    responses=UNAUTHORIZED,
)


@router.get("", response_model=StudyPage)
def list_studies(
    reader: ReaderDep,
    store: StoreDep,
    caller: CallerDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> StudyPage:
    """Studies by name: workload, preset, fingerprint, trial counts, best so far. A token sees
    its jobs' studies; an admin's, every study of the storage (`python -m tuner run`'s too)."""
    names = reader.names()
    mine = store.studies(by=caller)
    if mine is not None:
        names = [n for n in names if n in mine]
    page = names[offset : offset + limit]
    asked = store.workloads_of(page)
    items = [_study(reader.summary(n), asked) for n in page]
    return StudyPage(items=items, total=len(names), limit=limit, offset=offset)


@router.get("/{name}", response_model=StudyOut, responses=NOT_FOUND)
def get_study(name: str, reader: ReaderDep, store: StoreDep, caller: CallerDep) -> StudyOut:
    visible = _visible(name, store, caller)
    try:
        summary = reader.summary(visible)
    except StudyNotFound:
        # A job's study is made when a worker claims the job: a bare "no study" for a job
        # queued, or cancelled before it ran, where its /best is a 409 naming the job.
        job = store.job_of_study(visible)
        if job is None:
            raise
        raise StudyNotFound(study_not_made(name, *job)) from None
    return _study(summary, store.workloads_of([visible]))


def _study(summary: dict[str, Any], asked: dict[str, str]) -> StudyOut:
    """A study as its job named its workload (`asked`), where a job made it: the study itself
    records what its worker ran, a plug-in's factory path, which the API never shows or takes."""
    return StudyOut.of(summary | {"workload": asked.get(summary["name"], summary["workload"])})


@router.get("/{name}/best", response_model=Recommendation, responses=NOT_FOUND | CONFLICT)
def study_best(name: str, reader: ReaderDep, store: StoreDep, caller: CallerDep) -> Recommendation:
    """The study's recommendation; 409 while it has none."""
    visible = _visible(name, store, caller)
    try:
        found = reader.recommendation(visible)
    except (NoRecommendation, StudyNotFound):
        # A queued job's study is made when a worker claims the job: a 404 had said no such
        # study where the README says 409 naming the job (a user's probe, 2026-12-06).
        job = store.job_of_study(visible)
        if job is None:  # `python -m tuner run`'s study: its message names that command
            raise
        # A job's study: said in the API's terms (it had advised `python -m tuner run`).
        raise NoRecommendation(no_recommendation_yet(name, *job)) from None
    if found.config is None:
        raise NoRecommendation(
            f"study {name!r} recommends no config: {found.reason or 'none was decided'}"
        )
    # As its job named the workload (`_study`): the job's own /best says so too.
    asked = store.workloads_of([visible])
    return Recommendation.model_validate(
        found.to_dict() | {"workload": asked.get(visible, found.workload)}
    )


def _visible(name: str, store: Submissions, caller: Owner) -> str:
    """`name`, if the caller may see it; StudyNotFound otherwise, worded as for an unknown one."""
    mine = store.studies(by=caller)
    # A name with a NUL names no study (and PostgreSQL could not even be asked about it).
    if "\x00" in name or (mine is not None and name not in mine):
        raise StudyNotFound(f"no study named {named(name)} in this storage")
    return name
