"""The checks of a `Trainer`'s held-out data (`eval_data`), made before any step: a ConfigError
naming `eval_data` and what to give instead, where each had failed at the first evaluation, after
`eval_every` steps had trained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sized
from typing import Any

import torch
from torch import nn
from torch.utils.data import IterableDataset

from trainers.errors import ConfigError
from trainers.meta import meta_copy_or_none
from trainers.workloads.base import Workload, evaluating
from trainers.workloads.checks import raised_at, shapes_disagree
from trainers.workloads.whole import sample_position, samples_in

EVAL_BATCHES = 100_000
"""Held-out batches past which `eval_data` is refused: every evaluation reads them all, and a
training stream given as held-out data (a token stream of 2**30 batches) had hung the first."""


def check_eval_data(eval_data: object) -> None:
    if eval_data is None:
        return
    if isinstance(eval_data, Sized) and len(eval_data) > EVAL_BATCHES:
        raise ConfigError(
            "eval_data",
            f"{type(eval_data).__name__} of {len(eval_data):,} batches",
            f"at most {EVAL_BATCHES:,} batches, each evaluation reads every one: a held-out "
            "slice, e.g. [dataset[i] for i in range(100)]",
        )
    if isinstance(eval_data, torch.Tensor) or (
        isinstance(eval_data, tuple) and all(isinstance(t, torch.Tensor) for t in eval_data)
    ):
        raise ConfigError(
            "eval_data", "one batch", "a collection of batches (wrap one batch in a list)"
        )
    if isinstance(eval_data, Mapping):
        raise ConfigError(
            "eval_data",
            f"one batch as a {type(eval_data).__name__} (iterated, its keys)",
            "a collection of batches (wrap one batch in a list: [batch])",
        )
    if isinstance(eval_data, str | bytes):
        raise ConfigError("eval_data", type(eval_data).__name__, "an iterable of batches")
    if isinstance(eval_data, torch.utils.data.TensorDataset):
        raise ConfigError(
            "eval_data",
            "TensorDataset",
            "batches: its items are single samples; give DataLoader(dataset, batch_size=N)",
        )
    try:
        iterator = iter(eval_data)  # type: ignore[call-overload]
    except TypeError:
        raise ConfigError("eval_data", type(eval_data).__name__, "an iterable of batches") from None
    if iterator is eval_data:
        raise ConfigError(
            "eval_data",
            type(eval_data).__name__,
            "a collection evaluated again every time (a list, a Dataset of batches or a "
            "DataLoader), not a one-shot iterator",
        )


_EMPTY = object()


def _kinds(batch: object) -> str:
    """What a batch is made of, by type: `tuple (Tensor, str)`."""
    if isinstance(batch, tuple | list):
        return f"{type(batch).__name__} ({', '.join(type(x).__name__ for x in batch[:4])})"
    return type(batch).__name__


def moved_batch(batch: Any, device: torch.device | str) -> Any:
    """A held-out batch on `device`, in its own shape: a tensor, a dict, a namedtuple (an
    explicit eval_loss reads its fields: a plain tuple had failed it) or a tuple of tensors."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, Mapping):
        return {key: value.to(device) for key, value in batch.items()}
    moved = tuple(t.to(device) for t in batch)
    return type(batch)(*moved) if hasattr(type(batch), "_fields") else moved


