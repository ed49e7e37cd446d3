"""Loss trajectories for the correctness gate: a config trained from a seed, dropout off, under
deterministic kernels, optionally from weights perturbed by rounding.

`trainers.gate.parity` compares these trajectories; this module only produces them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
from collections.abc import Iterator
from typing import Literal, get_args

import torch
from torch import nn

from trainers.blocks import has_blocks
from trainers.config import LoopConfig
from trainers.core import min_warmup
from trainers.loop import run
from trainers.measure import RunResult
from trainers.runargs import RunArgs
from trainers.workloads import WorkloadFactory, disable_dropout, resolve_factory
from trainers.workloads.base import Workload

PARITY_STEPS = 20
GATE_ARGS = RunArgs(steps=PARITY_STEPS)
"""A gate run's arguments given none: `PARITY_STEPS` steps from seed 0 on "auto", in the
process's own precision. A trajectory reads their steps, seed, device and precision: its warm-up
is its config's own (`min_warmup`, inside the steps) and it is one window."""
NO_DETERMINISTIC_IMPL = "does not have a deterministic implementation"

Determinism = Literal["strict", "off"]
DETERMINISMS: tuple[str, ...] = get_args(Determinism)
GATE_DETERMINISM: Determinism = "strict"
"""How a gate run computes unless it is told otherwise (the reference against a seed envelope and a
config owed no bits: `trainers.gate.parity.config_determinism`): "strict" under
`torch.use_deterministic_algorithms(True)` (cuDNN deterministic, no benchmark; warn-only for a
workload with an op that has no deterministic implementation), "off" under the process's own
settings. Strict makes more steps bit-reproducible (memory-efficient attention's backward,
scatter-adds) at a cost per step; where the eager step is still not reproducible, the exact tests
give way to the equivalence test (`trainers.gate.reproducibility`). `benchmarks/gate_power.py
--probe-determinism strict,off` measures both, and their cost in ms/step, per workload and
precision; the choice stays strict until a GPU run shows "off" reproducible where strict is not
cheaper (README, "Correctness")."""


@contextlib.contextmanager
def deterministic(*, strict: bool = True) -> Iterator[None]:
    """Deterministic kernels for the duration; the previous settings come back afterwards.

    strict: an op with no deterministic implementation raises instead of warning. Strict mode
    also switches some kernels to their deterministic variant (memory-efficient attention's
    backward, for one), which warn-only mode leaves non-deterministic.
    """
    # cuBLAS is only deterministic across streams with a fixed workspace configuration.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    torch.use_deterministic_algorithms(True, warn_only=not strict)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.deterministic = previous[2]
        torch.backends.cudnn.benchmark = previous[3]


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Perturbation:
    """Every floating-point parameter multiplied by (1 + s * eps), s a random sign per element
    drawn from `seed`: each weight moves by one or two units in its last place (ulps).

    eps None: the machine epsilon of each parameter's own dtype (2^-23 for float32). A larger eps
    (the unit of a lower compute precision, `trainers.gate.envelope.rounding_eps`) moves the weights
    by one ulp of the precision the kernels compute in. A weight that is exactly zero (a bias
    initialised to zero) stays zero: there is no last bit to move.
    """

    seed: int
    eps: float | None = None

    def apply(self, model: nn.Module) -> None:
        generator = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            for param in model.parameters():
                if not param.is_floating_point():
                    continue
                eps = self.eps if self.eps is not None else torch.finfo(param.dtype).eps
                # Signs drawn on the CPU, so the perturbation is the same on every device.
                signs = torch.randint(0, 2, param.shape, generator=generator) * 2 - 1
                param.mul_(1 + signs.to(param.device, param.dtype) * eps)


@dataclasses.dataclass(kw_only=True, frozen=True)
class Trajectory:
    """The losses of one gate run, whether strict determinism held, and the trained workload
    (its model holds the weights and buffers after the last step)."""

    losses: list[float]
    strict: bool
    workload: Workload


