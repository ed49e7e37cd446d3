"""Workloads made for tests: tiny, and some deliberately broken."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

from trainers import Workload
from trainers.workloads import SyntheticBatches, adam
from trainers.workloads.mlp import classification_loss


class WorkerDependentBatches(Dataset[tuple[torch.Tensor, ...]]):
    """A classic data-pipeline bug: randomness seeded by the worker id, so the data (and the
    losses) change with `num_workers`. check_parity must catch it."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        info = get_worker_info()
        worker = 0 if info is None else info.id + 1
        generator = torch.Generator().manual_seed(1000 * worker + index)
        x = torch.randn(4, 8, generator=generator)
        return x, torch.randint(0, 3, (4,), generator=generator)


def worker_dependent(preset: str, *, seed: int) -> Workload:
    torch.manual_seed(seed)
    return Workload(
        name="worker_dependent",
        preset=preset,
        model=nn.Linear(8, 3),
        dataset=WorkerDependentBatches(),
        loss_fn=classification_loss,
        samples_per_batch=4,
        make_optimizer=adam(1e-2),
    )


class Samples(Dataset[tuple[torch.Tensor, ...]]):
    """Per-sample dataset (the DataLoader batches it), to cover `batch_size` workloads."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(5)
        self.x = torch.randn(40, 6, generator=generator)
        self.y = torch.randint(0, 2, (40,), generator=generator)

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return self.x[index], self.y[index]


def per_sample(preset: str, *, seed: int) -> Workload:
    torch.manual_seed(seed)
    return Workload(
        name="per_sample",
        preset=preset,
        model=nn.Linear(6, 2),
        dataset=Samples(),
        loss_fn=classification_loss,
        samples_per_batch=8,
        batch_size=8,
    )


def not_a_workload(preset: str, *, seed: int) -> object:
    return {"model": None}


def syncs_in_loss(preset: str, *, seed: int) -> Workload:
    """A loss that reads a value back to the host: runs eagerly, cannot be graph-captured."""
    torch.manual_seed(seed)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        loss = classification_loss(model, batch)
        if loss.item() > 1e9:  # a host sync
            raise RuntimeError("diverged")
        return loss

    x = torch.randn(4, 4, 8, generator=torch.Generator().manual_seed(seed))
    y = torch.randint(0, 3, (4, 4), generator=torch.Generator().manual_seed(seed))
    return Workload(
        name="syncs_in_loss",
        preset=preset,
        model=nn.Linear(8, 3),
        dataset=SyntheticBatches((x, y)),
        loss_fn=loss_fn,
        samples_per_batch=4,
    )
