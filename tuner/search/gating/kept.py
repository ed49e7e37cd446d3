"""Which gate runs are made in the process that ran the trials, where Dynamo still holds what a
trial compiled (`trainers.keeping_compiled`), rather than in the gate's child, which compiles the
model again: a new process reads the trial's FX graphs back from the disk cache but still traces
the model and builds its backward (a float8 config at 0.5B on an H200: 132 s cold, 67 s on that
cache, 2026-12-01, docs/benchmarks/compile-reuse-*). Only runs under the process's own settings
("off") qualify: a strict run's deterministic mode and cuBLAS workspace would outlast it here and
slow every later measurement. And only a config that compiles and keeps its code
(`trainers.keeps_code`): another has nothing to reuse.

- `runs_where_trained`: a config's own run owed no bits (against a seed envelope, through a loop
  twin) runs here (`tuner.search.gating.gate.run_config`).
- `runs_kept`: a config owed its eager twin's bits (a whole-step CUDA graph over a compiled
  step) runs here with its twin, both with the process's own kernels (`run_kept`). Under strict
  determinism Inductor keys its kernels apart, so the child's twin compiles the whole model cold
  (123 s of a 786 s default job for a Qwen2-style 0.5B decoder in float8 on an H200,
  docs/benchmarks/time-to-answer-h200-2026-12-04-qwen2-*); here neither compiles. Bits of the
  same kernels are as comparable as strict ones: a config that replays its twin bit for bit has
  shown the arithmetic reproducible (`trainers.gate.exact`), and a fault that leaves its losses
  its twin's to the bit is one that no exact test sees, strict or not. Where they differ, the
  twin runs a second time: the process's own kernels may not reproduce (on an H100 no compiled
  decoder or transformer step measured did, with either SDPA backend, from step 1 to 4:
  docs/benchmarks/kept-bits-h100-*), and then the config is held within a multiple of the twin's
  own run-to-run difference (`trainers.gate.within_twin_noise`) rather than its bits. Taken
  only where it agrees or stays within that: otherwise nothing is concluded and the child
  checks the config as before, strict, which alone may fail it.
"""

from __future__ import annotations

import dataclasses

import trainers
from trainers import LoopConfig
from trainers.gate import (
    TWIN_NOISE_MULTIPLE,
    Twin,
    TwinKind,
    exact_length,
    first_difference,
    parity_losses,
    reference_determinism,
    within_twin_noise,
)
from trainers.gate import twin_kind as kind_of_twin
from trainers.workloads import WorkloadFactory
from tuner.search.gating.gate import (
    AS_THE_GATE,
    TWIN_KIND,
    CheckPlan,
    CrossPrecision,
    Parts,
    TwinRun,
    check_plan,
    own_determinism,
)
from tuner.store.phases import GATE_CONFIG, GATE_TWIN


def runs_where_trained(
    config: LoopConfig,
    args: trainers.RunArgs,
    *,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
    twin_kind: TwinKind = TWIN_KIND,
) -> bool:
    """Whether `config`'s own gate run (`run_config`) may run here: owed no bits, it computes
    under the process's own settings ("off"), and it compiles and keeps its code."""
    plan = check_plan(args, config_precision, cross)
    return own_determinism(config, plan, twin_kind) == "off" and _reusable(config)


def runs_kept(
    config: LoopConfig,
    args: trainers.RunArgs,
    *,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
    twin_kind: TwinKind = TWIN_KIND,
) -> bool:
    """Whether `config` is owed its eager twin's bits (`twin_kind` asked) and may run here with
    that twin (`run_kept`): where the check judges it against a seed envelope, whose reference
    ran with the process's own kernels too (a rounding envelope is strict, and a run with other
    kernels would be judged against the rounding of strict ones), and it compiles and keeps its
    code (its twin then shares it: `trainers.keeps_code`)."""
    plan = check_plan(args, config_precision, cross)
    owed = _owes_eager_twin(config, plan, twin_kind)
    why = why_not_kept(
        config, args, config_precision=config_precision, cross=cross, twin_kind=twin_kind
    )
    return owed and why is None


