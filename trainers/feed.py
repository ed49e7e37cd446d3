"""From the dataset to batches on the device: DataLoader, the data position, prefetch and stream
ordering; a batch split into micro-batches (`split_batch`)."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from trainers.config import LoopConfig
from trainers.errors import ConfigError
from trainers.streams import StreamPlan, on
from trainers.workloads.base import Batch, Workload


def make_loader(
    workload: Workload,
    config: LoopConfig,
    device: torch.device,
    *,
    generator: torch.Generator | None = None,
) -> DataLoader[Batch]:
    """A real DataLoader, so `num_workers` and `pin_memory` cost what they cost in training.

    generator: where each epoch's iterator draws its base seed; None draws it from torch's global
    generator, which then depends on when epochs start (`trainers.fit` passes its own, so that a
    resumed run's dropout draws the same numbers as an uninterrupted one).
    """
    return DataLoader(
        workload.dataset,
        batch_size=workload.batch_size,
        collate_fn=workload.collate_fn,  # None: the DataLoader's default
        shuffle=False,
        num_workers=config.num_workers,
        # Pinning needs CUDA; on a CPU the setting is accepted and has no effect.
        pin_memory=config.pin_memory and device.type == "cuda",
        persistent_workers=config.num_workers > 0,
        drop_last=workload.batch_size is not None,
        generator=generator,
    )


def cycle(loader: DataLoader[Batch]) -> Iterator[Batch]:
    """Batches in dataset order, epoch after epoch: every run sees the same sequence."""
    while True:
        yielded = False
        for batch in loader:
            yielded = True
            yield tuple(batch)
        if not yielded:
            raise ValueError("the workload's dataset yields no batch")


LOADER_SEED = 0
"""Seeds the generator each epoch's loader draws its base seed (worker seeds) from."""


def positioned_batches(
    workload: Workload,
    config: LoopConfig,
    device: torch.device,
    start: int,
    *,
    opened: list[DataLoader[Batch]],
) -> Iterator[Batch]:
    """The batches from batch `start` on, in dataset order, epoch after epoch, as an
    uninterrupted run would see them from there; the loaders made are appended to `opened`
    (`close_loaders` shuts their workers down).

    A map-style dataset of known length is entered at its position by index (a Subset for the
    rest of the current epoch): nothing before it is loaded; a stream is skipped by loading.
    Each epoch's loader draws its base seed (worker seeds) from a generator of the run's own,
    advanced by the epochs already done, never from the global generator that dropout uses.
    Resume is exact when loading a batch draws no random numbers (the built-in workloads), or a
    generator seeded per sample. Drawn from the global generators, augmentation resumes exactly
    only with no workers and no prefetch: a worker's generator has drawn for the batches it
    loaded before, and the resumed epoch deals its batches out to the workers from another start
    (a user's probe, 2026-12-06).
    """
    generator = torch.Generator().manual_seed(LOADER_SEED)
    full = make_loader(workload, config, device, generator=generator)
    opened.append(full)
    try:
        per_epoch = len(full)
    except TypeError:  # an iterable dataset: skipped by loading
        per_epoch = 0
    if isinstance(workload.dataset, torch.utils.data.IterableDataset):
        # One with a `__len__` too: it cannot be entered by index (a Subset of it had raised
        # "should implement __getitem__" on resume mid-epoch, a user's probe, 2026-12-07).
        per_epoch = 0
    if per_epoch == 0:
        batches = cycle(full)
        for _ in range(start):
            next(batches)
        yield from batches
        return
    epochs, offset = divmod(start, per_epoch)
    for _ in range(epochs):
        # What each epoch's iterator draws for its base seed (DataLoader._get_shared_seed).
        torch.empty((), dtype=torch.int64).random_(generator=generator)
    if offset:
        size = workload.batch_size or 1
        rest = torch.utils.data.Subset(workload.dataset, range(offset * size, per_epoch * size))
        partial = make_loader(
            dataclasses.replace(workload, dataset=rest), config, device, generator=generator
        )
        opened.append(partial)
        for batch in partial:
            yield tuple(batch)
    yield from cycle(full)


def close_loaders(loaders: list[DataLoader[Any]]) -> None:
    """Shut the persistent DataLoader workers of `loaders` down (at the end of a run, even on
    error: they are processes that would otherwise outlive it)."""
    for loader in loaders:
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()


@dataclasses.dataclass(slots=True)
class _InFlight:
    batch: Batch
    ready: torch.cuda.Event | None
    stream: torch.cuda.Stream | None


class DeviceFeed:
    """Copies batches to the device `prefetch_depth` steps ahead, on the transfer stream(s).

    `next()` returns batch i with the compute streams ordered after its copy and its memory kept
    alive for them, so the caching allocator cannot hand it to the next copy too early.
    """

    def __init__(
        self,
        batches: Iterator[Batch],
        plan: StreamPlan,
        config: LoopConfig,
        device: torch.device,
    ) -> None:
        self._batches = batches
        self._plan = plan
        self._depth = config.prefetch_depth
        self._non_blocking = config.non_blocking
        self._device = device
        self._in_flight: collections.deque[_InFlight] = collections.deque()
        self._issued = 0

    def _issue(self) -> None:
        host_batch = next(self._batches)
        # With two transfer streams (num_streams=4) consecutive batches alternate between them.
        stream = self._plan.transfer[self._issued % len(self._plan.transfer)]
        self._issued += 1
        with on(stream):
            # Asynchronous only from pinned memory with non_blocking=True.
            batch = tuple(t.to(self._device, non_blocking=self._non_blocking) for t in host_batch)
            ready = None
            if stream is not None and stream != self._plan.forward:
                # Marks the end of this batch's copy, for the compute stream to wait on.
                ready = torch.cuda.Event()
                ready.record(stream)
        self._in_flight.append(_InFlight(batch, ready, stream))

    def next(self) -> Batch:
        while len(self._in_flight) <= self._depth:
            self._issue()
        item = self._in_flight.popleft()
        if item.ready is not None:
            for consumer in self._plan.compute_streams():
                # The step must not read the batch before its copy has landed.
                consumer.wait_event(item.ready)
                for tensor in item.batch:
                    # Made on the transfer stream, used on `consumer`: keep its memory reserved
                    # until the consumer's queued work is done.
                    tensor.record_stream(consumer)
        return item.batch


def split_batch(batch: Batch, pieces: int) -> list[Batch]:
    """`batch` cut along its first dimension into `pieces` equal micro-batches (views: no copy;
    the feed's stream hand-off covers their storage). ConfigError naming `micro_batches` when a
    tensor's first dimension does not split evenly, or differs from another's: a mask of
    sequence x sequence shared by the batch's ids had been cut in two beside them, and every
    trial failed in torch's attention (a probe, 2026-12-07)."""
    firsts = sorted({int(t.shape[0]) for t in batch if t.dim() > 0})
    for tensor in batch:
        if tensor.dim() == 0 or tensor.shape[0] % pieces:
            size = "a scalar" if tensor.dim() == 0 else f"first dimension {tensor.shape[0]}"
            said = f"a divisor of the batch (a batch tensor has {size}; every tensor"
        elif len(firsts) > 1:
            shown = " and ".join(str(n) for n in firsts)
            said = f"1 for batches whose tensors have first dimensions {shown} (every tensor"
        else:
            continue
        raise ConfigError(
            "micro_batches",
            pieces,
            f"{said} of a batch must have the samples along its first dimension)",
        )
    return list(zip(*(tensor.chunk(pieces) for tensor in batch), strict=True))
