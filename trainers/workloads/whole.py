"""A dataset whose items are fed whole (`batch_size` None): how many samples such an item holds
(`samples_in`), and the refusals, naming `batch_size`, of an item that is one sample
(`check_whole`, `check_numbers`). Checked at build by `trainers.workloads.checks.own_workload`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from trainers.errors import WorkloadError


def samples_in(batch: tuple[torch.Tensor, ...]) -> int:
    """The samples of a whole batch (a dataset whose items are batches: `batch_size` None): a
    leading size that every tensor of it has among its sizes, the most common such, the smallest
    of a tie (a sequence-first input beside its labels: (5, 16, 4) and (16,) count 16); where no
    leading size is in every tensor, the most common; 1 where no tensor has a dimension.
    `workload_from_parts` had counted 1 sample a step there: a throughput of steps per second
    shown as samples/s, 16x too low at 16 samples a batch (a new user's trial, 2026-12-02)."""
    shaped = [t for t in batch if t.dim() > 0]
    if not shaped:
        return 1
    leading = [int(t.shape[0]) for t in shaped]
    shared = [n for n in leading if all(n in t.shape for t in shaped)] or leading
    return max(sorted(set(shared)), key=shared.count)


def sample_position(batch: tuple[torch.Tensor, ...], samples: int) -> int | None:
    """The position of a tensor of a whole batch that leads with its `samples`: where another
    batch of the same data (a held-out one, a short last one) keeps its samples. The first
    that has that size at its first dimension alone, else the first that leads with it: a
    sequence-first input `[T, B, F]` beside its labels `[B]` at T == B is counted by the labels.
    None where no tensor leads with them (a sequence-first input alone)."""
    leading = [
        position
        for position, tensor in enumerate(batch)
        if tensor.dim() > 0 and int(tensor.shape[0]) == samples
    ]
    alone = [p for p in leading if samples not in tuple(batch[p].shape[1:])]
    return (alone or leading)[0] if leading else None


def check_whole(batch: tuple[torch.Tensor, ...], samples: int | None = None) -> None:
    """WorkloadError where a dataset's item, fed whole (no batch size), looks like one sample: a
    scalar beside shaped tensors (a class label without its batch dimension), or tensors that
    share no size. Such a step trained one sample, and its samples were counted from a feature
    size: 16x the samples/s (a user's probe, 2026-12-06). `samples`: the `samples_per_batch`
    given (by `workload_from_parts`' argument or a Workload built by hand). Given, it had
    switched the check off: one sample a step, of 12 features, was counted 32 (a probe,
    2026-12-07). With it, an item is a batch where a tensor has that size (a mask shared by the
    batch may not), or holds only 1-D tensors of one length (a token stream the loss reshapes);
    a scalar beside them (a loss weight) where a tensor of 2 or more dimensions leads with it."""
    shaped = [t for t in batch if t.dim() > 0]
    scalar = len(shaped) < len(batch)
    shapes = ", ".join(str(list(t.shape)) for t in batch[:4])
    if samples is not None and shaped:
        stream = all(t.dim() == 1 for t in shaped) and len({t.numel() for t in shaped}) == 1
        if not stream and not any(samples in t.shape for t in shaped):
            raise WorkloadError(
                f"samples_per_batch={samples} but no tensor of the first item ({shapes}) has a "
                f"size of {samples}: a step would count {samples} samples it does not hold; give "
                "the item's batch size, or batch_size=N where each item is one sample",
                field="samples_per_batch",
            )
        if not scalar or any(t.dim() > 1 and t.shape[0] == samples for t in shaped):
            return  # a size of `samples` counts them (a shared mask beside ids, say)
    if shaped and (scalar or not any(all(n in t.shape for t in shaped) for n in shaped[0].shape)):
        why = "a scalar beside shaped tensors" if scalar else "its tensors share no size"
        given = "" if samples is None else f" at samples_per_batch={samples}"
        advice = (
            ""
            if samples is not None
            else (", or samples_per_batch=N where each item already is a batch of N")
        )
        raise WorkloadError(
            f"batch_size: None feeds each item of data whole, as a batch, and its first item "
            f"({shapes}) looks like one sample ({why}){given}; "
            f"give batch_size=N to batch its samples{advice}",
            field="batch_size",
        )


def check_numbers(item: Any) -> None:
    """WorkloadError naming `batch_size` where an item fed whole holds a Python number (a
    torchvision dataset's `(image, int)`): one sample, whose label the loader turns into a tensor
    only when it batches. It had been told to give tensors from `__getitem__`, and that fix then
    met the one-sample refusal (a probe, 2026-12-07)."""
    values = list(item.values()) if isinstance(item, Mapping) else item
    if not isinstance(values, tuple | list):
        return
    keys = list(item) if isinstance(item, Mapping) else list(range(len(values)))
    for key, value in zip(keys, values, strict=True):
        if isinstance(value, int | float) and not isinstance(value, torch.Tensor):
            named = repr(key) if isinstance(item, Mapping) else f"item {key}"
            raise WorkloadError(
                f"batch_size: None feeds each item of data whole, as a batch, and its first "
                f"item's {named} is a Python {type(value).__name__} ({value!r}): one sample's; "
                "give batch_size=N, and the loader batches the samples and makes tensors of "
                "their numbers",
                field="batch_size",
            )
