"""What a job asks for (`JobSpec`, from `tuner.request`), the workloads a server runs
(`WorkloadRegistry`), and the checks only the tuner can make on a request (`check_spec`)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import torch

import trainers
from trainers import did_you_mean
from trainers.program import PREFIX as PROGRAM_PREFIX
from trainers.program import Program, load_registry
from trainers.workloads import catalog, lookup, samples_per_batch_of
from tuner.errors import SpaceError, SpecError, TunerError
from tuner.request import JobSpec
from tuner.search.options import check_patience
from tuner.search.spaces.named import load_space, program_space, user_fixed
from tuner.search.spaces.pinned import check_left, check_pins, searches
from tuner.search.spaces.processes import for_processes

__all__ = ["JobSpec", "WorkloadRegistry", "check_spec", "is_library_model"]

PLUGIN_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
"""A plug-in's registered name: what the API's `workload` takes without a family prefix."""
GPUS_ALLOWED = "allowed 'all' or a whole number from 1"


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

    def load_programs(self) -> Mapping[str, Program]:
        """The registry's programs, read now: a ConfigError for a file that is wrong."""
        return {} if not self.programs_file else load_registry(self.programs_file)

    @property
    def programs(self) -> Mapping[str, Program]:
        """`load_programs`, but a file edited into an error since the server started lists no
        program: every request had failed with a 500, for a built-in workload too (a probe,
        2026-12-06); a request for a program is told why (`_check_workload`)."""
        try:
            return self.load_programs()
        except trainers.ConfigError:
            return {}

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
        """The presets of a built-in or a library model, and those a plug-in's factory declares
        (`factory.presets`); None for a plug-in that declares none (its factory checks its own
        when the job runs)."""
        if name in trainers.BUILTIN:
            return tuple(trainers.PRESETS[name])
        if name in self.plugins:
            declared = getattr(trainers.resolve_factory(self.plugins[name]), "presets", None)
            return None if declared is None else tuple(declared)
        if name.startswith(PROGRAM_PREFIX):
            program = self.programs.get(name.removeprefix(PROGRAM_PREFIX))
            return None if program is None else program.presets
        found = lookup(name) if name not in self.plugins else None
        return None if found is None else tuple(found[0].family.presets)

    def check(self, *, served: bool = False) -> None:
        """Import every plug-in factory and read the programs' registry now, so that a typo
        stops the server at start. `served`: the API takes these names, so each must be one a
        job can ask for (`--gpus` registers a module path for its own workers)."""
        self.load_programs()
        for name, target in self.plugins.items():
            if ":" not in target:
                raise TunerError(
                    f"TUNER_WORKLOADS: {name}={target!r} is not package.module:factory"
                )
            if served and not PLUGIN_NAME.fullmatch(name):
                # A job's `workload` could never name it, while the 422s listed it as allowed.
                raise TunerError(
                    f"TUNER_WORKLOADS: {name!r} is not a name a job can ask for: allowed 1 to "
                    "128 letters, digits, '_', '.' and '-'"
                )
            if name in trainers.BUILTIN or name.startswith(PROGRAM_PREFIX):
                # The built-in (or the program) would win, and the plug-in never run.
                raise TunerError(
                    f"TUNER_WORKLOADS: {name!r} is a built-in workload's name or a program's "
                    "prefix; register the plug-in under another name"
                )
            try:
                # Its declared presets read too: a malformed `presets` stops the server here.
                getattr(trainers.resolve_factory(target), "presets", None)
            except trainers.WorkloadError as exc:
                raise TunerError(f"TUNER_WORKLOADS: {name}={target!r}: {exc}") from exc


def _check_precisions(spec: JobSpec) -> None:
    """The job's precisions, by the rule `RunOptions` applies (`trainers.PrecisionSpec.of`)."""
    program = spec.workload if spec.workload.startswith(PROGRAM_PREFIX) else None
    try:
        trainers.PrecisionSpec.of(
            spec.precision, spec.precisions, nproc_per_node=spec.nproc_per_node, program=program
        )
    except trainers.ConfigError as exc:
        raise SpecError((exc.field,), str(exc), exc.value) from exc


