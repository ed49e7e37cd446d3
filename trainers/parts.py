"""A `Workload` from a user's own parts (`trainers.workload_from_parts`): the model, the data,
the loss and the optimizer, each checked once here, where a mistake is said in one line naming
the argument, rather than at every step of every trial."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from trainers.errors import ConfigError
from trainers.fit_checks import OPTIMIZER_ALLOWED, check_parts, from_loader, shown_value
from trainers.optim import with_capturable
from trainers.workloads.base import Batch, LossFn, OptimizerFactory, Workload
from trainers.workloads.checks import own_workload

__all__ = ["workload_from_parts"]


def workload_from_parts(
    model: nn.Module,
    data: Dataset[Any] | torch.utils.data.DataLoader[Any],
    loss_fn: LossFn,
    *,
    optimizer: OptimizerFactory | torch.optim.Optimizer,
    batch_size: int | None = None,
    collate_fn: Callable[[list[Any]], Batch] | None = None,
    name: str = "custom",
    samples_per_batch: int | None = None,
) -> Workload:
    """A `Workload` from a user's own model, data, loss and optimizer, for `Trainer`.

    data: a Dataset of samples (with batch_size), of whole batches (batch_size None: the samples
    a step counts are a leading size every tensor of a batch has, `whole.samples_in`), an
    IterableDataset (read from a new iterator each pass), or a DataLoader over any of them,
    whose dataset, batch size and collate_fn are used: the loop builds its own
    loader in dataset order, since workers and pinning are settings it was tuned with. Every
    step takes a whole batch: the last batch of a pass through a dataset of samples, where it
    would be short, is dropped (as `drop_last=True`). `samples_per_batch`: the samples a whole
    batch holds, where that count is not the one its tensors share (a mask of sequence x
    sequence beside batch x sequence ids); samples/s are counted from it.
    optimizer: a factory `(params, capturable) -> Optimizer`, or an optimizer already built on
    `model`'s parameters (rebuilt capturable when a CUDA graph needs it).

    The build checks `loss_fn` by calling it once on the first batch as meta tensors, with a copy
    of `model` whose weights are meta tensors (no values, no memory, `trainers.meta`): a loss
    that records what it returns, or counts its calls, sees that call (a tensor on the `meta`
    device, one call more than the steps).
    """
    if isinstance(data, torch.utils.data.DataLoader):
        data, batch_size, collate_fn = from_loader(data, batch_size, collate_fn)
    check_parts(data, loss_fn, batch_size, samples_per_batch)
    make_optimizer: OptimizerFactory
    if isinstance(optimizer, torch.optim.Optimizer):
        make_optimizer = functools.partial(_as_built, optimizer)
    elif callable(optimizer):
        make_optimizer = optimizer
    else:
        raise ConfigError("optimizer", shown_value(optimizer), OPTIMIZER_ALLOWED)
    workload = Workload(
        name=name,
        preset="custom",
        model=model,
        dataset=data,
        loss_fn=loss_fn,
        samples_per_batch=samples_per_batch or batch_size or 1,
        make_optimizer=make_optimizer,
        batch_size=batch_size,
        collate_fn=collate_fn,
    )
    return own_workload(workload, name, parts=True, counted=samples_per_batch is not None)


def _as_built(
    built: torch.optim.Optimizer, params: Iterable[nn.Parameter], capturable: bool
) -> torch.optim.Optimizer:
    """A user's optimizer, already built on the model's parameters (`params` are the same)."""
    return with_capturable(built, capturable)