def why_not_kept(
    config: LoopConfig,
    args: trainers.RunArgs,
    *,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
    twin_kind: TwinKind = TWIN_KIND,
) -> str | None:
    """Why `config`, owed its eager twin's bits, cannot run here with it (`runs_kept`'s false
    terms, in words); None where it can, or is owed no eager twin."""
    plan = check_plan(args, config_precision, cross)
    if not _owes_eager_twin(config, plan, twin_kind):
        return None
    if reference_determinism(plan.spread) != "off":
        return "its reference is strict (a rounding envelope: the config is in its precision)"
    if not _reusable(config):
        return "its compiled code is not kept between runs (trainers.keeps_code)"
    return None


@dataclasses.dataclass(frozen=True)
class KeptRun:
    """`run_kept`'s runs: the config's eager twin (`twin`, None where the config neither
    replayed it bit for bit nor stayed within its noise: the child is to check it, `apart` says
    why) and the config's own losses, both "off"."""

    twin: TwinRun | None
    losses: list[float]
    time: dict[str, float]
    apart: str | None = None


def run_kept(
    workload: str | WorkloadFactory,
    preset: str,
    config: LoopConfig,
    args: trainers.RunArgs,
    *,
    config_precision: trainers.Precision | None = None,
    cross: CrossPrecision = AS_THE_GATE,
) -> KeptRun:
    """`config`'s eager twin, once (`gate`'s exact steps), then its own run (the gate's), both
    under the process's own settings: the twin where the config replays it bit for bit, or,
    where the twin's second run shows these kernels do not reproduce, where the config stays
    within that noise (the verdict's `determinism` is then "off"), else None. The twin first:
    it builds its optimizer capturable and the config, a graph, captures after it, as in the
    child."""
    plan = check_plan(args, config_precision, cross)
    test = plan.test_of(config)
    length = exact_length(config, test, plan.config_args.steps, plan.exact_steps)
    parts = Parts()
    twin = parts.run(
        GATE_TWIN,
        lambda: Twin.measure(
            workload,
            config,
            plan.config_args.replace(steps=length),
            preset=preset,
            runs=1,
            kind="eager",
            determinism="off",
        ),
    )
    losses = parts.run(
        GATE_CONFIG,
        lambda: parity_losses(workload, preset, config, plan.config_args, determinism="off"),
    )
    differs = first_difference(losses[: len(twin.losses)], twin.losses)
    apart = None
    if differs is not None:
        # Only a twin that differs from itself leaves a noise to be within.
        once = twin
        twin = parts.run(
            GATE_TWIN, lambda: once.confirmed(workload, plan.config_args, preset=preset)
        )
        apart = _apart(twin, differs, *within_twin_noise(losses, twin))
    return KeptRun(
        twin=TwinRun(twin=twin, time={}) if apart is None else None,
        losses=list(losses),
        time=parts.time,
        apart=apart,
    )


def _apart(
    twin: Twin, differs: int, within: bool, largest: float, noise: float | None
) -> str | None:
    """Why the kept runs leave the check to the child, or None where the config stayed within
    its twin's noise."""
    if within:
        return None
    if twin.reproducible:
        return f"its kept run left its twin at step {differs}, and the twin reproduced itself"
    return (
        f"its kept run left its twin by {largest:.2g}, more than "
        f"{TWIN_NOISE_MULTIPLE:g}x the twin's own run-to-run difference ({noise or 0.0:.2g})"
    )


def _owes_eager_twin(config: LoopConfig, plan: CheckPlan, twin_kind: TwinKind) -> bool:
    test = plan.test_of(config)
    return test == "exact+equivalence" and kind_of_twin(config, twin_kind) == "eager"


def _reusable(config: LoopConfig) -> bool:
    return trainers.compiles(config) and trainers.keeps_code(config)