def _check_device(spec: JobSpec) -> None:
    """What a job's device cannot run, refused at submission (naming the field) by the rule the
    CLI applies before its first trial (`trainers.check_precision_here`): float8 on a `cpu`
    job. A CUDA graph or `reduce-overhead` pinned on a `cpu` job is refused by its space
    (`load_space(cuda=False)`). With `auto`, `cuda` or `cuda:INDEX` the GPU is the worker's,
    known only there. The device's syntax is the CLI's (`DEVICES_ALLOWED`)."""
    if not trainers.DEVICE_PATTERN.fullmatch(spec.device):
        allowed = trainers.DEVICES_ALLOWED
        raise SpecError(("device",), f"allowed {allowed}, not {spec.device!r}", spec.device)
    if spec.device != "cpu":
        return
    cpu = torch.device("cpu")
    for field, values in (("precision", (spec.precision,)), ("precisions", spec.precisions)):
        for value in values or ():
            try:
                trainers.check_precision_here(value, cpu)
            except trainers.UnsupportedOnDevice as exc:
                said = str(exc).removesuffix("; this run's device is cpu")
                raise SpecError(
                    (field,),
                    f"{said}; this job's device is cpu (auto or cuda runs on a GPU)",
                    value,
                ) from exc


def check_spec(spec: JobSpec, registry: WorkloadRegistry) -> None:
    """What only the tuner knows: the workload and preset exist, the space and pins are valid.

    Raises SpecError naming the field. The space is checked the way the run will read it.
    """
    _check_workload(spec, registry)
    _check_precisions(spec)
    _check_device(spec)
    _check_model_args(spec, registry)
    refused = preset_refusal(registry, spec.workload, spec.preset)
    if refused is not None:
        raise SpecError(("preset",), refused, spec.preset)
    _check_gpus(spec.gpus)
    _check_processes(spec)
    try:
        check_patience(spec.patience, spec.objectives)
    except trainers.ConfigError as exc:
        raise SpecError(("patience",), str(exc), spec.patience) from exc
    _check_space(spec, registry)


def _check_workload(spec: JobSpec, registry: WorkloadRegistry) -> None:
    try:  # a library family's own refusal (`hf:os`: no such kind) is the request's error
        is_library_model(spec.workload)
    except trainers.WorkloadError as exc:
        raise SpecError(("workload",), str(exc), spec.workload) from exc
    if not registry.knows(spec.workload):
        if spec.workload.startswith(PROGRAM_PREFIX):
            try:
                registry.load_programs()
            except trainers.ConfigError as exc:
                raise SpecError(
                    ("workload",),
                    f"{spec.workload}: the server's program registry cannot be read now ({exc})",
                    spec.workload,
                ) from exc
        raise SpecError(("workload",), unknown_workload(registry, spec.workload), spec.workload)


def unknown_workload(registry: WorkloadRegistry, workload: str) -> str:
    """Why a job, or a lookup of recommendations, cannot name `workload`: what the server runs,
    and for a module path, how an operator registers one."""
    hint = f"; {MODULE_PATH_HINT}" if ":" in workload else ""
    return f"unknown workload {workload!r}: allowed {registry.allowed()}{hint}"


def preset_refusal(registry: WorkloadRegistry, workload: str, preset: str) -> str | None:
    """Why `preset` is not one of `workload`'s declared presets (None: it is, or none are)."""
    presets = registry.presets(workload)
    if presets is None or preset in presets:
        return None
    hint = did_you_mean(preset, presets)
    return f"{workload} has no preset {preset!r}: allowed {', '.join(presets)}{hint}"


MODULE_PATH_HINT = (
    "a module path (package.module:factory) is not taken over the API: the server's operator "
    'registers one under a name (TUNER_WORKLOADS=\'{"name": "package.module:factory"}\'), and a '
    "job asks for that name"
)


def _check_model_args(spec: JobSpec, registry: WorkloadRegistry) -> None:
    if is_library_model(spec.workload) and spec.workload not in registry.plugins:
        try:  # the model exists, its library is installed, every option is allowed
            trainers.resolve_factory(spec.workload, spec.model_args)
            trainers.workload_key(spec.workload, spec.preset, spec.model_args)
        except trainers.WorkloadError as exc:
            loc = tuple((exc.field or "workload").split(".", 1)) if exc.field else ("workload",)
            # The 422 echoes the value at fault, not the workload's name.
            if loc[0] == "model_arg":
                loc, value = ("model_args", *loc[1:]), spec.model_args.get(loc[-1], spec.model_args)
            else:
                value = spec.preset if loc[0] == "preset" else spec.workload
            raise SpecError(loc, str(exc), value) from exc
    elif spec.model_args:
        raise SpecError(
            ("model_args",),
            f"{spec.workload!r} takes no model_args: they apply "
            "to library models (torchvision:, timm:, hf:) only",
            spec.model_args,
        )


