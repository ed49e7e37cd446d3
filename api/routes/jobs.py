"""/v1/jobs: submit, list, watch, read the trials and the recommendation of, and cancel jobs."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response, status

from api.deps import (
    CallerDep,
    ReaderDep,
    RegistryDep,
    ReportsDep,
    SettingsDep,
    StoreDep,
)
from api.routes import CONFLICT, GUARDED, NOT_FOUND, UNAUTHORIZED
from api.schemas.common import ErrorOut, Recommendation
from api.schemas.jobs import JobIn, JobOut, JobPage, Status, TrialOut, TrialPage
from tuner.errors import JobConflict, StudyNotFound
from tuner.evidence.recommendation import recommends
from tuner.service.spec import check_spec
from tuner.service.tables import study_not_made

log = logging.getLogger("api.jobs")
router = APIRouter(prefix="/v1/jobs", tags=["jobs"], dependencies=GUARDED, responses=UNAUTHORIZED)

Limit = Annotated[int, Query(ge=1, le=200, description="page size")]
Offset = Annotated[int, Query(ge=0, le=10_000_000, description="items to skip")]
HTML = "text/html; charset=utf-8"
JobId = Annotated[str, Path(description="the job's id (32 lower-case hexadecimal digits)")]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=JobOut,
    responses={
        400: {"model": ErrorOut, "description": "the body is not what its Content-Encoding says"},
        413: {"model": ErrorOut, "description": "the body is over the limit (64 KiB)"},
        415: {"model": ErrorOut, "description": "a Content-Encoding other than gzip or deflate"},
        429: {"model": ErrorOut, "description": "this token has too many queued jobs"},
    },
)
def create_job(
    body: JobIn,
    response: Response,
    caller: CallerDep,
    store: StoreDep,
    registry: RegistryDep,
    settings: SettingsDep,
) -> JobOut:
    """Queue a tuning job; a worker picks it up. `Location` is the job's URL."""
    spec = body.to_spec()
    check_spec(spec, registry)
    row = store.create(spec, owner=caller, max_queued=settings.max_queued_per_token)
    log.info("job %s queued by %s: %s %s", row.id, caller.name, row.workload, row.preset)
    response.headers["Location"] = f"/v1/jobs/{row.id}"
    return JobOut.of(row, store.offered_devices(settings.lease_s), settings.lease_s)


