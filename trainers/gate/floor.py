"""The CUDA-graph floor: the GPU's own time for one training step.

The whole step (forward, backward, optimizer) is captured once and replayed back to back with no
data loading, no input copies and no host syncs between replays, timed with CUDA events. No loop
setting can make a step faster than this, so `floor / step time` says how much of a config's step
is the GPU working.

The floor is the eager step's: it is measured in the study's precision (`precision`, as `run()`
applies it) and bounds only a step of eager kernels. A compiled step runs other (fused) kernels,
so the eager floor says nothing about it (`floor_applies`); and a floor measured slower than the
step it is compared with is no floor at all (measured under other conditions, or noise), so
`comparable_floor` leaves it out rather than print a ratio above 1. On an H100 a bf16 study once
printed "graph floor 163.590 ms/step; the recommended step is 20.853 ms": the floor had been
measured in fp32 without compilation, the step in bf16 compiled (issue 28).
"""

from __future__ import annotations

import dataclasses
import statistics

import torch

from trainers.config import LoopConfig
from trainers.core import resolve_device
from trainers.errors import UnsupportedOnDevice
from trainers.precision import Precision, check_precision, make_plan, matmul_precision_for
from trainers.step import GRAPH_WARMUP_STEPS, GraphStep
from trainers.streams import StreamPlan
from trainers.workloads.base import Workload


@dataclasses.dataclass(kw_only=True, frozen=True)
class Floor:
    step_ms: float
    """Median over `repeats` timings of `replays` back-to-back replays, per replay."""
    repeats_ms: tuple[float, ...]
    replays: int


def floor_applies(config: LoopConfig) -> str | None:
    """None where the eager whole-step graph floor bounds `config`'s step; else why it does not
    (a compiled model or optimizer runs other kernels than the floor replays)."""
    compiled = getattr(config, "compile", "none") != "none"
    if compiled or getattr(config, "optimizer", "as-built") == "compiled":
        return "the step is compiled: the eager graph floor does not bound its fused kernels"
    return None


def comparable_floor(floor_ms: float | None, step_ms: float | None) -> float | None:
    """`floor_ms` where it can be shown beside a step of `step_ms`: None when either is unknown
    or not positive, or when the floor is slower than the step (then it is no floor)."""
    if floor_ms is None or step_ms is None or not (0.0 < floor_ms <= step_ms):
        return None
    return floor_ms


def graph_floor(
    workload: Workload,
    *,
    replays: int = 50,
    repeats: int = 5,
    device: str | torch.device = "auto",
    precision: Precision | None = None,
) -> Floor:
    """The floor of `workload`'s eager step in `precision` (`run()`'s: autocast around forward
    and loss, the precision's float32 matmul setting; None: the process's)."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        raise UnsupportedOnDevice(f"the CUDA-graph floor needs a CUDA device, not {dev.type}")
    if precision is not None:
        check_precision(precision, cuda_graph=True)  # ConfigError for fp16: it cannot be captured
    with matmul_precision_for(precision):
        return _replay_floor(workload, dev, replays, repeats, precision)


def _replay_floor(
    workload: Workload,
    dev: torch.device,
    replays: int,
    repeats: int,
    precision: Precision | None,
) -> Floor:
    model = workload.model.to(dev)
    model.train()
    optimizer = workload.make_optimizer(model.parameters(), True)
    plan = StreamPlan.create(1, dev, cuda_graph=True)
    step = GraphStep(model, optimizer, workload.loss_fn, plan, precision=make_plan(precision, dev))
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
