"""Checks of a user's own workload, made once it is built (`package.module:factory`, and
`trainers.workload_from_parts` for a `Trainer`): what would otherwise fail at every step, so in
every trial and both baselines of a job, with a message about tensors that names neither the
cause nor the contract.

- A batch is a tuple (or list) of tensors: the loop moves each to the device and hands the tuple
  to `loss_fn(model, batch)`. A dataset or collate_fn that gives a dict (the Hugging Face habit)
  was iterated for its keys ("'str' object has no attribute 'to'"), and one that gives a bare
  tensor was split into its rows.
- `loss_fn` returns the loss alone, a tensor of one element: `return loss, logits` failed as
  "'tuple' object has no attribute 'detach'", and a loss of shape [1] trained but failed every
  gate run ("must be real number, not list"). Run once on a copy of the model whose weights are
  meta tensors (`trainers.meta`), on the first batch: no FLOP, no memory. A loss
  that reads values (`.item()`) cannot run there and is left to the run.

Found by a new user's trial (2026-12-02): each of these reached the user only as every trial's
failure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sized
from typing import Any

import torch
from torch.utils.data import IterableDataset, default_collate

from trainers.errors import WorkloadError
from trainers.meta import meta_copy
from trainers.workloads.base import Workload


def check_own_workload(workload: Workload, name: str, *, parts: bool = False) -> None:
    """WorkloadError naming what the built `workload` gets wrong: in `workload` (`name`, as the
    user named it: `mymodels:build`), or with `parts` (`trainers.workload_from_parts`) in the
    argument given, `data` or `loss_fn`."""
    data = _Where("data" if parts else "workload", "data" if parts else f"workload={name!r}")
    loss = _Where("loss_fn" if parts else "workload", "loss_fn" if parts else f"workload={name!r}")
    batch = _first_batch(workload, data)
    if batch is not None:
        _check_batch(batch, data)
        _check_loss(workload, tuple(batch), loss)


@dataclasses.dataclass(frozen=True)
class _Where:
    """What an error names: its field, and the words that begin its message."""

    field: str
    said: str

    def error(self, message: str) -> WorkloadError:
        return WorkloadError(f"{self.said}: {message}", field=self.field)


def _first_batch(workload: Workload, where: _Where) -> Any:
    """The first batch as the loader would make it, before the loop turns it into a tuple;
    None where the dataset cannot be indexed (an IterableDataset: its first item is the run's)."""
    dataset = workload.dataset
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        return None
    size = len(dataset) if isinstance(dataset, Sized) else None
    wanted = 1 if workload.batch_size is None else workload.batch_size
    if size is not None and size < wanted:
        raise where.error(
            f"the dataset has {size} items, fewer than one batch ("
            + (
                f"batch_size {wanted}; the loop drops a last, partial batch"
                if workload.batch_size is not None
                else "each item is a batch"
            )
            + "): give it more items, or a smaller batch_size",
        )
    try:
        if workload.batch_size is None:
            return dataset[0]
        samples = [dataset[i] for i in range(wanted)]
        return (workload.collate_fn or default_collate)(samples)
    except Exception as exc:  # the user's code: said in one line, as each step would fail
        said = " ".join(str(exc).split()) or "(no message)"
        raise where.error(f"making its first batch raised {type(exc).__name__}: {said}") from exc


def _check_batch(batch: Any, where: _Where) -> None:
    fix = (
        "return a tuple of tensors from the dataset's __getitem__ (or from collate_fn), e.g. "
        "(input_ids, labels), and take it apart in loss_fn(model, batch)"
    )
    if isinstance(batch, Mapping):
        keys = ", ".join(map(str, list(batch)[:6]))
        raise where.error(
            f"a batch is a dict (keys {keys}); the loop feeds a tuple of tensors: {fix}",
        )
    if isinstance(batch, torch.Tensor):
        raise where.error(
            f"a batch is one tensor (shape {list(batch.shape)}); the loop "
            "feeds a tuple of tensors, and would split this one into its rows: return (x,) "
            "from __getitem__ (or from collate_fn), and take it apart in loss_fn",
        )
    if not isinstance(batch, tuple | list) or not batch:
        raise where.error(
            f"a batch is {type(batch).__name__}; the loop feeds a tuple of tensors: {fix}",
        )
    for index, item in enumerate(batch):
        if not isinstance(item, torch.Tensor):
            raise where.error(
                f"item {index} of a batch is {type(item).__name__}, not a "
                f"tensor; the loop moves each item of a batch to the device: {fix}",
            )


def _check_loss(workload: Workload, batch: tuple[torch.Tensor, ...], where: _Where) -> None:
    try:
        loss = workload.loss_fn(meta_copy(workload.model), tuple(t.to("meta") for t in batch))
    except Exception:  # noqa: BLE001 - what a meta tensor cannot run is left to the run
        return
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.dim() == 0:
        return
    if isinstance(loss, torch.Tensor):
        got = f"a tensor of shape {list(loss.shape)}"
        fix = "reduce it to a scalar, e.g. .mean(), or .squeeze() a shape [1]"
    else:
        got = type(loss).__name__
        if isinstance(loss, tuple | list) and loss:
            got += f" of {len(loss)} ({', '.join(type(x).__name__ for x in loss[:4])})"
        fix = "return the loss alone (`return loss`, not `return loss, logits`)"
    raise where.error(
        f"loss_fn(model, batch) returned {got}; the loop backpropagates a "
        f"scalar loss tensor: {fix}",
    )
