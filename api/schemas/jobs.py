"""Jobs: the request (`JobIn`), the job (`JobOut`) and its trials (`TrialOut`).

Each group of fields has one owner, and the models here follow it: the request's fields are
`tuner.request.JobSpec`'s (`JobIn.to_spec` and `JobOut.of` copy them by name; the CLI builds it
from its flags too), the space's and the pins' `trainers.LoopConfig`'s with its allowed values
and bounds, the precision `trainers.precision`'s. tests/api/test_owners.py holds them to it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    AliasChoices,
    BaseModel,
    Field,
    PlainValidator,
    WithJsonSchema,
    create_model,
    field_validator,
)

from api.schemas.common import BestSoFar, Strict, utc
from api.schemas.options import ModelArgKey, ModelArgValue
from api.schemas.space import FixIn, SpaceField, SpaceIn, lever_model, space_type
from trainers import DEVICES_ALLOWED, PRECISIONS, Precision
from trainers.program import MAX_NPROC
from tuner.evidence.recommendation import recommends
from tuner.request import JobSpec, StoredJob
from tuner.search.proposing.defaults import (
    DEFAULT_TRIALS,
    MAX_MEMORY_BYTES,
    MAX_PATIENCE,
    MAX_TRIALS,
)
from tuner.service.submissions import ORPHANED_LEASES

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
# A registry name, or a library model: `torchvision:resnet50`, `timm:convnext_atto`, `hf:causal-lm`.
WorkloadName = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^([a-z]+:)?[A-Za-z0-9_.-]+$")
]
PrecisionName = Precision
Objective = Literal["throughput", "memory"]
Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
# The CLI's device syntax (`trainers.DEVICE_PATTERN`, checked by `check_spec`, whose error names
# the syntax: a length limit of 8 had answered `cuda:1000` with "at most 8 characters").
Device = Annotated[str, Field(min_length=1, max_length=64)]


_THROUGHPUT: list[Objective] = ["throughput"]
MAX_GPUS = 64  # the API's cap: GPUs of one node


def _gpus(value: object) -> int | str:
    # One rule and one message for both forms (a union would report each member's failure).
    if value == "all" or (
        isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_GPUS
    ):
        return value  # "all" or an int, as checked
    raise ValueError(f"allowed 'all' or a whole number 1..{MAX_GPUS}")


Gpus = Annotated[
    int | str,
    PlainValidator(_gpus),
    WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_GPUS}, {"const": "all"}]}
    ),
]


class JobIn(Strict):
    """A tuning job. `workload` is a name of the server's registry (never code or a path)."""

    workload: WorkloadName = Field(
        description="a workload of the server's registry (e.g. transformer) or a library model "
        "(torchvision:resnet50, timm:NAME, hf:causal-lm; `python -m tuner models`)"
    )
    preset: Name = Field(description="the workload's size, e.g. tiny, small")
    space: SpaceField = "auto"
    fix: FixIn = Field(default_factory=FixIn)
    trials: int = Field(
        default=DEFAULT_TRIALS,
        ge=1,
        le=MAX_TRIALS,
        # `n_trials`: its name until 2026-11-27, still read so that older clients keep working.
        validation_alias=AliasChoices("trials", "n_trials"),
        description="trials to run: the same name, default and bounds as the CLI's --trials "
        "(`n_trials`, its former name, is still accepted)",
    )
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=30 * 86_400,
        description="stop starting trials after this many seconds",
    )
    objectives: list[Objective] = Field(
        default_factory=lambda: _THROUGHPUT.copy(),
        min_length=1,
        max_length=2,
        description='["throughput"] or ["throughput", "memory"] (a Pareto front)',
    )
    max_memory_bytes: int | None = Field(
        default=None,
        ge=1,
        le=MAX_MEMORY_BYTES,
        description="recommend the fastest config under this",
    )
    device: Device = Field(
        default="auto",
        description=f"{DEVICES_ALLOWED}: on cuda:INDEX only the worker of that GPU runs it",
    )
    model_args: dict[ModelArgKey, ModelArgValue] = Field(
        default_factory=dict,
        max_length=32,
        description="a library model's options, as strings, numbers or booleans, e.g. "
        '{"batch": 64, "image": "224", "tie": true}',
    )
    precision: PrecisionName | None = Field(
        default=None,
        description="fixed for the study: fp32, tf32, bf16-autocast or "
        "fp16-autocast (default: the workers' matmul precision)",
    )
    precisions: list[PrecisionName] | None = Field(
        default=None,
        min_length=1,
        max_length=len(PRECISIONS),
        description="the precisions the search may choose among, e.g. "
        '["bf16-autocast", "float8"]: precision becomes a searched setting, and a trial in '
        "another than `precision` (default: the first listed) is judged by equivalence "
        "against it (default: `precision` alone, never searched)",
    )
    nproc_per_node: int = Field(
        default=1,
        ge=1,
        le=MAX_NPROC,
        description="processes per trial on the worker's node, one per GPU (gloo on a CPU): "
        "above 1, each trial is a torchrun launch and DDP, FSDP2 and their settings are searched",
    )
    screen: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="screen, then gate: a trial slower than the fastest so far is pruned after "
        "two timed windows and never gated, and one predicted not to fit or to lose is not run; "
        "auto: on for the scale space (models of 250M parameters or more on a GPU) and for "
        "nproc_per_node above 1",
    )
    patience: int | None = Field(
        default=None,
        ge=0,
        le=MAX_PATIENCE,
        description="stop starting trials after this many in a row (every worker's) without a "
        "gain above the tie margin, then decide; 0 turns the rule off (default: 4 on a GPU's "
        "default and scale spaces, off otherwise)",
    )
    gpus: Gpus = Field(
        default="all",
        description="workers (one per GPU) that may run the job's trials at once: all (every "
        "free worker that can measure it) or a number; the final round runs on one of them",
    )

    @field_validator("objectives")
    @classmethod
    def _throughput_first(cls, value: list[str]) -> list[str]:
        if value[0] != "throughput" or len(set(value)) != len(value):
            raise ValueError('allowed ["throughput"] or ["throughput", "memory"]')
        return value

    def to_spec(self) -> JobSpec:
        """The request as the tuner reads it: every field by its name (they are `JobSpec`'s)."""
        values: dict[str, Any] = {name: getattr(self, name) for name in type(self).model_fields}
        if isinstance(self.space, BaseModel):  # SpaceIn, or job_model()'s
            values["space"] = self.space.model_dump(exclude_none=True)
        values["fix"] = self.fix.model_dump(exclude_none=True)
        values["objectives"] = tuple(self.objectives)
        values["model_args"] = dict(self.model_args)
        values["precisions"] = None if self.precisions is None else tuple(self.precisions)
        return JobSpec(**values)


