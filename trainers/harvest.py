"""Getting the losses back to the host: when the host waits, how, and proof that none is lost.

`LossLedger` takes every step's loss exactly once and in step order, or raises. The harvesters
decide when the host blocks:
- `DeferredHarvester` (sync modes `synchronize` and `event`): keeps the device losses of the last
  `sync_interval` steps; at each sync point it stacks them, copies them into pinned host memory on
  the last stream, and blocks once (device synchronize, or an event on the last stream).
- `QueryHarvester` (sync mode `query`): copies each loss into its own pinned host slot behind an
  event as soon as it is made; at each sync point it takes the losses whose event `query()` says
  are done, without blocking. Only the final drain blocks.
On a CPU the losses are already on the host; the sync points are kept (and counted) so the logic
is the same and testable, but nothing waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from trainers.config import LoopConfig
from trainers.errors import TrainerError
from trainers.streams import StreamPlan, on


class LossLedger:
    """Every step's loss, once, in order."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.batches: list[tuple[int, int]] = []  # (first step, count) of each extraction
        self.listener: Callable[[int, list[float]], None] | None = None
        """Called with (first step, values) after each extraction (`trainers.fit`'s on_losses)."""

    def take(self, first_step: int, values: list[float]) -> None:
        if first_step != len(self.losses):
            raise TrainerError(
                f"loss of step {first_step} extracted out of order: "
                f"the next expected step is {len(self.losses)}"
            )
        self.losses.extend(values)
        self.batches.append((first_step, len(values)))
        if self.listener is not None:
            self.listener(first_step, values)

    def proof(self, total_steps: int) -> dict[str, Any]:
        """What the result shows: which steps were extracted, how often and in what order."""
        steps = [first + i for first, count in self.batches for i in range(count)]
        return {
            "n_extracted": len(steps),
            "expected": total_steps,
            "in_order": steps == list(range(len(steps))),
            "each_once": len(set(steps)) == len(steps),
            "complete": steps == list(range(total_steps)),
            "extractions": len(self.batches),
        }


class Harvester:
    """Common counters: blocking syncs, the host time spent blocked, non-blocking polls."""

    def __init__(self, plan: StreamPlan, capacity: int, device: torch.device) -> None:
        self.plan = plan
        self.device = device
        self.ledger = LossLedger()
        self.n_syncs = 0
        self.n_polls = 0
        self.sync_wait_s = 0.0
        self._cuda = device.type == "cuda"
        # One pinned slot per step: a slot is never reused, so no copy can overwrite a value
        # that the host has not read yet.
        self._host = torch.empty(capacity, dtype=torch.float32, pin_memory=self._cuda)

    def push(self, step: int, loss: torch.Tensor) -> None:
        raise NotImplementedError

    def sync_point(self) -> None:
        raise NotImplementedError

    def drain(self) -> None:
        raise NotImplementedError

    def _blocked(self, started: float) -> None:
        self.n_syncs += 1
        self.sync_wait_s += time.perf_counter() - started


class DeferredHarvester(Harvester):
    def __init__(
        self, plan: StreamPlan, capacity: int, device: torch.device, *, use_event: bool
    ) -> None:
        super().__init__(plan, capacity, device)
        self.use_event = use_event
        self._pending: list[torch.Tensor] = []
        self._first = 0

    def push(self, step: int, loss: torch.Tensor) -> None:
        if not self._pending:
            self._first = step
        self._pending.append(loss)

    def sync_point(self) -> None:
        if not self._pending:
            return
        first, count = self._first, len(self._pending)
        if not self._cuda:
            values = torch.stack(self._pending).tolist()
            self._pending.clear()
            self.ledger.take(first, values)
            self.n_syncs += 1
            return
        last = self.plan.last
        with on(last):
            # On the last stream, which is ordered after every forward that made these losses.
            stacked = self._pending[0] if count == 1 else torch.stack(self._pending)
            self._host[first : first + count].copy_(stacked.reshape(count), non_blocking=True)
            done = torch.cuda.Event() if self.use_event else None
            if done is not None:
                done.record()
        started = time.perf_counter()
        if done is not None:
            # Blocks the host until the last stream reaches the event: the losses are home.
            done.synchronize()
        else:
            # Blocks the host until every stream on the device is idle.
            torch.cuda.synchronize(self.device)
        self._blocked(started)
        self.ledger.take(first, self._host[first : first + count].tolist())
        self._pending.clear()

    def drain(self) -> None:
        self.sync_point()


class QueryHarvester(Harvester):
    def __init__(self, plan: StreamPlan, capacity: int, device: torch.device) -> None:
        super().__init__(plan, capacity, device)
        self._pending: list[tuple[int, torch.cuda.Event | None]] = []

    def push(self, step: int, loss: torch.Tensor) -> None:
        if not self._cuda:
            self._host[step] = loss.detach()
            self._pending.append((step, None))
            return
        with on(self.plan.forward):
            # Queued right behind the loss on the stream that made it; the host does not wait.
            self._host[step : step + 1].copy_(loss.reshape(1), non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        self._pending.append((step, copied))

    def _take_ready(self) -> None:
        ready = 0
        for _, event in self._pending:
            self.n_polls += 1
            # Event.query() never blocks: True once the copy into the pinned slot is done.
            if event is not None and not event.query():
                break
            ready += 1
        if ready:
            first = self._pending[0][0]
            self.ledger.take(first, self._host[first : first + ready].tolist())
            del self._pending[:ready]

    def sync_point(self) -> None:
        self._take_ready()

    def drain(self) -> None:
        if self._pending and self._pending[-1][1] is not None:
            started = time.perf_counter()
            # The only blocking wait of this mode: the last copy, hence every copy, is done.
            event = self._pending[-1][1]
            assert event is not None
            event.synchronize()
            self._blocked(started)
        self._take_ready()


def make_harvester(
    config: LoopConfig, plan: StreamPlan, capacity: int, device: torch.device
) -> Harvester:
    if config.sync_mode == "query":
        return QueryHarvester(plan, capacity, device)
    return DeferredHarvester(plan, capacity, device, use_event=config.sync_mode == "event")
