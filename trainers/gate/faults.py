"""Planted faults: deliberately broken copies of our own loop parts, to show that the parity gate
catches the bugs it exists for. For tests and `benchmarks/gate_power.py` only; nothing in the
training loop imports this module.

Each fault is a subclass of `DeviceFeed`, `EagerStep` or `GraphStep` that overrides one method
and differs from the original by exactly one missing or wrong line (marked `FAULT`).
`planted(kind)` puts it into `trainers.core`'s namespace for the duration of the block, so `run()`
(and `Trainer`) build it instead of the original. It reaches every run inside the block:
measure the reference, the eager twin and the envelope before entering it.

A race shows only when the timing lets it, so each CUDA fault comes with a provocation: code
that is harmless while the line is there (`planted(kind, fault=False)` installs the provocation
alone, the control that must still pass bit for bit). The magnitudes are those of ordinary
loops, not chosen to make the gate look good:
- missing-wait: the compute streams do not wait for a batch's copy. Provocation: the copy starts
  `MISSING_WAIT_DELAY_US` = 2 ms late on its transfer stream (a copy engine busy with another
  transfer: 2 ms is the copy of about 40 MB at 20 GB/s, half of one float32 ImageNet batch of
  128 images, the torchvision default preset), and until it lands the destination holds the
  previous batch, so a premature read sees real data of the wrong step (never uninitialised
  memory, whose token ids could trip a device assert). It was 200 us (4 MB) until 2026-11-24:
  with that the race never showed on an H100 (uncaught in 0 of 3 seeds on transformer and
  convnet small), presumably because the step first read the batch later than 200 us after
  the copy was queued.
- missing-record-stream: the batch's memory is not kept for the compute streams, so the caching
  allocator hands it to the next batch's copy while the step may still read it. Provocation, in
  two parts. (1) Each step's kernels start `MISSING_RECORD_STREAM_LAG_US` = 20 ms after they are
  queued, or `HOST_LAG_MULTIPLE` = 3 times the host's time per step where that is longer (20 ms
  alone let the fault through 4 of 10 times on transformer small, whose host needs 23 ms per
  step: H100, 2026-11-25, docs/benchmarks/gate-h100-2026-11-25-f111199.md; 35 of 35 with it, at
  be4a869: gate-h100-2026-11-25.md): the GPU needs more time per
  step than the host, as in any GPU-bound loop (transformer large takes 33 ms of GPU time per
  step on an H100), so between syncs the host runs steps ahead
  and a freed batch is still to be read. The built-in small presets are host-bound (the GPU idles
  between kernels); without such a lag the race has nothing to race with there. (2) The next
  allocation of the batch's size on its transfer stream is written at once: when the loop has
  dropped batch i (its step is queued), the feed allocates tensors of batch i's shapes on the
  stream that copied it, up to `REUSE_TRIES` of them, until one lands in batch i's memory, and
  copies batch i+1's data into it, which is what the next copy of a real loop does. With the
  lag alone the race was caught 3 of 3 and then 2 of 3 on transformer `small` (H100,
  2026-11-24): whether the next copy got that very block was up to the allocator's choice among
  free blocks of one size. With `record_stream` in place the allocator keeps the block until the
  step has read it, so the allocations land elsewhere (or after the read) and the control still
  passes bit for bit.
- stale-graph-input: the graph replays without copying the new batch into its static input
  buffers, so it trains on the batch it was captured with, again and again. Provocation: the
  buffers are filled once at capture (a real bug of this kind usually does that).
- wrong-op: the optimizer step applies `WRONG_OP_LR_FACTOR` = 0.99 of its update, a 1 % error
  (a learning-rate schedule one step behind at step 100 of a linear warm-up). Not the gradient
  scaled before the step: Adam divides the gradient by its own running magnitude, so a constant
  gradient scale changes nothing but rounding, and the gate is right to pass it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, get_args

import torch

from trainers import core
from trainers.config import LoopConfig
from trainers.feed import DeviceFeed, _InFlight
from trainers.gate.reproducibility import fault_planted
from trainers.gate.verdict import GateTest
from trainers.step import EagerStep, GraphStep
from trainers.streams import on
from trainers.workloads.base import Batch

FaultKind = Literal["missing-wait", "missing-record-stream", "stale-graph-input", "wrong-op"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)

MISSING_WAIT_DELAY_US = 2_000.0
MISSING_RECORD_STREAM_LAG_US = 20_000.0
HOST_LAG_MULTIPLE = 3.0
MAX_LAG_US = 250_000.0
REUSE_TRIES = 16
WRONG_OP_LR_FACTOR = 0.99

_spin: Callable[[int], None] = torch.cuda._sleep
"""A kernel that spins on the GPU for the given number of clock cycles."""


def gpu_sleep(microseconds: float, device: torch.device) -> None:
    """Queue a kernel on the current stream that spins for about `microseconds` (no-op on CPU)."""
    if device.type != "cuda" or microseconds <= 0:
        return
    khz = getattr(torch.cuda.get_device_properties(device), "clock_rate", 1_500_000)
    _spin(int(microseconds * khz / 1000))


# -- (a) missing transfer -> compute wait ---------------------------------------------------------
class DelayedCopyFeed(DeviceFeed):
    """Provocation: each copy after the first starts `delay_us` late on its transfer stream, into
    a buffer that holds the previous batch until then."""

    delay_us = MISSING_WAIT_DELAY_US
    _previous: Batch | None = None

    def _issue(self) -> None:
        host_batch = next(self._batches)
        stream = self._plan.transfer[self._issued % len(self._plan.transfer)]
        self._issued += 1
        previous = self._previous
        same_shapes = previous is not None and [t.shape for t in previous] == [
            t.shape for t in host_batch
        ]
        with on(stream):
            if previous is None or not same_shapes:
                batch = tuple(
                    t.to(self._device, non_blocking=self._non_blocking) for t in host_batch
                )
            else:
                batch = tuple(t.clone() for t in previous)
                gpu_sleep(self.delay_us, self._device)
                for target, source in zip(batch, host_batch, strict=True):
                    target.copy_(source, non_blocking=self._non_blocking)
            ready = None
            if stream is not None and stream != self._plan.forward:
                ready = torch.cuda.Event()
                ready.record(stream)
        self._previous = batch
        self._in_flight.append(_InFlight(batch, ready, stream))


class MissingWaitFeed(DelayedCopyFeed):
    def next(self) -> Batch:
        while len(self._in_flight) <= self._depth:
            self._issue()
        item = self._in_flight.popleft()
        if item.ready is not None:
            for consumer in self._plan.compute_streams():
                # FAULT: `consumer.wait_event(item.ready)` is missing.
                for tensor in item.batch:
                    tensor.record_stream(consumer)
        return item.batch


# -- (b) missing record_stream --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True, slots=True)
class _Footprint:
    """Where a handed-out tensor lived (plain numbers: the tensor itself must be free to go)."""

    ptr: int
    nbytes: int
    shape: torch.Size
    dtype: torch.dtype
    stream: torch.cuda.Stream | None


class LaggingComputeFeed(DeviceFeed):
    """Provocation: the compute streams start each step's kernels `lag_us` late, and the memory
    of the batch handed out last time, once the loop has let it go, is taken by the next
    same-size allocation on its transfer stream and written at once (`reuse_tries` tries)."""

    lag_us = MISSING_RECORD_STREAM_LAG_US
    host_multiple = HOST_LAG_MULTIPLE
    reuse_tries = REUSE_TRIES
    _last: tuple[_Footprint, ...] = ()
    _handed = 0
    _previous_at: float | None = None
    _host_s: float | None = None

    def next(self) -> Batch:
        batch = self._hand_out()
        transfer = self._plan.transfer
        # Batches are handed out in the order they were issued: hand-out i was copied on the
        # transfer stream of issue i.
        stream = transfer[self._handed % len(transfer)] if transfer else None
        self._handed += 1
        lag = self._lag_us()
        for consumer in self._plan.compute_streams():
            with on(consumer):
                gpu_sleep(lag, self._device)
        self._reuse_freed(batch, stream)
        return batch

    def _lag_us(self) -> float:
        """`lag_us`, or `host_multiple` times the host's shortest time between hand-outs so far
        where that is longer (capped at MAX_LAG_US). On a host-bound step (transformer small
        queues its kernels in about 23 ms on an H100) a fixed 20 ms lag was used up while the
        host still queued the step, the next copy raced the step's last reads, and the fault was
        caught 6 of 10 times. The shortest interval, because one that holds a sync point's wait
        is the GPU's time (lags included), not the host's."""
        now = time.perf_counter()
        if self._previous_at is not None:
            interval = now - self._previous_at
            self._host_s = interval if self._host_s is None else min(self._host_s, interval)
        self._previous_at = now
        if self._host_s is None:
            return self.lag_us
        return min(MAX_LAG_US, max(self.lag_us, self.host_multiple * self._host_s * 1e6))

    def _hand_out(self) -> Batch:
        return DeviceFeed.next(self)

    def _reuse_freed(self, batch: Batch, stream: torch.cuda.Stream | None) -> None:
        """The next copy of the last batch's size, on its transfer stream, into its memory if
        the allocator gives it out: it does at once without `record_stream`, and only after the
        compute streams' queued work with it."""
        freed = self._last
        self._last = tuple(
            _Footprint(t.data_ptr(), t.numel() * t.element_size(), t.shape, t.dtype, stream)
            for t in batch
        )
        if self._device.type != "cuda":
            return
        for old, source in zip(freed, batch, strict=False):
            if old.stream is None or (old.shape, old.dtype) != (source.shape, source.dtype):
                continue
            with on(old.stream):
                if stream is not None and stream != old.stream:
                    # The source was copied on another transfer stream: read it once it landed.
                    old.stream.wait_stream(stream)
                held = []
                for _ in range(self.reuse_tries):
                    # Allocated on the producer stream, from that stream's pool of free blocks.
                    fresh = torch.empty(old.shape, dtype=old.dtype, device=self._device)
                    start, end = fresh.data_ptr(), fresh.data_ptr() + old.nbytes
                    if start < old.ptr + old.nbytes and old.ptr < end:
                        # The next batch's data, written where the step may not have read yet.
                        fresh.copy_(source, non_blocking=True)
                        break
                    held.append(fresh)  # keep it, so the next try gets another block


