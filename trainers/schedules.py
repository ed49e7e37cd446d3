"""`warmup_cosine`: the learning-rate schedule most runs use, as a `Trainer(scheduler=...)`
factory, its arguments checked when it is made."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR

from trainers.errors import ConfigError


def check_schedule(total_steps: object, warmup_steps: object, start_factor: object) -> None:
    """`trainers.warmup_cosine`'s arguments: a ConfigError naming the first one out of range."""
    if not isinstance(total_steps, int) or isinstance(total_steps, bool) or total_steps < 1:
        raise ConfigError("total_steps", total_steps, "an integer >= 1")
    if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool):
        raise ConfigError("warmup_steps", warmup_steps, "an integer")
    if not 0 <= warmup_steps < total_steps:
        raise ConfigError("warmup_steps", warmup_steps, f"0 to {total_steps - 1} (< total_steps)")
    if not isinstance(start_factor, int | float) or not 0 < start_factor <= 1:
        raise ConfigError("start_factor", start_factor, "a number in (0, 1]")


def warmup_cosine(
    total_steps: int, warmup_steps: int, *, start_factor: float = 0.01
) -> Callable[[torch.optim.Optimizer], Any]:
    """A linear warm-up from `start_factor` x the rate over `warmup_steps`, then cosine decay
    to 0 at `total_steps`, held there after (a run resumed past its plan): the schedule most
    runs use, as a `scheduler=` factory. The cosine alone is periodic: past its end the rate
    climbed back to the full rate, and a warm-up as long as the run flipped it between 0 and
    the full rate every step (a user's probe, 2026-12-05), so those are refused here."""
    check_schedule(total_steps, warmup_steps, start_factor)

    def make(optimizer: torch.optim.Optimizer) -> SequentialLR:
        return SequentialLR(
            optimizer,
            [
                LinearLR(optimizer, start_factor=start_factor, total_iters=warmup_steps),
                CosineAnnealingLR(optimizer, T_max=total_steps - warmup_steps),
                LambdaLR(optimizer, lambda _: 0.0),  # the cosine's end, held
            ],
            milestones=[warmup_steps, total_steps],
        )

    return make
