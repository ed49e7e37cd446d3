"""/v1/recommendations: the best known config for a workload on some hardware."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import CallerDep, RegistryDep, StoreDep
from api.errors import field_error
from api.routes import GUARDED, NOT_FOUND, UNAUTHORIZED
from api.schemas.common import Recommendation
from api.schemas.jobs import PrecisionName
from api.schemas.studies import RecommendationHit
from tuner.errors import JobNotFound
from tuner.service.spec import WorkloadRegistry, preset_refusal, unknown_workload

router = APIRouter(
    prefix="/v1/recommendations",
    tags=["recommendations"],
    dependencies=GUARDED,
    responses=UNAUTHORIZED,
)

PRINTABLE = r"^[^\x00-\x1f\x7f]+$"  # no control character (PostgreSQL stores no NUL)
Text = Annotated[str, Query(min_length=1, max_length=128, pattern=PRINTABLE)]


@router.get("", response_model=RecommendationHit, responses=NOT_FOUND)
def recommend(
    store: StoreDep,
    caller: CallerDep,
    registry: RegistryDep,
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
    model_arg: Annotated[
        list[str] | None,
        Query(
            max_length=32,
            description="a library model's option, key=value, once per option (a job's "
            "model_args): only jobs of that shape answer",
        ),
    ] = None,
    precision: Annotated[
        PrecisionName | None,
        Query(
            description="only configs that train in this precision (a job that searched "
            "precisions answers for the one its recommendation chose; one that named none, for "
            "what the workers' matmul precision amounts to: fp32 or tf32)",
        ),
    ] = None,
) -> RecommendationHit:
    """Across this token's finished jobs (an admin's: everyone's), the recommended config of
    highest throughput for this model, shape and hardware."""
    hardware = gpu.strip().replace(" ", "-")
    model_args = _pairs(model_arg or [])
    row = store.best_for(
        workload, preset, hardware, by=caller, model_args=model_args, precision=precision
    )
    if row is None or row.recommendation is None:
        raise _not_found(registry, workload, preset, hardware, model_args, precision)
    return RecommendationHit(
        workload=workload,
        preset=preset,
        model_args=dict((row.spec or {}).get("model_args") or {}),
        gpu=row.hardware or hardware,  # as the job recorded it, in whatever case it was asked
        job_id=row.id,
        study=row.study,
        throughput=row.rec_throughput,
        config=row.recommendation.get("config"),
        recommendation=Recommendation.model_validate(row.recommendation),
    )


def _pairs(items: list[str]) -> dict[str, str]:
    """`key=value` query values as a job's `model_args`; a 422 naming `model_arg` else."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or key in pairs:
            raise field_error(
                ("query", "model_arg"),
                "key=value, each key once (a library model's option, as a job's model_args)",
                item,
            )
        pairs[key] = value
    return pairs


def _not_found(
    registry: WorkloadRegistry,
    workload: str,
    preset: str,
    hardware: str,
    model_args: dict[str, str],
    precision: str | None,
) -> Exception:
    """Why no job answered: a 422 for a workload the server does not run or a preset it does
    not have, else a 404 naming
    what was asked. Asked after the lookup: a plug-in the operator has since removed still
    answers for the jobs it ran."""
    if not registry.knows(workload):
        return field_error(("query", "workload"), unknown_workload(registry, workload), workload)
    refused = preset_refusal(registry, workload, preset)
    if refused is not None:
        return field_error(("query", "preset"), refused, preset)
    shape = "".join(f" {k}={v}" for k, v in model_args.items())
    shape += f" precision={precision!r}" if precision else ""
    return JobNotFound(
        f"no finished job has a recommendation for workload={workload!r} "
        f"preset={preset!r}{shape} on {hardware!r}"
    )