class MissingRecordStreamFeed(LaggingComputeFeed):
    def _hand_out(self) -> Batch:
        while len(self._in_flight) <= self._depth:
            self._issue()
        item = self._in_flight.popleft()
        if item.ready is not None:
            for consumer in self._plan.compute_streams():
                consumer.wait_event(item.ready)
                # FAULT: `tensor.record_stream(consumer)` for each tensor is missing.
        return item.batch


# -- (c) a graph replaying a stale input ----------------------------------------------------------
class FilledAtCaptureGraphStep(GraphStep):
    """Provocation: the static input buffers are filled with the captured batch."""

    def _capture(self, batches: Sequence[Batch]) -> None:
        super()._capture(batches)
        with on(self.plan.forward):
            for statics, batch in zip(self.static_batches, batches, strict=True):
                for static, tensor in zip(statics, batch, strict=True):
                    static.copy_(tensor)


class StaleInputGraphStep(FilledAtCaptureGraphStep):
    def _replay(self, batches: Sequence[Batch]) -> torch.Tensor:
        assert self.graph is not None and self.static_loss is not None
        with on(self.plan.forward):
            # FAULT: the copy of `batches` into `self.static_batches` is missing.
            self.graph.replay()
            return self.static_loss.clone()


# -- (d) one wrong op in the step -----------------------------------------------------------------
class WrongOpEagerStep(EagerStep):
    lr_factor = WRONG_OP_LR_FACTOR

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for group in self.optimizer.param_groups:
            group["lr"] = group["lr"] * self.lr_factor  # FAULT: the update is scaled