@router.get("", response_model=JobPage)
def list_jobs(
    store: StoreDep,
    caller: CallerDep,
    settings: SettingsDep,
    status: Status | None = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> JobPage:
    """This token's jobs (an admin's: every job), newest first, optionally of one status."""
    rows, total = store.list(status=status, limit=limit, offset=offset, by=caller)
    offered = store.offered_devices(settings.lease_s)
    items = [JobOut.of(r, offered, settings.lease_s) for r in rows]
    return JobPage(items=items, total=total, limit=limit, offset=offset)


@router.get("/{job_id}", response_model=JobOut, responses=NOT_FOUND)
def get_job(job_id: JobId, store: StoreDep, caller: CallerDep, settings: SettingsDep) -> JobOut:
    """Status, trials complete of those asked for, the best trial so far, timestamps, error;
    for a queued job, why it waits (`stuck`: no live worker offers its device)."""
    row = store.job(job_id, by=caller)
    return JobOut.of(row, store.offered_devices(settings.lease_s), settings.lease_s)


@router.get("/{job_id}/trials", response_model=TrialPage, responses=NOT_FOUND)
def job_trials(
    job_id: JobId,
    store: StoreDep,
    reader: ReaderDep,
    caller: CallerDep,
    limit: Limit = 50,
    offset: Offset = 0,
) -> TrialPage:
    """The job's trials in order: params, throughput with its CI, state, failure reason."""
    rows, total = reader.trials(store.job(job_id, by=caller).study, limit=limit, offset=offset)
    return TrialPage(
        items=[TrialOut.model_validate(r) for r in rows], total=total, limit=limit, offset=offset
    )


@router.get("/{job_id}/best", response_model=Recommendation, responses=NOT_FOUND | CONFLICT)
def job_best(job_id: JobId, store: StoreDep, caller: CallerDep) -> Recommendation:
    """The tuner's recommendation; 409 while there is none."""
    row = store.job(job_id, by=caller)
    if not recommends(row.recommendation):
        why = f": {row.error}" if row.error else ""
        raise JobConflict(
            f"job {job_id!r} has no recommendation: it is {row.status}, "
            f"{row.n_complete} of {row.trials} trials complete{why}"
        )
    return Recommendation.model_validate(row.recommendation)


# Not `response_class=HTMLResponse`: that would document the JSON errors (401, 404) as HTML too.
@router.get(
    "/{job_id}/report",
    response_model=None,
    responses={
        **NOT_FOUND,
        200: {
            "content": {"text/html": {"schema": {"type": "string"}}},
            "description": "the study's self-contained HTML report (gzipped if accepted)",
        },
        304: {"description": "not changed since the ETag sent in If-None-Match"},
    },
)
def job_report(
    job_id: JobId, store: StoreDep, reports: ReportsDep, caller: CallerDep, request: Request
) -> Response:
    """The job study's report (`python -m tuner report`): recommendation, speedups, every
    trial, throughput by setting, the time breakdown of the profiled configs. Built once per
    state of the study (its ETag) and served from memory. A job that has not started has no
    study yet: 404."""
    job = store.job(job_id, by=caller)
    try:
        page = reports.page(job.study, workload=job.workload)  # a plug-in by its name, as /best
    except StudyNotFound:
        raise StudyNotFound(study_not_made(job.study, job.id, job.status)) from None
    zipped = accepts_gzip(request.headers.get("accept-encoding", ""))
    # One tag per representation (RFC 9110, 8.8.3): a cache holding the gzipped page must not
    # answer an identity request's If-None-Match with it.
    etag = page.etag[:-1] + '-gzip"' if zipped else page.etag
    # private: the page is this token's; no-cache: ask again (a 304 while unchanged).
    headers = {"ETag": etag, "Cache-Control": "private, no-cache", "Vary": "Accept-Encoding"}
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    if zipped:
        headers["Content-Encoding"] = "gzip"
        return Response(page.gzipped, media_type=HTML, headers=headers)
    return Response(page.html, media_type=HTML, headers=headers)


def etag_matches(header: str | None, etag: str) -> bool:
    """Whether an If-None-Match header names `etag` (weakly compared, as RFC 9110 13.1.2 has it:
    `W/"x"` matches `"x"`) or is `*` (any current page: a report exists once the job has a
    study)."""
    if header is None:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    return "*" in tags or etag.removeprefix("W/") in tags


def accepts_gzip(header: str) -> bool:
    """Whether an Accept-Encoding header takes gzip: its own entry's weight where it is named,
    else `*`'s, wherever each stands in the list (RFC 9110 12.5.3: `*;q=0, gzip` takes gzip;
    it was refused as the `*` came first); a weight of 0 refuses."""
    weights: dict[str, float] = {}
    for part in header.lower().split(","):
        coding, *params = (p.strip() for p in part.split(";"))
        weight = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0  # an unreadable weight takes nothing it names
        if coding:
            weights.setdefault(coding, weight)
    return weights.get("gzip", weights.get("*", 0.0)) > 0.0


@router.post("/{job_id}/cancel", response_model=JobOut, responses=NOT_FOUND | CONFLICT)
def cancel_job(job_id: JobId, store: StoreDep, caller: CallerDep, settings: SettingsDep) -> JobOut:
    """Cancel: a queued job at once, and a running one whose workers stopped heartbeating
    (`stuck`); a running one stops at its running trial's next window (what was measured
    stays). 409 when the job has already ended."""
    row = store.cancel(job_id, by=caller, lease_s=settings.lease_s)
    log.info("job %s: cancel asked by %s", job_id, caller.name)
    return JobOut.of(row, store.offered_devices(settings.lease_s), settings.lease_s)
