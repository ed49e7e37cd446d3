"""`check_parity`: does a config train the same model as the reference loop?

Both runs start from the same seed with dropout off and deterministic algorithms on. An eager
config only reorders when work is queued and when the host waits; it must give the reference's
losses bit for bit. A CUDA graph replays the same kernels but its optimizer is built with
`capturable=True` (step counter on the device, a different order of operations), so its losses
may drift by rounding: they must stay within `GRAPH_RTOL` of the reference.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from trainers.config import REFERENCE, LoopConfig
from trainers.loop import run
from trainers.workloads import WorkloadFactory, disable_dropout, resolve_factory

GRAPH_RTOL = 1e-3
"""Largest relative loss deviation accepted for a CUDA-graph config (see module docstring)."""

PARITY_STEPS = 20
NO_DETERMINISTIC_IMPL = "does not have a deterministic implementation"


@dataclasses.dataclass(kw_only=True, frozen=True)
class ParityVerdict:
    passed: bool
    exact_required: bool
    tolerance: float
    steps: int
    max_abs_deviation: float
    max_rel_deviation: float
    first_diverging_step: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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


def parity_losses(
    workload: str | WorkloadFactory,
    preset: str,
    config: LoopConfig,
    *,
    steps: int = PARITY_STEPS,
    seed: int = 0,
    device: str | torch.device = "auto",
) -> list[float]:
    """The loss trajectory of `config` from `seed`, dropout off, deterministic kernels.

    A workload with an op that has no deterministic implementation runs in warn-only mode
    instead; if its kernels then differ from run to run, the comparison fails at the first step
    that differs.
    """
    factory = resolve_factory(workload) if isinstance(workload, str) else workload
    warmup = 4 if config.cuda_graph else 0
    for strict in (True, False):
        built = factory(preset, seed=seed)
        disable_dropout(built.model)
        try:
            with deterministic(strict=strict):
                result = run(built, config, steps=max(1, steps - warmup), warmup=warmup,
                             windows=1, device=device)
        except RuntimeError as exc:
            if strict and NO_DETERMINISTIC_IMPL in str(exc):
                continue
            raise
        return result.losses
    raise AssertionError("unreachable: the warn-only pass returns or raises")


def compare(losses: Sequence[float], reference: Sequence[float], *, exact: bool,
            tolerance: float) -> ParityVerdict:
    """Compare two loss trajectories step by step."""
    if len(losses) != len(reference):
        return ParityVerdict(
            passed=False, exact_required=exact, tolerance=tolerance, steps=len(reference),
            max_abs_deviation=math.inf, max_rel_deviation=math.inf, first_diverging_step=None,
            reason=f"{len(losses)} losses against {len(reference)} in the reference",
        )
    max_abs = max_rel = 0.0
    first: int | None = None
    for step, (a, b) in enumerate(zip(losses, reference, strict=True)):
        if not (math.isfinite(a) and math.isfinite(b)):
            deviation = math.inf
            relative = math.inf
        else:
            deviation = abs(a - b)
            relative = deviation / max(abs(b), 1e-12)
        if first is None and deviation != 0.0:
            first = step
        max_abs, max_rel = max(max_abs, deviation), max(max_rel, relative)
    passed = max_abs == 0.0 if exact else max_rel <= tolerance
    if passed:
        reason = "identical losses" if max_abs == 0.0 else f"within {tolerance:g} relative"
    elif exact:
        reason = f"eager config must match bit for bit; first differs at step {first}"
    else:
        reason = f"relative deviation {max_rel:.3g} exceeds {tolerance:g}"
    return ParityVerdict(
        passed=passed, exact_required=exact, tolerance=0.0 if exact else tolerance,
        steps=len(reference), max_abs_deviation=max_abs, max_rel_deviation=max_rel,
        first_diverging_step=first, reason=reason,
    )


def check_parity(
    workload: str | WorkloadFactory,
    config: LoopConfig,
    steps: int = PARITY_STEPS,
    *,
    preset: str,
    seed: int = 0,
    device: str | torch.device = "auto",
    reference: Sequence[float] | None = None,
) -> ParityVerdict:
    """Run `config` and the reference (1 stream, synchronize every step, no graph) from the same
    seed and compare their losses. Pass `reference` to reuse a reference trajectory."""
    if reference is None:
        reference = parity_losses(workload, preset, REFERENCE, steps=steps, seed=seed,
                                  device=device)
    losses = parity_losses(workload, preset, config, steps=steps, seed=seed, device=device)
    return compare(losses, reference, exact=not config.cuda_graph, tolerance=GRAPH_RTOL)