class WrongOpGraphStep(GraphStep):
    lr_factor = WRONG_OP_LR_FACTOR

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for group in self.optimizer.param_groups:
            group["lr"] = group["lr"] * self.lr_factor  # FAULT: the update is scaled


@dataclasses.dataclass(kw_only=True, frozen=True)
class Fault:
    """A planted fault: what it breaks, the config that exposes it, the test the gate is run
    with (None: the one the config requires) and the classes `planted` installs."""

    kind: FaultKind
    description: str
    magnitude: str
    cuda_only: bool
    config: LoopConfig
    test: GateTest | None
    faulty: dict[str, type]
    provocation: dict[str, type]


_SEED_BASELINE = LoopConfig(num_streams=2, pin_memory=True, non_blocking=True)
_DEFERRED = LoopConfig(
    num_streams=2, sync_interval=10, sync_mode="event", pin_memory=True, non_blocking=True
)
_GRAPH = LoopConfig(
    cuda_graph=True, sync_interval=10, sync_mode="event", pin_memory=True, non_blocking=True
)

FAULTS: dict[str, Fault] = {
    "missing-wait": Fault(
        kind="missing-wait",
        description="the compute streams do not wait for the batch's host-to-device copy",
        magnitude=f"copy starts {MISSING_WAIT_DELAY_US:g} us late; stale data is the last batch",
        cuda_only=True,
        config=_SEED_BASELINE,
        test=None,
        faulty={"DeviceFeed": MissingWaitFeed},
        provocation={"DeviceFeed": DelayedCopyFeed},
    ),
    "missing-record-stream": Fault(
        kind="missing-record-stream",
        description="the batch's memory is not recorded on the compute streams, so the "
        "allocator reuses it for the next copy while the step may still read it",
        magnitude=f"each step's kernels start {MISSING_RECORD_STREAM_LAG_US / 1000:g} ms late, or "
        f"{HOST_LAG_MULTIPLE:g}x the host's time per step where that is longer; "
        "the freed batch's memory is taken by the next same-size copy at once",
        cuda_only=True,
        config=_DEFERRED,
        test=None,
        faulty={"DeviceFeed": MissingRecordStreamFeed},
        provocation={"DeviceFeed": LaggingComputeFeed},
    ),
    "stale-graph-input": Fault(
        kind="stale-graph-input",
        description="the CUDA graph replays without copying the new batch into its static input",
        magnitude="every replay trains on the batch of the capture step",
        cuda_only=True,
        config=_GRAPH,
        test=None,
        faulty={"GraphStep": StaleInputGraphStep},
        provocation={"GraphStep": FilledAtCaptureGraphStep},
    ),
    "wrong-op": Fault(
        kind="wrong-op",
        description="the optimizer step applies a scaled update (learning rate x factor)",
        magnitude=f"learning rate x {WRONG_OP_LR_FACTOR:g}",
        cuda_only=False,
        config=LoopConfig(),
        test="equivalence",
        faulty={"EagerStep": WrongOpEagerStep, "GraphStep": WrongOpGraphStep},
        provocation={},
    ),
}
"""Every planted fault. wrong-op runs the equivalence test alone: the exact test would catch it
at the first step, and what needs showing is that the statistical test does too."""


