"""What a tuning job asks for (`JobSpec`): the one request of the CLI and the service.

`python -m tuner run` builds it from its flags, the API from its JSON body
(`api.schemas.jobs.JobIn`, whose fields are these), and both run it through `run_options`
with how that process measures (the CLI's other flags, a worker's `TUNER_*` settings). One name, one
default and one set of bounds per setting follows from that: the API's model takes its bounds from
the constants the CLI's flags and `RunOptions` check (`tuner.search.proposing.defaults`), and
tests/api/test_request_parity.py holds them to it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol

from tuner.search.proposing.defaults import DEFAULT_TRIALS

if TYPE_CHECKING:  # imported when a run is built: `JobSpec` alone imports no torch (`tuner.flags`)
    from tuner.search.options import RunOptions


class StoredJob(Protocol):
    """What `JobSpec.of` reads of a stored job (`tuner.service.tables.JobRow`)."""

    spec: dict[str, Any]
    trials: int


@dataclasses.dataclass(kw_only=True, frozen=True)
class JobSpec:
    """A job's request, already checked for shape (bounds) by its caller.

    space: "auto" (compile on a GPU, full on a CPU), "full", "streams", "compile", "scale", or
        {LoopConfig field: [choices] | {"low", "high", "log"} | value}.
    fix: {LoopConfig field: value}, pinned whatever the space says.
    """

    workload: str
    preset: str
    space: str | dict[str, Any] = "auto"
    fix: dict[str, Any] = dataclasses.field(default_factory=dict)
    trials: int = DEFAULT_TRIALS
    """Trials to run (`--trials`, the API's `trials`): counted trials, 1 to MAX_TRIALS."""
    timeout_s: float | None = None
    objectives: tuple[str, ...] = ("throughput",)
    max_memory_bytes: int | None = None
    device: str = "auto"
    """auto, cpu, cuda or cuda:INDEX (`trainers.DEVICES_ALLOWED`, the CLI's syntax). A job on
    `cuda:INDEX` is run by the worker of that GPU of the node (`python -m tuner worker --gpu
    INDEX`); on `cuda`, by any GPU worker."""
    model_args: dict[str, str] = dataclasses.field(default_factory=dict)
    """A library model's options (`torchvision:`, `timm:`, `hf:` workloads), as strings."""
    precision: str | None = None
    """fp32, tf32, bf16-autocast, fp16-autocast or float8; None: the run's matmul precision
    (with `precisions`, the first of them)."""
    precisions: tuple[str, ...] | None = None
    """The precisions the search may choose among (`RunOptions.precisions`); None: `precision`."""
    nproc_per_node: int = 1
    """Processes per trial on the worker's node (`RunOptions.nproc_per_node`)."""
    screen: str = "auto"
    """Screen, then gate (`RunOptions.screen`): auto, on or off."""
    patience: int | None = None
    """Stop starting trials after this many in a row without a gain (`RunOptions.patience`): 0
    turns the rule off; None: the default (on a GPU's default space, AUTO_PATIENCE). It counts
    every worker's trials, and a job whose search it stops goes on to its final round."""
    gpus: int | str = "all"
    """How many workers (one per GPU) may run the job's trials at once: "all" (every free
    worker that can measure it) or a number from 1. The final round runs on one of them either
    way. `run` without --gpus is one process: 1."""

    @property
    def max_members(self) -> int | None:
        """The most workers the job takes (`Membership.join`); None: no limit."""
        return None if self.gpus == "all" else int(self.gpus)

    def to_stored(self) -> dict[str, Any]:
        """The row's `spec` column: every field but `trials`, which the row's own column holds
        (its one stored place: `tuner.service.slots.count_slots` reads it there)."""
        data = dataclasses.asdict(self)
        del data["trials"]
        data["objectives"] = list(self.objectives)
        data["precisions"] = None if self.precisions is None else list(self.precisions)
        return data

    @classmethod
    def of(cls, row: StoredJob) -> JobSpec:
        """The request of a stored job. Rows stored before the trials had one place also carry
        them in `spec` (as `n_trials`); the column wins (they were written equal). A key no field
        has any more is left out."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"trials"}
        values = {k: v for k, v in row.spec.items() if k in fields}
        values["objectives"] = tuple(values.get("objectives", ("throughput",)))
        if values.get("precisions") is not None:
            values["precisions"] = tuple(values["precisions"])
        return cls(**values, trials=row.trials)


# The fields a run takes from its job's request (`run_options`); `gpus` is the node's.
_SPEC_FIELDS = frozenset(f.name for f in dataclasses.fields(JobSpec)) - {"gpus"}


def run_options(
    spec: JobSpec,
    *,
    workload: str | None = None,
    device: str | None = None,
    budget: bool = True,
    **settings: Any,
) -> RunOptions:
    """The run of `spec`: what the job asks (its fields, by the same names in `RunOptions`) and
    how this process measures it (`settings`: the other fields, from the CLI's flags or a
    worker's `TUNER_*` settings). The one way the CLI and the service's workers build a run.

    workload: what this process runs for the spec's workload name (a worker's plug-in
        factory path); device: this process's own device for the spec's (a worker's GPU).
    budget: False where the spec's `timeout_s` is kept by someone else (a worker: the job's
        slots hold its deadline for every member, `tuner.service.slots`), so the run has none.
    """
    from tuner.search.options import RunOptions

    asked = sorted(settings.keys() & _SPEC_FIELDS)
    if asked:
        raise TypeError(f"run_options: {', '.join(asked)} come from the spec, not the settings")
    return RunOptions(
        workload=spec.workload if workload is None else workload,
        preset=spec.preset,
        trials=spec.trials,
        timeout_s=spec.timeout_s if budget else None,
        space=spec.space,
        fix=spec.fix,
        device=spec.device if device is None else device,
        objectives=tuple(spec.objectives),
        max_memory_bytes=spec.max_memory_bytes,
        model_args=dict(spec.model_args),
        precision=spec.precision,  # type: ignore[arg-type]  # RunOptions checks it, by name
        precisions=spec.precisions,
        nproc_per_node=spec.nproc_per_node,
        screen=spec.screen,
        patience=spec.patience,
        **settings,
    )
