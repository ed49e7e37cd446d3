"""The CUDA-graph floor: the GPU's own time for one training step.

The whole step (forward, backward, optimizer) is captured once and replayed back to back with no
data loading, no input copies and no host syncs between replays, timed with CUDA events. No loop
setting can make a step faster than this, so `floor / step time` says how much of a config's step
is the GPU working.
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from trainers.core import resolve_device
from trainers.errors import UnsupportedOnDevice
from trainers.step import GRAPH_WARMUP_STEPS, GraphStep
from trainers.streams import StreamPlan
from trainers.workloads.base import Workload


@dataclasses.dataclass(kw_only=True, frozen=True)
class Floor:
    step_ms: float
    """Median over `repeats` timings of `replays` back-to-back replays, per replay."""
    repeats_ms: tuple[float, ...]
    replays: int


def graph_floor(
    workload: Workload, *, replays: int = 50, repeats: int = 5, device: str | torch.device = "auto"
) -> Floor:
    dev = resolve_device(device)
    if dev.type != "cuda":
        raise UnsupportedOnDevice(f"the CUDA-graph floor needs a CUDA device, not {dev.type}")
    model = workload.model.to(dev)
    model.train()
    optimizer = workload.make_optimizer(model.parameters(), True)
    plan = StreamPlan.create(1, dev, cuda_graph=True)
    step = GraphStep(model, optimizer, workload.loss_fn, plan)
    batch = tuple(t.to(dev) for t in workload.dataset[0])
    if workload.batch_size is not None:  # a per-sample dataset: stack one batch of samples
        samples = [workload.dataset[i] for i in range(workload.batch_size)]
        batch = tuple(torch.stack(parts).to(dev) for parts in zip(*samples, strict=True))
    for _ in range(GRAPH_WARMUP_STEPS + 1):  # eager warm-up, then capture and one replay
        step(batch)
    graph = step.graph
    assert graph is not None
    timings = []
    for _ in range(repeats):
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        # Device sync before reading the events: every replay has finished.
        torch.cuda.synchronize(dev)
        timings.append(start.elapsed_time(end) / replays)
    return Floor(step_ms=statistics.median(timings), repeats_ms=tuple(timings), replays=replays)