def trajectory(
    workload: str | WorkloadFactory,
    preset: str,
    config: LoopConfig,
    args: RunArgs = GATE_ARGS,
    *,
    capturable: bool | None = None,
    perturbation: Perturbation | None = None,
    determinism: Determinism | None = None,
) -> Trajectory:
    """Train `config` for `args.steps` steps from `args.seed` on `args.device` in
    `args.precision`, with dropout off and deterministic kernels (`GATE_ARGS` says which of the
    run's arguments a trajectory reads).

    A graph config's first steps are its eager warm-up and the capture (a compiled config's, its
    compilation); they are in the losses too, so every trajectory has `steps` losses.
    `capturable` None builds the optimizer the way the config needs (capturable exactly when it
    is a graph). A workload with an op that has no deterministic
    implementation runs in warn-only mode instead (`strict` False); its kernels may then differ
    from run to run. `determinism` None: `GATE_DETERMINISM`; "off" runs under the process's own
    settings (`strict` False).
    """
    mode = GATE_DETERMINISM if determinism is None else determinism
    if mode not in DETERMINISMS:
        raise ValueError(f"determinism={mode!r} is invalid: allowed {', '.join(DETERMINISMS)}")
    factory = resolve_factory(workload) if isinstance(workload, str) else workload
    warmup = min_warmup(config)
    steps = args.steps
    for strict in (True, False) if mode == "strict" else (None,):
        built = factory(preset, seed=args.seed)
        disable_dropout(built.model)
        if perturbation is not None:
            perturbation.apply(built.model)
        try:
            with contextlib.nullcontext() if strict is None else deterministic(strict=strict):
                # Every step's loss in one window: the warm-up's (compilation, capture) too.
                timed = trajectory_length(config, steps) - warmup
                run_args = args.replace(steps=timed, warmup=warmup, windows=1)
                result = _run_fitting(built, config, run_args, capturable=capturable)
        except RuntimeError as exc:
            if strict and NO_DETERMINISTIC_IMPL in str(exc):
                continue
            raise
        return Trajectory(losses=result.losses, strict=bool(strict), workload=built)
    raise AssertionError("unreachable: the warn-only pass returns or raises")


def trajectory_length(config: LoopConfig, steps: int) -> int:
    """How many losses a trajectory of `config` for `steps` steps gives: `steps`, unless the
    config's warm-up (compilation, a graph's capture) is longer."""
    warmup = min_warmup(config)
    return warmup + max(1, steps - warmup)


def _run_fitting(
    built: Workload,
    config: LoopConfig,
    args: RunArgs,
    *,
    capturable: bool | None,
) -> RunResult:
    """`run()` of a gate trajectory. A plain eager config whose step does not fit in memory (the
    reference of a large model: the plain step is what users cannot run) runs again in the
    memory that `_fitting` finds: first with every block checkpointed, then split into 2, 4
    or 8 micro-batches."""
    plain = (
        config.compile == "none"
        and config.activation_checkpointing == "none"
        and config.micro_batches == 1
    )
    shape = (
        built.name,
        built.preset,
        built.samples_per_batch,
        str(args.precision),
        str(args.device),
    )
    error: torch.cuda.OutOfMemoryError | None = None
    if plain and shape in _PLAIN_DOES_NOT_FIT:
        # Known in this process: each attempt fills the device before it fails (and a gate
        # check runs the reference up to seven times: reference, envelope, probe).
        error = torch.cuda.OutOfMemoryError(f"the plain step of {shape[:2]} did not fit before")
    else:
        try:
            return run(built, config, args, capturable=capturable)
        except torch.cuda.OutOfMemoryError as exc:
            if not plain:
                raise
            _PLAIN_DOES_NOT_FIT.add(shape)
            # Kept without its traceback: the traceback's frames hold the failed run's tensors.
            error = exc.with_traceback(None)
    for fitting in _fitting(built, config):
        # Outside the except block: the failed run's tensors (its traceback) are released first.
        for param in built.model.parameters():
            param.grad = None
        gc.collect()  # the failed run's reference cycles (autograd nodes, frames)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        try:
            return run(built, fitting, args, capturable=capturable)
        except torch.cuda.OutOfMemoryError as exc:
            error = exc.with_traceback(None)
    raise error


_PLAIN_DOES_NOT_FIT: set[tuple[str, str, int, str, str]] = set()
"""(workload, preset, samples per batch, precision, device) whose plain step ran out of memory
in this process: later trajectories of it start from the stand-ins (`_run_fitting`)."""


def _fitting(built: Workload, config: LoopConfig) -> Iterator[LoopConfig]:
    """The plain step's stand-ins, least changed first: every block checkpointed (the same
    kernels on the same inputs, in the memory of one block's activations: bit for bit on a CPU,
    a few ulps off on a GPU whose backward picks other kernels), then 2, 4 or 8 micro-batches
    (the gradient summed in another order). Both are why every config with checkpointing or
    micro-batches is judged by the equivalence test (`NUMERICS_FIELDS`), never exactly."""
    if has_blocks(built):
        yield config.replace(activation_checkpointing="blocks")
    for pieces in (2, 4, 8):
        if built.samples_per_batch % pieces == 0:
            yield config.replace(micro_batches=pieces)


def parity_losses(
    workload: str | WorkloadFactory,
    preset: str,
    config: LoopConfig,
    args: RunArgs = GATE_ARGS,
    *,
    capturable: bool | None = None,
    perturbation: Perturbation | None = None,
    determinism: Determinism | None = None,
) -> list[float]:
    """The loss trajectory of `config` from `seed`, dropout off, deterministic kernels (see
    `trajectory`)."""
    return trajectory(
        workload,
        preset,
        config,
        args,
        capturable=capturable,
        perturbation=perturbation,
        determinism=determinism,
    ).losses