def check_eval_batch(
    model: nn.Module, eval_data: Any, loss_fn: Any, tuple_loss: Any | None = None
) -> None:
    """ConfigError naming `eval_data` where its first batch cannot go through the loss: run on
    a meta copy of `model` before any step (a float label, a missing key, other sizes had
    failed at the first evaluation, hundreds of steps in, as a traceback). `tuple_loss`: the
    loss of a tuple batch where the loop adapted the user's (`Trainer.evaluate` chooses so).
    `eval_data` is read again at each evaluation (`_check_eval_data` refused an iterator); what
    a meta tensor cannot do (read a value) is left to the evaluation. None: nothing to check.
    Without `tuple_loss`, `loss_fn` is the user's `eval_loss`, named where it returns no scalar."""
    if eval_data is None:
        return
    batch: Any = next(iter(eval_data), _EMPTY)
    if batch is _EMPTY:
        # Said at the first evaluation, after eval_every steps had trained.
        raise ConfigError("eval_data", "empty", "at least one batch")
    try:
        moved = moved_batch(batch, "meta")
    except (AttributeError, TypeError):
        # The evaluation moves each batch as it is (`moved_batch`): it had failed there, after
        # eval_every steps had trained (a user's probe, 2026-12-06).
        raise ConfigError(
            "eval_data",
            f"batches of {_kinds(batch)}",
            "batches of tensors: a tensor, a tuple of tensors or a dict of them",
        ) from None
    chosen = tuple_loss if tuple_loss is not None and isinstance(moved, tuple) else loss_fn
    copied = meta_copy_or_none(model)
    if copied is None:  # its TypeError had been said as the held-out batches' fault
        return
    try:
        # As `Trainer.evaluate` runs it: in eval mode, without gradients. In train mode a
        # BatchNorm had refused a batch of one sample that the evaluation takes (a probe,
        # 2026-12-07).
        with evaluating(copied), torch.no_grad():
            loss = chosen(copied, moved)
    except Exception as exc:
        said = " ".join(str(exc).split())
        # What a real batch raises too; a meta tensor's own limits (no values) are not said.
        kinds = KeyError | IndexError | AssertionError | ValueError | TypeError | AttributeError
        told = isinstance(exc, kinds) or shapes_disagree(said) or "dtype" in said
        if (told or "scalar type" in said) and "meta" not in said:
            raise ConfigError(
                "eval_data",
                "its first batch",
                f"batches the loss takes (loss_fn(model, batch) on it raised "
                f"{type(exc).__name__}{raised_at(exc)}: {said[:200]})",
            ) from exc
        return
    _check_scalar(loss, loss_fn, explicit=tuple_loss is None)


def _check_scalar(loss: object, loss_fn: Any, *, explicit: bool) -> None:
    """ConfigError unless the held-out loss is one number: the evaluation reads one a batch, and
    had failed after eval_every steps with "a Tensor with 24 elements cannot be converted to
    Scalar" (a probe, 2026-12-07)."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return
    got = f"a tensor of shape {list(loss.shape)}" if isinstance(loss, torch.Tensor) else None
    got = got or type(loss).__name__
    if explicit:
        raise ConfigError(
            "eval_loss",
            getattr(loss_fn, "__qualname__", type(loss_fn).__name__),
            f"a loss that returns a scalar tensor on a held-out batch (it returned {got})",
        )
    raise ConfigError(
        "eval_data",
        "its first batch",
        f"batches whose loss in eval mode is a scalar: loss_fn(model, batch) returned {got} "
        "there (a model that returns its loss only while training?); give "
        "eval_loss=fn(model, batch) that returns the held-out loss",
    )


def held_out_position(workload: Workload) -> int | None:
    """Where a held-out batch of `workload`'s data keeps its samples: the position of the first
    tensor of a training batch that leads with `samples_per_batch`, where the data are whole
    batches that can be indexed (`sample_position`); None elsewhere (batches the loader makes
    lead with their samples, and a stream is not read here). Ids `[B, S]` beside a mask
    `[S, S]` that the batch shares had been counted S samples a batch, not B: a mean over
    batches, not samples (a probe, 2026-12-07). Read once a Trainer, at its first evaluation."""
    dataset = workload.dataset
    if workload.batch_size is not None or isinstance(dataset, IterableDataset):
        return None  # a stream, with a `__len__` or not, cannot be indexed
    if not isinstance(dataset, Sized) or len(dataset) == 0:
        return None
    return sample_position(_tensors(dataset[0]), workload.samples_per_batch)


def held_out_samples(batch: Any, position: int | None) -> int:
    """The samples of a held-out batch (a tensor, a dict or a tuple): the first size of its
    tensor at `position` (`held_out_position`), else `samples_in` of its tensors; 1 where it
    holds none with a dimension."""
    tensors = _tensors(batch)
    if position is not None and position < len(tensors) and tensors[position].dim() > 0:
        return int(tensors[position].shape[0])
    return samples_in(tensors)


def _tensors(batch: Any) -> tuple[torch.Tensor, ...]:
    """A batch's tensors in order: a dict's values in its keys' order, as the loop's tuples."""
    if isinstance(batch, torch.Tensor):
        return (batch,)
    items = batch.values() if isinstance(batch, Mapping) else batch
    return tuple(t for t in items if isinstance(t, torch.Tensor))
