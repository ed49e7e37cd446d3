"""A complete user workload: `python -m tuner train --workload examples.my_workload:build`.

The factory takes the preset name and a seed and returns a `trainers.Workload`. The same preset
and seed must give the same weights and batches, so configs can be compared loss for loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainers import Workload
from trainers.workloads import SyntheticBatches, adam

SIZES = {"tiny": (16, 32), "small": (256, 1024)}  # preset -> (batch, features)


def regression_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


def build(preset: str, *, seed: int) -> Workload:
    if preset not in SIZES:
        raise ValueError(f"preset={preset!r} is invalid: allowed {', '.join(SIZES)}")
    batch, features = SIZES[preset]
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(features, features), nn.Tanh(), nn.Linear(features, 1))
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(8, batch, features, generator=generator)  # 8 batches, cycled
    y = x.sum(dim=-1, keepdim=True).sin()
    return Workload(
        name="my_workload",
        preset=preset,
        model=model,
        dataset=SyntheticBatches((x, y)),  # item i is batch i
        loss_fn=regression_loss,
        samples_per_batch=batch,
        make_optimizer=adam(1e-3),
    )