@contextlib.contextmanager
def planted(kind: FaultKind, *, fault: bool = True, **magnitude: float) -> Iterator[Fault]:
    """Install fault `kind` (or, with fault=False, its provocation alone) in `trainers.core`.

    magnitude: override a class attribute of the installed classes (`delay_us`, `lag_us`,
    `lr_factor`).
    """
    if kind not in FAULTS:
        raise ValueError(f"kind={kind!r} is invalid: allowed {', '.join(FAULT_KINDS)}")
    spec = FAULTS[kind]
    classes = spec.faulty if fault else spec.provocation
    substitutes: dict[str, type] = {}
    for name, cls in classes.items():
        unknown = [key for key in magnitude if not hasattr(cls, key)]
        if unknown:
            raise ValueError(f"{kind}: {cls.__name__} has no magnitude {', '.join(unknown)}")
        substitutes[name] = type(cls.__name__, (cls,), dict(magnitude)) if magnitude else cls
    originals = {name: getattr(core, name) for name in substitutes}  # AttributeError if renamed
    for name, cls in substitutes.items():
        setattr(core, name, cls)
    try:
        # The reproducibility probe refuses to run meanwhile: a fault is no irreproducibility.
        with fault_planted():
            yield spec
    finally:
        for name, original in originals.items():
            setattr(core, name, original)