def _check_processes(spec: JobSpec) -> None:
    """Each process trains on an equal shard: a count that does not divide the batch is refused
    here where the batch is known without building the model (it had been queued, then failed
    once a worker built it, where `python -m tuner run` refused it at once)."""
    if spec.nproc_per_node <= 1:
        return
    size = samples_per_batch_of(spec.workload, spec.preset, spec.model_args)
    if size is not None and size % spec.nproc_per_node:
        raise SpecError(
            ("nproc_per_node",),
            f"nproc_per_node={spec.nproc_per_node} is invalid: allowed a divisor of the global "
            f"batch ({spec.workload} {spec.preset} has {size} samples per batch: each process "
            "trains on an equal shard)",
            spec.nproc_per_node,
        )


SEARCHES_NOTHING = (
    "a space with at least one searched setting (a list of two or more choices, or a range with "
    "low < high): one that searches nothing measures one config in every trial"
)


def _check_space(spec: JobSpec, registry: WorkloadRegistry) -> None:
    cuda = spec.device != "cpu"
    try:
        space = load_space(spec.space, cuda=cuda)
    except SpaceError as exc:
        raise _spec_error("space", exc) from exc
    if not any(searches(param) for param in space.params.values()):
        # One choice, or a range of one value, searches nothing either (`{"low": 2, "high": 2}`
        # had been queued where `2` was refused).
        raise SpecError(
            ("space",),
            f"space is invalid: allowed {SEARCHES_NOTHING}",
            spec.space,
        )
    if spec.nproc_per_node > 1 and spec.workload.startswith(PROGRAM_PREFIX):
        raise SpecError(
            ("nproc_per_node",),
            f"1 for a program ({spec.workload} starts its own processes; data-parallel trials "
            "run the built-in loop under torchrun)",
            spec.nproc_per_node,
        )
    program = spec.workload if spec.workload.startswith(PROGRAM_PREFIX) else None
    precision = trainers.PrecisionSpec.of(
        spec.precision, spec.precisions, nproc_per_node=spec.nproc_per_node, program=program
    )  # valid: `_check_precisions` ran first
    precisions = precision.allowed
    try:
        pinned = load_space(spec.space, fix=spec.fix, cuda=cuda)
        if isinstance(spec.space, Mapping) and not any(map(searches, pinned.params.values())):
            # As a space that searches nothing is refused above: every trial one config.
            raise SpecError(
                ("fix",),
                "pins that leave the space something to search: these fix every setting it "
                f"searches ({', '.join(sorted(space.params))})",
                spec.fix,
            )
        # The data-parallel levers' rules for this many processes (a pinned parallel, a graph,
        # a wrapper's settings left out of one process's space: none left is refused here, not
        # queued to fail at the worker).
        asked, pinned = pinned, for_processes(pinned, spec.nproc_per_node)
        if not precision.searched:
            check_left(list(asked.params), pinned, len(asked.notes))
        if program is not None:
            entry = registry.programs[program.removeprefix(PROGRAM_PREFIX)]
            asked, pinned = pinned, program_space(pinned, entry, user_fixed(spec.space, spec.fix))
            if not precision.searched:  # else the precision is searched: the trials differ
                # As the run refuses it (`tuner.search.study`): it had been queued, then failed.
                check_left(list(asked.params), pinned, len(asked.notes))
        # A pin no draw could run (the model's own refusals need the model: the worker's).
        check_pins(pinned, precisions or ("fp32",), None)
    except SpaceError as exc:
        # A setting the space file fixes, not a pin, is the space's.
        raise _spec_error("fix" if exc.field in spec.fix else "space", exc) from exc


def _check_gpus(gpus: object) -> None:
    if gpus != "all" and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise SpecError(("gpus",), f"{GPUS_ALLOWED}, not {gpus!r}", gpus)


def _spec_error(where: str, exc: SpaceError) -> SpecError:
    loc = (where, exc.field) if exc.field in trainers.field_names() else (where,)
    return SpecError(loc, str(exc), exc.value)
