"""Studies (every study in the storage) and recommendations across jobs."""

from __future__ import annotations

import urllib.parse
from typing import Any

from pydantic import BaseModel, Field

from api.schemas.common import BestSoFar, Recommendation


class StudyLinks(BaseModel):
    self: str
    best: str
    job: str | None


class StudyOut(BaseModel):
    name: str
    workload: str | None
    preset: str | None
    model_args: dict[str, str] = Field(
        default_factory=dict,
        description="the library model's options the study was run with (`--model-arg`, a "
        "job's model_args); two studies of one model at other options differ here",
    )
    hardware: str | None
    fingerprint: dict[str, Any] | None
    created: str | None
    trials: dict[str, int] = Field(description="trials by Optuna state")
    fastest_trial: BestSoFar | None = Field(
        description="the fastest complete trial so far (its one short measurement); not the "
        "recommendation, which is `links.best` (named `best` until 2026-11-27)"
    )
    has_recommendation: bool
    recommended: dict[str, Any] | None
    time: dict[str, Any] | None = Field(
        default=None,
        description="where the study's time went: wall_s, phases (seconds of compile, each gate "
        "part, measure, final_round, profile and idle), sessions; null: recorded before phases",
    )
    job_id: str | None = Field(description="the job that made it; null: made by `tuner run`")
    links: StudyLinks

    @classmethod
    def of(cls, summary: dict[str, Any]) -> StudyOut:
        name = summary["name"]
        job = summary["job_id"]
        # Quoted: a name with '?', '#' or '%' (which `--study` takes) had given links that
        # fetched another path, or nothing.
        path = f"/v1/studies/{urllib.parse.quote(name, safe='')}"
        links = StudyLinks(
            self=path,
            best=f"{path}/best",
            job=None if job is None else f"/v1/jobs/{job}",
        )
        # One name per meaning: `best` is the recommendation (`links.best`), not this trial.
        fields = {k: v for k, v in summary.items() if k != "best"}
        return cls.model_validate(fields | {"fastest_trial": summary.get("best"), "links": links})


class StudyPage(BaseModel):
    items: list[StudyOut]
    total: int
    limit: int
    offset: int


class RecommendationHit(BaseModel):
    """The best known config for a workload, preset and hardware, across finished jobs."""

    workload: str
    preset: str
    model_args: dict[str, str] = Field(
        default_factory=dict, description="the library model's options the job was given"
    )
    gpu: str = Field(description="the hardware key: the GPU name with '-' for spaces, or cpu")
    job_id: str
    study: str
    throughput: float | None
    config: dict[str, Any] | None
    recommendation: Recommendation