def job_model() -> type[JobIn]:
    """`JobIn` with `space` and `fix` built from the lever table as it is now. `JobIn` itself is
    built when this module is imported, with every lever `trainers` declares then; a lever
    registered later (a test's own) is offered by the model this returns."""
    space_in = lever_model("SpaceIn", SpaceIn.__doc__ or "", searched=True)
    fix_in = lever_model("FixIn", FixIn.__doc__ or "", searched=False)
    fields: dict[str, Any] = {
        "space": (space_type(space_in), "auto"),
        "fix": (fix_in, Field(default_factory=fix_in)),
    }
    return create_model("JobIn", __base__=JobIn, __doc__=JobIn.__doc__, **fields)


class Unknown(enum.Enum):
    """What live workers offer was not read (a job just created: its status is all it asks)."""

    UNKNOWN = "unknown"


UNKNOWN = Unknown.UNKNOWN


class JobLinks(BaseModel):
    self: str
    trials: str
    best: str
    report: str
    cancel: str
    study: str


class StoredJobRow(StoredJob, Protocol):
    """What `JobOut.of` reads of a stored job: the service's row (`tuner.service.tables.JobRow`
    has these), named here so that the API does not import the database's tables."""

    @property
    def id(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def device(self) -> str: ...
    @property
    def study(self) -> str: ...
    @property
    def n_complete(self) -> int: ...
    @property
    def n_failed(self) -> int: ...
    @property
    def n_pruned(self) -> int: ...
    @property
    def n_interrupted(self) -> int | None: ...
    @property
    def best(self) -> dict[str, Any] | None: ...
    @property
    def recommendation(self) -> dict[str, Any] | None: ...
    @property
    def hardware(self) -> str | None: ...
    @property
    def phase(self) -> str | None: ...
    @property
    def cancel_requested(self) -> bool: ...
    @property
    def attempts(self) -> int: ...
    @property
    def error(self) -> str | None: ...
    @property
    def created_at(self) -> dt.datetime: ...
    @property
    def updated_at(self) -> dt.datetime: ...
    @property
    def started_at(self) -> dt.datetime | None: ...
    @property
    def finished_at(self) -> dt.datetime | None: ...
    @property
    def heartbeat_at(self) -> dt.datetime | None: ...


class JobOut(BaseModel):
    id: str
    status: Status
    workload: str
    preset: str
    device: Device
    space: str | dict[str, Any]
    fix: dict[str, Any]
    trials: int = Field(description="trials asked for")
    model_args: dict[str, str] = Field(default_factory=dict)
    precision: str | None = None
    precisions: list[str] | None = Field(
        default=None, description="the precisions the search chose among (null: `precision`)"
    )
    nproc_per_node: int = Field(default=1, description="processes per trial")
    screen: str = Field(default="auto", description="screen, then gate: auto, on or off")
    patience: int | None = Field(default=None, description="trials in a row without a gain")
    gpus: int | str = Field(default="all", description="workers that may run its trials at once")
    n_complete: int = Field(description="complete trials (Optuna COMPLETE) so far")
    n_failed: int
    n_pruned: int
    n_interrupted: int = Field(
        default=0,
        description="trials cut short by the service (a "
        "worker lost, a cancel): run again, never counted",
    )
    timeout_s: float | None
    objectives: list[str]
    max_memory_bytes: int | None
    fastest_trial: BestSoFar | None = Field(
        description="the fastest complete trial so far (one short measurement); the "
        "recommendation is `links.best`"
    )
    has_recommendation: bool
    hardware: str | None
    phase: str | None = Field(description="what the worker is doing now")
    search_ended: str | None = Field(
        default=None, description="what ended the search's trials once decided, e.g. patience"
    )
    space_notes: list[str] = Field(default=[], description="once decided: what the space left out")
    waiting: str | None = Field(
        default=None,
        description="why a queued job is not running yet, or why a running one is not "
        "moving: no worker has heartbeated it for two leases (null: neither)",
    )
    stuck: bool = Field(
        default=False,
        description="queued for a device that no live worker offers while others are alive: "
        "it runs only when a worker on that device starts; cancel it or submit it for another "
        "device (with no worker alive, as while `serve` starts them, false: see `waiting`)",
    )
    cancel_requested: bool
    attempts: int = Field(description="times a worker claimed the job")
    error: str | None
    study: str
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    updated_at: dt.datetime
    heartbeat_at: dt.datetime | None
    links: JobLinks

    @classmethod
    def of(
        cls,
        row: StoredJobRow,
        offered: set[str] | Unknown | None = UNKNOWN,
        lease_s: float | None = None,
    ) -> JobOut:
        """The job's request (`JobSpec`) and progress; `offered`: the devices live workers run
        (`Submissions.offered_devices`; None: no worker alive), which say why a job waits;
        `lease_s`: the workers' lease, past which a running job's workers are taken for gone."""
        base, search = f"/v1/jobs/{row.id}", (row.recommendation or {}).get("search") or {}
        return cls.model_validate(
            dataclasses.asdict(JobSpec.of(row))
            | _waiting(row, offered, lease_s)
            | {
                "id": row.id,
                "status": row.status,
                "n_complete": row.n_complete,
                "n_failed": row.n_failed,
                "n_pruned": row.n_pruned,
                "n_interrupted": row.n_interrupted or 0,
                # One name per meaning: `best` is the recommendation (`links.best`).
                "fastest_trial": None if row.best is None else BestSoFar.model_validate(row.best),
                "has_recommendation": recommends(row.recommendation),
                "hardware": row.hardware,
                "phase": row.phase,
                "search_ended": (search.get("ended") or {}).get("why"),
                "space_notes": search.get("space_notes") or [],
                "cancel_requested": row.cancel_requested,
                "attempts": row.attempts,
                "error": row.error,
                "study": row.study,
                "created_at": utc(row.created_at),
                "started_at": utc(row.started_at),
                "finished_at": utc(row.finished_at),
                "updated_at": utc(row.updated_at),
                "heartbeat_at": utc(row.heartbeat_at),
                "links": JobLinks(
                    self=base,
                    trials=f"{base}/trials",
                    best=f"{base}/best",
                    report=f"{base}/report",
                    cancel=f"{base}/cancel",
                    study=f"/v1/studies/{row.study}",
                ),
            }
        )


def _waiting(
    row: StoredJobRow, offered: set[str] | Unknown | None, lease_s: float | None
) -> dict[str, Any]:
    """`waiting` and `stuck` of a queued job: a job no live worker can run says so, and a
    client's polling loop can end on `stuck` instead of waiting forever; `waiting` of a running
    job its workers have left (`_orphaned`)."""
    if row.status == "running":
        return _orphaned(row, offered, lease_s)
    if row.status != "queued" or offered is UNKNOWN:
        return {}
    if offered is None:
        return {"waiting": "no live worker: none is running now (GET /healthz counts them)"}
    if row.device not in offered:
        return {
            "waiting": f"no live worker offers device {row.device!r} (they offer "
            f"{', '.join(sorted(offered))}): start a worker on it, or cancel the job",
            "stuck": True,
        }
    return {"waiting": f"for a free worker offering {row.device!r}"}


def _orphaned(
    row: StoredJobRow, offered: set[str] | Unknown | None, lease_s: float | None
) -> dict[str, Any]:
    """`waiting` of a running job that no worker has heartbeated for `ORPHANED_LEASES` leases
    (`Submissions.orphaned`): a worker killed outright had left it "running" with no word until
    another worker started (a probe, 2026-12-07). Not `stuck`: as for a queued job with no
    worker alive, a worker that starts (a restarted `serve`'s) takes it over."""
    beat = utc(row.heartbeat_at)
    if lease_s is None or offered is UNKNOWN or beat is None:
        return {}
    if dt.datetime.now(dt.UTC) - beat <= dt.timedelta(seconds=ORPHANED_LEASES * lease_s):
        return {}
    alive = "no worker is alive" if offered is None else "the live workers have not taken it yet"
    return {
        "waiting": f"no worker has heartbeated it since {beat:%Y-%m-%d %H:%M:%S} UTC and {alive}: "
        "a worker that starts takes it over, and a cancel ends it (unless its final round is "
        "under way)"
    }


class JobPage(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int


class TrialOut(BaseModel):
    number: int
    state: Literal["running", "waiting", "complete", "pruned", "fail"]
    counted: bool = Field(
        description="counts toward the job's n_trials (false: cut short by "
        "the service and run again)"
    )
    config: dict[str, Any] | None
    params: dict[str, Any]
    throughput: float | None = Field(description="samples/s: median of the pooled windows")
    ci95: list[float | None] | None
    windows: list[float | None] | None
    peak_memory_bytes: int | None
    failure_reason: str | None
    failure_kind: str | None
    stopped: bool = Field(description="stopped at a window by a cancel or a shutdown")
    duplicate_of: int | None
    same_as: int | None = Field(
        default=None,
        description="not run: this trial, copied from an earlier job, measured its config",
    )
    copied_from: dict[str, Any] | None = Field(
        default=None, description="copied, not run: {study, trial} of an earlier job's study"
    )
    pruned_reason: str | None = Field(
        default=None,
        description="why a pruned trial was not run or not measured in full: its screen "
        "against the fastest trial so far, its predicted memory or speed, or the copied trial "
        "that measured its config",
    )
    time: dict[str, float] | None = Field(
        default=None, description="the trial's seconds by phase: compile, measure, gate parts"
    )
    started_at: dt.datetime | None
    completed_at: dt.datetime | None
    duration_s: float | None = Field(description="null for a copy: this job did not run it")


class TrialPage(BaseModel):
    items: list[TrialOut]
    total: int
    limit: int
    offset: int
