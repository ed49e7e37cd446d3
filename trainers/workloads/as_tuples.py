"""A user's batches of another shape, fed to the loop as the tuple of tensors it moves.

The loop moves each tensor of a tuple to the device, splits it into micro-batches, copies it into
a CUDA graph's inputs; a dict (the Hugging Face habit: `{"input_ids": ..., "labels": ...}`) or a
bare tensor is none of that. Rather than refuse them, the workload is adapted once, when built
(`trainers.workloads.checks.own_workload`): its dataset or collate_fn gives the dict's values in
its keys' order (or the tensor alone, in a tuple of one), and its `loss_fn` is handed the dict (or
the tensor) back, on the device. The loop sees tuples; the user's code sees what it wrote.

Module-level classes, not closures: a DataLoader worker that is spawned, not forked, pickles them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, IterableDataset, default_collate

from trainers.workloads.base import Batch, LossFn, Workload


class _ItemsAsTuples(Dataset[Batch]):
    """A dataset whose items are whole batches (`batch_size` None), each a dict (`keys` given: its
    values in that order) or a tensor (`keys` None: a tuple of one)."""

    def __init__(self, dataset: Dataset[Any], keys: Sequence[str] | None) -> None:
        self.dataset, self.keys = dataset, keys

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Batch:
        return as_tuple(self.dataset[index], self.keys)


class _StreamAsTuples(IterableDataset[Batch]):
    """An IterableDataset whose items are whole batches, each made a tuple as above."""

    def __init__(self, dataset: IterableDataset[Any], keys: Sequence[str] | None) -> None:
        self.dataset, self.keys = dataset, keys

    def __iter__(self) -> Iterator[Batch]:
        return (as_tuple(item, self.keys) for item in self.dataset)


class _CollatedAsTuples:
    """A collate_fn (the user's, or the default) whose batch is made a tuple as above."""

    def __init__(self, collate: Callable[[list[Any]], Any], keys: Sequence[str] | None) -> None:
        self.collate, self.keys = collate, keys

    def __call__(self, samples: list[Any]) -> Batch:
        return as_tuple(self.collate(samples), self.keys)


class _LossOfNamed:
    """The user's `loss_fn`, handed its namedtuple batch back: the loop moves, splits and
    captures a tuple's tensors as a plain tuple, and `batch.x` had failed every step (a user's
    probe, 2026-12-06)."""

    def __init__(self, loss_fn: LossFn, named: type) -> None:
        self.original, self.named = loss_fn, named

    def __call__(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return self.original(model, self.named(*batch))


class _LossOfOriginal:
    """The user's `loss_fn`, handed the batch as it was made: the dict of `keys`, or the tensor."""

    def __init__(self, loss_fn: LossFn, keys: Sequence[str] | None) -> None:
        self.original, self.keys = loss_fn, keys

    def __call__(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return self.original(model, as_original(batch, self.keys))


def as_tuple(batch: Any, keys: Sequence[str] | None) -> Batch:
    if keys is None:
        return (batch,)
    return tuple(batch[key] for key in keys)


def as_original(batch: Batch, keys: Sequence[str] | None) -> Any:
    return batch[0] if keys is None else dict(zip(keys, batch, strict=True))


def original_loss(loss_fn: LossFn) -> LossFn:
    """The user's own loss where `loss_fn` is one adapted here (it takes batches as they were
    made: an evaluation's, say); else `loss_fn`."""
    return loss_fn.original if isinstance(loss_fn, _LossOfOriginal | _LossOfNamed) else loss_fn


def adapted(workload: Workload, first: Any) -> tuple[Workload, Any]:
    """`workload` fed as tuples where its first batch `first` is a dict of tensors or one tensor,
    and that batch as the adapted workload makes it; a namedtuple's loss handed it back; else
    both as they were."""
    if isinstance(first, tuple) and hasattr(type(first), "_fields"):
        # Already a tuple to the loop: only the loss needs its fields back.
        named = _LossOfNamed(workload.loss_fn, type(first))
        return dataclasses.replace(workload, loss_fn=named), tuple(first)
    if isinstance(first, Mapping) and first and all(isinstance(k, str) for k in first):
        keys: Sequence[str] | None = list(first)
    elif isinstance(first, torch.Tensor):
        keys = None
    else:
        return workload, first
    changes: dict[str, Any] = {"loss_fn": _LossOfOriginal(workload.loss_fn, keys)}
    if workload.batch_size is None and isinstance(workload.dataset, IterableDataset):
        changes["dataset"] = _StreamAsTuples(workload.dataset, keys)
    elif workload.batch_size is None:
        changes["dataset"] = _ItemsAsTuples(workload.dataset, keys)
    else:
        changes["collate_fn"] = _CollatedAsTuples(workload.collate_fn or default_collate, keys)
    return dataclasses.replace(workload, **changes), as_tuple(first, keys)
