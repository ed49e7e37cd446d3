"""What a job asks for (`JobSpec`), the workloads a server runs (`WorkloadRegistry`), and the
checks only the tuner can make on a request (`check_spec`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

import trainers
from trainers.program import PREFIX as PROGRAM_PREFIX
from trainers.program import Program, load_registry
from trainers.workloads import catalog, lookup
from tuner.errors import SpaceError, SpecError, TunerError
from tuner.search.options import check_allowed_precisions
from tuner.search.proposing.defaults import DEFAULT_TRIALS
from tuner.search.spaces.named import load_space, program_space
from tuner.search.spaces.processes import for_processes
from tuner.service.tables import JobRow

DEVICES = ("auto", "cpu", "cuda")
GPUS_ALLOWED = "allowed 'all' or a whole number from 1"


@dataclasses.dataclass(kw_only=True, frozen=True)
class JobSpec:
    """A job's request, already checked for shape (bounds) by its caller.

    space: "auto" (compile on a GPU, full on a CPU), "full", "streams", "compile", or
        {LoopConfig field: [choices] | {"low", "high", "log"} | value}.
    fix: {LoopConfig field: value}, pinned whatever the space says.
    """

    workload: str
    preset: str
    space: str | dict[str, Any] = "auto"
    fix: dict[str, Any] = dataclasses.field(default_factory=dict)
    n_trials: int = DEFAULT_TRIALS
    timeout_s: float | None = None
    objectives: tuple[str, ...] = ("throughput",)
    max_memory_bytes: int | None = None
    device: str = "auto"
    model_args: dict[str, str] = dataclasses.field(default_factory=dict)
    """A library model's options (`torchvision:`, `timm:`, `hf:` workloads), as strings."""
    precision: str | None = None
    """fp32, tf32, bf16-autocast or fp16-autocast; None: the worker's matmul precision (with
    `precisions`, the first of them)."""
    precisions: tuple[str, ...] | None = None
    """The precisions the search may choose among (`RunOptions.precisions`); None: `precision`."""
    nproc_per_node: int = 1
    """Processes per trial on the worker's node (`RunOptions.nproc_per_node`)."""
    screen: str = "auto"
    """Screen, then gate (`RunOptions.screen`): auto, on or off."""
    gpus: int | str = "all"
    """How many workers (one per GPU) may run the job's trials at once: "all" (every free
    worker that can measure it, as before the field existed) or a number from 1. The final
    round runs on one of them either way."""

    @property
    def max_members(self) -> int | None:
        """The most workers the job takes (`Membership.join`); None: no limit."""
        return None if self.gpus == "all" else int(self.gpus)

    def to_stored(self) -> dict[str, Any]:
        """The row's `spec` column: every field but `n_trials`, which the row's own column holds
        (its one stored place: `tuner.service.slots.count_slots` reads it there)."""
        data = dataclasses.asdict(self)
        del data["n_trials"]
        data["objectives"] = list(self.objectives)
        data["precisions"] = None if self.precisions is None else list(self.precisions)
        return data

    @classmethod
    def of(cls, row: JobRow) -> JobSpec:
        """The request of a stored job. Rows stored before `n_trials` had one place also carry it
        in `spec`; the column wins (they were written equal). A key no field has any more is
        left out."""
        fields = {f.name for f in dataclasses.fields(cls)} - {"n_trials"}
        values = {k: v for k, v in row.spec.items() if k in fields}
        values["objectives"] = tuple(values.get("objectives", ("throughput",)))
        if values.get("precisions") is not None:
            values["precisions"] = tuple(values["precisions"])
        return cls(**values, n_trials=row.n_trials)


def is_library_model(name: str) -> bool:
    """`torchvision:NAME`, `timm:NAME` or `hf:KIND` (whether or not the library is installed)."""
    return lookup(name) is not None


