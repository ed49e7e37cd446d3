"""From the dataset to batches on the device: DataLoader, prefetch and stream ordering."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader

from trainers.config import LoopConfig
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
