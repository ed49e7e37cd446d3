"""`RunArgs`: what one training run is beside its workload and its config.

One object for the arguments every run shares: how many steps it times, in how many windows,
after how many untimed ones; on which device; in which precision; from which seed. `run`,
`run_program` and `run_distributed` take it, the gate's runs too (`trainers.gate.trajectory`,
`Envelope.measure`, `Twin.measure`, `gate`), so these arguments travel as one typed value
instead of six keywords (and untyped dicts) at every step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from trainers.precision import Precision

__all__ = ["DEFAULT_ARGS", "RunArgs"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunArgs:
    """steps: timed steps, in `windows` windows, after `warmup` untimed ones (a gate run's
    trajectory is `steps` steps with its config's own warm-up inside, one window);
    device: "auto", "cpu", "cuda", "cuda:INDEX" or a torch.device;
    precision: the run's numeric precision (`trainers.precision`), a property of the experiment
    and never tuned; None keeps the process's float32 matmul precision and no autocast;
    seed: the weights' and the data's, for a run that builds its own workload (a program, a
    torchrun launch, a gate run); `run` takes a workload already built from its seed.

    The checks are the runs' own (`trainers.measure.check_counts`, `resolve_device`,
    `check_precision`), in the order a user meets them."""

    steps: int = 50
    warmup: int = 10
    windows: int = 5
    device: str | torch.device = "auto"
    precision: Precision | None = None
    seed: int = 0

    def replace(self, **changes: Any) -> RunArgs:
        return dataclasses.replace(self, **changes)


DEFAULT_ARGS = RunArgs()
"""The arguments of a run given none: 10 untimed steps, then 50 timed in 5 windows, on "auto",
in the process's own precision, from seed 0."""