@dataclasses.dataclass(frozen=True)
class WorkloadRegistry:
    """The workloads a server runs, by name: the built-ins plus the operator's plug-ins.

    A plug-in maps a name to `package.module:factory`; the API only ever receives the name.
    """

    plugins: Mapping[str, str] = dataclasses.field(default_factory=dict)
    programs_file: str | None = None
    """The registry of programs (`TUNER_PROGRAMS`, trainers/program/runner.py): a job names one as
    `program:NAME`; its command never comes from the request."""

    @property
    def programs(self) -> Mapping[str, Program]:
        return {} if not self.programs_file else load_registry(self.programs_file)

    def names(self) -> tuple[str, ...]:
        return (
            *trainers.BUILTIN,
            *(n for n in self.plugins if n not in trainers.BUILTIN),
            *(f"{PROGRAM_PREFIX}{n}" for n in self.programs),
        )

    def allowed(self) -> str:
        usages = ", ".join(family.usage for family in catalog())
        return f"{', '.join(self.names())} or a library model ({usages})"

    def knows(self, name: str) -> bool:
        return name in self.names() or is_library_model(name)

    def target(self, name: str) -> str:
        """What `RunOptions.workload` gets: the built-in name or the plug-in's factory path
        (a library model is its own name: its options travel as `model_args`)."""
        if name in trainers.BUILTIN or (is_library_model(name) and name not in self.plugins):
            return name
        if name.startswith(PROGRAM_PREFIX) and name in self.names():
            return name  # resolved by the worker from its own TUNER_PROGRAMS
        if name in self.plugins:
            return self.plugins[name]
        raise trainers.WorkloadError(
            f"workload={name!r} is invalid: allowed {self.allowed()}", field="workload"
        )

    def presets(self, name: str) -> tuple[str, ...] | None:
        """The presets of a built-in or a library model; None for a plug-in (its factory
        checks its own)."""
        if name in trainers.BUILTIN:
            return tuple(trainers.PRESETS[name])
        if name.startswith(PROGRAM_PREFIX):
            program = self.programs.get(name.removeprefix(PROGRAM_PREFIX))
            return None if program is None else program.presets
        found = lookup(name) if name not in self.plugins else None
        return None if found is None else tuple(found[0].family.presets)

    def check(self) -> None:
        """Import every plug-in factory and read the programs' registry now, so that a typo
        stops the server at start."""
        self.programs  # noqa: B018
        for name, target in self.plugins.items():
            if ":" not in target:
                raise TunerError(
                    f"TUNER_WORKLOADS: {name}={target!r} is not package.module:factory"
                )
            trainers.resolve_factory(target)


def _check_precisions(spec: JobSpec) -> None:
    """The job's precision is one of trainers.PRECISIONS, and the precisions it may choose
    among go together (`check_allowed_precisions`)."""
    if spec.precision is not None and spec.precision not in trainers.PRECISIONS:
        raise SpecError(
            ("precision",),
            f"unknown precision {spec.precision!r}: allowed {', '.join(trainers.PRECISIONS)}",
            spec.precision,
        )
    if spec.precisions is not None:
        try:
            check_allowed_precisions(
                spec.precision,
                spec.precisions,
                nproc_per_node=spec.nproc_per_node,
                workload=spec.workload,
            )
        except trainers.ConfigError as exc:
            raise SpecError((exc.field,), str(exc), exc.value) from exc


def _check_device(spec: JobSpec) -> None:
    """What a job's device cannot run, refused at submission (naming the field) by the rule the
    CLI applies before its first trial (`trainers.check_precision_here`): float8 on a `cpu`
    job. A CUDA graph or `reduce-overhead` pinned on a `cpu` job is refused by its space
    (`load_space(cuda=False)`). With `auto` or `cuda` the GPU is the worker's, known only there."""
    if spec.device != "cpu":
        return
    cpu = torch.device("cpu")
    for field, values in (("precision", (spec.precision,)), ("precisions", spec.precisions)):
        for value in values or ():
            try:
                trainers.check_precision_here(value, cpu)
            except trainers.UnsupportedOnDevice as exc:
                raise SpecError(
                    (field,), f"{exc}; this job's device is cpu (auto or cuda runs on a GPU)", value
                ) from exc


