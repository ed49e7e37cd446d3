"""The correctness gate as the search sees it: one interface for every kind of run, one verdict.

`Gate.check(config, envelope)` runs the gate for one config and returns a `GateRun`: the typed
verdict (`trainers.gate.ParityVerdict`), the envelope it judged against (the caller stores it
once per study and passes it back), and the seconds each part took. Three gates implement it:
- `InProcessGate`: the built-in workloads, in this process (on a CPU);
- `tuner.search.gating.isolated.ParityProcess`: the same parts in a child process (on a GPU, whose
  deterministic mode and cuBLAS workspace setting outlast a check);
- `tuner.search.gating.program.ProgramGate`: a registered external program
  (`trainers.program.program_parity`).
`make_gate` picks one; the search never asks which.

What the search stores of a verdict is `tuner.search.gating.verdict.GateVerdict`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import trainers
from trainers import LoopConfig
from trainers.gate import (
    MULTIPLE,
    Determinism,
    Envelope,
    GateTest,
    ParityVerdict,
    Twin,
    TwinKind,
    config_determinism,
    exact_length,
    gate,
    parity_losses,
    reference_determinism,
    required_test,
    spread_for,
)
from trainers.workloads import ReusedBuilds, WorkloadFactory
from tuner.store.phases import GATE_CONFIG, GATE_ENVELOPE, GATE_REFERENCE, GATE_TWIN

T = TypeVar("T")

TWIN_KIND: TwinKind = "loop"
"""The twin the search's gate checks a config's loop settings through where the config has no
graph (`trainers.gate.twin`). The loop twin (the loop settings on the reference's eager
arithmetic, held to the reference's bits) caught the planted stream faults under compiled
configs on an H200 as the eager twin does (`tests/trainers/test_gate_gpu.py`, 2026-12-01), in
two eager runs (12-25 s at 0.5B in float8) where the eager twin compiled under strict
determinism (59-137 s). The config's own run, then owed no bits, runs where its trial compiled
(`kept.runs_where_trained`): in the gate's child it had compiled as cold as its trial (136 s
against 132 s; docs/benchmarks/README.md, 2026-12-01)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateRun:
    """What one check gave: the verdict, the envelope it used, the seconds of each part."""

    verdict: ParityVerdict | None
    """None for the envelope measured alone (`Gate.envelope`)."""
    envelope: dict[str, Any]
    time: dict[str, float]
    config_here: bool = False
    """The config's own run was made in the search's process (`tuner.search.gating.kept`)."""
    twin_here: bool = False
    """Its eager twin too, both with that process's own kernels (`kept.run_kept`)."""
    twin_apart: str | None = None
    """Why a config owed its eager twin's bits had that twin run in the gate's child, where it
    compiles the model again (None: it did not, or owed none): said in the gate's line."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CrossPrecision:
    """How a config in another precision than the study's is judged (`run_parts`): over `steps`
    steps (None: the gate's own) and within `multiple` x the reference's seed-to-seed envelope
    (`RunOptions.precision_parity_steps` and `precision_tolerance`)."""

    steps: int | None = None
    multiple: float = MULTIPLE


AS_THE_GATE = CrossPrecision()
"""The gate's own steps and multiple for every config."""


Pending = Callable[[], Mapping[str, Any] | None]
"""The envelope another process is measuring (`ParityCache` with claims): called once the
config's own eager twin has run, it waits for that envelope and returns it (None: it will not
come, the gate measures it itself)."""

RunPending = Callable[[], Sequence[float] | None]
"""The config's own run, taken by another process of the job (`ParityCache` with claims): called
once the config's eager twin has run, it returns that run's losses (waiting for them while the
other process runs it), or None where nobody else runs it: the gate runs it itself. At 1B a
float8 config's twin took 137 s and its own run 34 s, one after the other on one GPU
(`llama-1b` on 4 H200s, 2026-11-28): on two GPUs they end together."""


@dataclasses.dataclass(frozen=True)
class ConfigRun:
    """A config's own run of its check, run apart from the rest (`run_config`): its losses, as
    `trainers.gate.gate` would run them, and the seconds it took (`GATE_CONFIG`)."""

    losses: list[float]
    time: dict[str, float]


class Gate(Protocol):
    """Runs the correctness gate for one config. `envelope` is the study's stored envelope (None
    the first time: the gate measures it, and `GateRun.envelope` is to be stored). `precision`:
    the config's, when not the study's (a study searching precisions): the reference and the
    envelope stay in the study's precision and the config is owed equivalence against them.
    `pending` (with `envelope` None): the envelope being measured elsewhere; a gate that can
    runs the config's twin first and waits for it then, and any gate may ignore it. `run`: the
    config's own run, likewise taken by another process (`RunPending`); given only to a gate
    whose `runs_apart` is True.

    `runs_apart`: whether `config_run(config, precision=...)` runs a config's own run alone (for
    another process's check of that config, which then judges it with its twin's).

    `envelope(precision=...)` measures alone (its reference included) the envelope a config in
    `precision` (None: the study's) is judged against, for a worker with no trial left while
    others run theirs (`tuner.search.helping`)."""

    def check(
        self,
        config: LoopConfig,
        envelope: Mapping[str, Any] | None,
        *,
        precision: str | None = None,
        pending: Pending | None = None,
        run: RunPending | None = None,
    ) -> GateRun: ...

    runs_apart: bool

    def config_run(self, config: LoopConfig, *, precision: str | None = None) -> ConfigRun: ...

    def envelope(self, *, precision: str | None = None) -> GateRun: ...

    def close(self) -> None: ...


class Parts:
    """Times each part of a check into `time` (seconds per `tuner.store.phases` name)."""

    def __init__(self) -> None:
        self.time: dict[str, float] = {}

    def run(self, part: str, fn: Callable[[], T]) -> T:
        started = time.perf_counter()
        try:
            return fn()
        finally:
            self.time[part] = self.time.get(part, 0.0) + time.perf_counter() - started


@dataclasses.dataclass(frozen=True)
class CheckPlan:
    """How one check runs: the reference's and the config's runs, the envelope's kind and the
    verdict's extra terms (a config in another precision: `run_parts`)."""

    args: trainers.RunArgs
    config_args: trainers.RunArgs
    spread: str
    judged: dict[str, Any]
    exact_steps: int | None

    def test_of(self, config: LoopConfig) -> GateTest:
        """The test `config` is owed in this check (`required_test` of its runs' precisions)."""
        precision, reference = self.config_args.precision, self.args.precision
        return required_test(config, precision=precision, reference_precision=reference)


def check_plan(
    args: trainers.RunArgs, config_precision: trainers.Precision | None, cross: CrossPrecision
) -> CheckPlan:
    config_args = args if config_precision is None else args.replace(precision=config_precision)
    spread = spread_for(config_args.precision, args.precision)
    judged: dict[str, Any] = {}
    exact_steps: int | None = None  # None: all the steps
    if spread == "seeds":
        exact_steps = args.steps if cross.steps is None else min(args.steps, cross.steps)
        if cross.steps is not None:
            args = args.replace(steps=cross.steps)
            config_args = config_args.replace(steps=cross.steps)
        judged.update(multiple=cross.multiple, exact_steps=exact_steps)
    return CheckPlan(args, config_args, spread, judged, exact_steps)


@dataclasses.dataclass(frozen=True)
class TwinRun:
    """A config's twin (eager or loop) run ahead of the rest of its check (None: its test needs
    none)."""

    twin: Twin | None
    time: dict[str, float]


def run_twin(
    workload: str | WorkloadFactory,
    preset: str,
    config: LoopConfig,
    args: trainers.RunArgs,
    *,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
    reference: Envelope | None = None,
    twin_kind: TwinKind = TWIN_KIND,
) -> TwinRun:
    """The twin part of `run_parts` alone: run while the envelope is measured elsewhere.
    `reference`: the study's envelope where known, whose strict reference a loop twin reuses."""
    plan = check_plan(args, config_precision, cross)
    parts = Parts()
    twin = _twin_if_needed(
        parts,
        workload,
        preset,
        config,
        (plan.config_args, plan.args),
        plan.exact_steps,
        reference,
        twin_kind,
    )
    return TwinRun(twin=twin, time=parts.time)


def run_config(
    workload: str | WorkloadFactory,
    preset: str,
    config: LoopConfig,
    args: trainers.RunArgs,
    *,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
    twin_kind: TwinKind = TWIN_KIND,
) -> ConfigRun:
    """The config's own run of `run_parts` alone (what its `gate` call would run, with the same
    arguments and `twin_kind`), for another process's check of the same config
    (`run_parts(losses=...)`)."""
    plan = check_plan(args, config_precision, cross)
    parts = Parts()
    mode = own_determinism(config, plan, twin_kind)
    losses = parts.run(
        GATE_CONFIG,
        lambda: parity_losses(workload, preset, config, plan.config_args, determinism=mode),
    )
    return ConfigRun(losses=list(losses), time=parts.time)


def own_determinism(config: LoopConfig, plan: CheckPlan, twin_kind: TwinKind) -> Determinism:
    """How the config's own run computes, as `gate` would run it (`config_determinism`), so
    that a verdict on a run made apart is the one a run there gives."""
    test = plan.test_of(config)
    return config_determinism(
        config, test, twin=twin_kind, reference=reference_determinism(plan.spread)
    )


def run_parts(
    workload: str | WorkloadFactory,
    preset: str,
    config: LoopConfig,
    args: trainers.RunArgs,
    *,
    envelope: Mapping[str, Any] | None,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
    pending: Pending | None = None,
    twin: TwinRun | None = None,
    run: RunPending | None = None,
    twin_kind: TwinKind = TWIN_KIND,
    determinism: Determinism | None = None,
) -> GateRun:
    """The built-in gate, part by part: the reference and its envelope (only when `envelope` is
    None: once per study), the twin where the test needs one (`twin_kind`: of a config with no
    graph), then the config's own run and `trainers.gate.gate`'s judgement. `args`: the study's
    runs (the reference's and envelope's precision). In another `config_precision` the run and
    an eager twin are in that one, judged against the reference's seed envelope over `cross`'s
    steps and multiple. `twin`: run before (`run_twin`); `pending` (with `envelope` None): the
    envelope measured elsewhere, asked after the twin; `run`: the run made apart (`determinism`)."""
    parts, plan = Parts(), check_plan(args, config_precision, cross)
    parts.time.update(twin.time if twin is not None else {})
    found = None if envelope is None else Envelope.from_dict(envelope)
    if found is None and pending is None:
        found = _measure_envelope(parts, workload, preset, plan.args, plan.spread)
    if twin is None:
        twin = run_twin(
            workload,
            preset,
            config,
            args,
            config_precision=config_precision,
            cross=cross,
            reference=found,
            twin_kind=twin_kind,
        )
        parts.time.update(twin.time)
    if found is None:
        given = pending() if pending is not None else None
        found = _measure_envelope(parts, workload, preset, plan.args, plan.spread, given=given)
    losses = run() if run is not None else None
    verdict = parts.run(
        GATE_CONFIG,
        lambda: gate(
            workload,
            config,
            plan.config_args,
            preset=preset,
            envelope=found,
            twin=twin.twin,
            twin_kind=twin_kind,
            reference_precision=args.precision,
            losses=losses,
            determinism=determinism,
            **plan.judged,
        ),
    )
    return GateRun(verdict=verdict, envelope=found.to_dict(), time=parts.time)


def measure_envelope(
    workload: str | WorkloadFactory,
    preset: str,
    args: trainers.RunArgs,
    *,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
) -> GateRun:
    """The envelope a config in `config_precision` (None: the study's) is judged against, alone:
    the reference and its envelope in the study's precision, as the first `run_parts` of such a
    config measures them (the rounding envelope, or for another precision the seed-to-seed one
    over `cross`'s steps): a `GateRun` with no verdict."""
    parts = Parts()
    plan = check_plan(args, config_precision, cross)
    found = _measure_envelope(parts, workload, preset, plan.args, plan.spread)
    return GateRun(verdict=None, envelope=found.to_dict(), time=parts.time)


def _twin_if_needed(
    parts: Parts,
    workload: str | WorkloadFactory,
    preset: str,
    config: LoopConfig,
    runs: tuple[trainers.RunArgs, trainers.RunArgs],
    exact_steps: int | None,
    envelope: Envelope | None,
    kind: TwinKind,
) -> Twin | None:
    """The config's twin, run once (timed as GATE_TWIN), where its test needs one: a loop twin
    where asked (`kind`) and the config has no graph, beside the envelope's reference where that
    ran strict (else it runs the reference strict itself). `runs`: the config's arguments and
    the reference's."""
    config_args, reference_args = runs
    test = required_test(
        config, precision=config_args.precision, reference_precision=reference_args.precision
    )
    if test != "exact+equivalence":
        return None
    # As long as `gate` will hold it to (`exact_length`: a graph's warm-up included). Once:
    # `gate` runs it again (in gate_config) only where the config does not replay it.
    length = exact_length(config, test, config_args.steps, exact_steps)
    twin_args = config_args.replace(steps=length)
    strict = envelope is not None and envelope.determinism == "strict"
    reference = envelope.reference if strict and envelope is not None else None
    return parts.run(
        GATE_TWIN,
        lambda: Twin.measure(
            workload,
            config,
            twin_args,
            preset=preset,
            runs=1,
            kind=kind,
            reference_precision=reference_args.precision,
            reference=reference,
        ),
    )


def _measure_envelope(
    parts: Parts,
    workload: str | WorkloadFactory,
    preset: str,
    args: trainers.RunArgs,
    spread: str,
    *,
    given: Mapping[str, Any] | None = None,
) -> Envelope:
    """The study's reference and its envelope of `spread` (both runs of `args`, in the study's
    precision), each part timed: strict for a rounding envelope, with the process's own kernels
    for a seed one (`reference_determinism`). `given`: measured by another process (nothing
    runs here)."""
    if given is not None:
        return Envelope.from_dict(given)
    mode = reference_determinism(spread)
    reference = parts.run(
        GATE_REFERENCE,
        lambda: parity_losses(workload, preset, trainers.REFERENCE, args, determinism=mode),
    )
    return parts.run(
        GATE_ENVELOPE,
        lambda: Envelope.measure(
            workload, preset, args, reference=reference, spread=spread, determinism=mode
        ),
    )


class InProcessGate:
    """The built-in gate in this process (on a CPU, where nothing it sets outlasts it)."""

    runs_apart = True

    def __init__(
        self,
        workload: str,
        preset: str,
        args: trainers.RunArgs,
        *,
        model_args: Mapping[str, str] | None = None,
        cross: CrossPrecision = AS_THE_GATE,
    ) -> None:
        """`args`: the gate's steps, seed, device and precision (every gate takes them so)."""
        # Each (preset, seed) built once: the gate's runs start from copies of it.
        self._factory = ReusedBuilds(trainers.resolve_factory(workload, dict(model_args or {})))
        self._preset = preset
        self._args = args
        self._cross = cross

    def check(
        self,
        config: LoopConfig,
        envelope: Mapping[str, Any] | None,
        *,
        precision: str | None = None,
        pending: Pending | None = None,
        run: RunPending | None = None,
    ) -> GateRun:
        return run_parts(
            self._factory,
            self._preset,
            config,
            self._args,
            envelope=envelope,
            config_precision=precision,  # type: ignore[arg-type]  # RunOptions checked it
            cross=self._cross,
            pending=pending,
            run=run,
        )

    def config_run(self, config: LoopConfig, *, precision: str | None = None) -> ConfigRun:
        return run_config(
            self._factory,
            self._preset,
            config,
            self._args,
            config_precision=precision,  # type: ignore[arg-type]  # RunOptions checked it
            cross=self._cross,
        )

    def envelope(self, *, precision: str | None = None) -> GateRun:
        return measure_envelope(
            self._factory,
            self._preset,
            self._args,
            config_precision=precision,  # type: ignore[arg-type]  # RunOptions checked it
            cross=self._cross,
        )

    def close(self) -> None:
        pass


def only_one_precision(precision: str | None, own: str | None, what: str) -> None:
    """A gate that judges one precision (a program's, the data-parallel one) refuses another;
    `RunOptions` refuses `precisions` for them first, so this is the last line, not the first."""
    if precision is not None and precision != own:
        raise trainers.ConfigError(
            "precisions", precision, f"{own or 'the study precision'} alone for {what}"
        )