def check_spec(spec: JobSpec, registry: WorkloadRegistry) -> None:
    """What only the tuner knows: the workload and preset exist, the space and pins are valid.

    Raises SpecError naming the field. The space is checked the way the run will read it.
    """
    _check_workload(spec, registry)
    _check_precisions(spec)
    _check_device(spec)
    _check_model_args(spec, registry)
    presets = registry.presets(spec.workload)
    if presets is not None and spec.preset not in presets:
        raise SpecError(
            ("preset",),
            f"{spec.workload} has no preset {spec.preset!r}: allowed {', '.join(presets)}",
            spec.preset,
        )
    _check_gpus(spec.gpus)
    _check_space(spec, registry)


def _check_workload(spec: JobSpec, registry: WorkloadRegistry) -> None:
    try:  # a library family's own refusal (`hf:os`: no such kind) is the request's error
        is_library_model(spec.workload)
    except trainers.WorkloadError as exc:
        raise SpecError(("workload",), str(exc), spec.workload) from exc
    if not registry.knows(spec.workload):
        raise SpecError(
            ("workload",),
            f"unknown workload {spec.workload!r}: allowed {registry.allowed()}",
            spec.workload,
        )


def _check_model_args(spec: JobSpec, registry: WorkloadRegistry) -> None:
    if is_library_model(spec.workload) and spec.workload not in registry.plugins:
        try:  # the model exists, its library is installed, every option is allowed
            trainers.resolve_factory(spec.workload, spec.model_args)
            trainers.workload_key(spec.workload, spec.preset, spec.model_args)
        except trainers.WorkloadError as exc:
            loc = tuple((exc.field or "workload").split(".", 1)) if exc.field else ("workload",)
            raise SpecError(
                ("model_args", *loc[1:]) if loc[0] == "model_arg" else loc, str(exc), spec.workload
            ) from exc
    elif spec.model_args:
        raise SpecError(
            ("model_args",),
            f"{spec.workload!r} takes no model_args: they apply "
            "to library models (torchvision:, timm:, hf:) only",
            spec.model_args,
        )


def _check_space(spec: JobSpec, registry: WorkloadRegistry) -> None:
    cuda = spec.device != "cpu"
    try:
        space = load_space(spec.space, cuda=cuda)
    except SpaceError as exc:
        raise _spec_error("space", exc) from exc
    if not space.params:
        raise SpecError(
            ("space",),
            "an explicit space needs at least one searched setting (a list of choices or a range)",
            spec.space,
        )
    if spec.nproc_per_node > 1 and spec.workload.startswith(PROGRAM_PREFIX):
        raise SpecError(
            ("nproc_per_node",),
            f"1 for a program ({spec.workload} starts its own processes; data-parallel trials "
            "run the built-in loop under torchrun)",
            spec.nproc_per_node,
        )
    try:
        pinned = load_space(spec.space, fix=spec.fix, cuda=cuda)
        # The data-parallel levers' rules for this many processes (a pinned parallel, a graph).
        for_processes(pinned, spec.nproc_per_node)
        if spec.workload.startswith(PROGRAM_PREFIX):
            program_space(pinned, registry.programs[spec.workload.removeprefix(PROGRAM_PREFIX)])
    except SpaceError as exc:
        raise _spec_error("fix", exc) from exc


def _check_gpus(gpus: object) -> None:
    if gpus != "all" and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise SpecError(("gpus",), f"{GPUS_ALLOWED}, not {gpus!r}", gpus)


def _spec_error(where: str, exc: SpaceError) -> SpecError:
    loc = (where, exc.field) if exc.field in trainers.field_names() else (where,)
    return SpecError(loc, str(exc), exc.value)
