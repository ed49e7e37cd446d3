"""Milliseconds of one operation, for the levers' probes (`trainers.levers.declare.Probe`)."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable

import torch

REPEATS = 3
"""Timed groups of `iters` calls: the median group is the figure (one slow group, a loaded host
or another process's kernels, does not decide a probe)."""


def timed_ms(step: Callable[[], None], device: torch.device, warmup: int, iters: int) -> float:
    """Milliseconds of one `step()` on `device`, after `warmup` untimed calls: the median of
    `REPEATS` groups of `iters` calls, timed by CUDA events on a GPU, by the host's clock
    elsewhere."""
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    # The events are recorded on the current device's stream: it must be `device`'s.
    with on_device:
        for _ in range(warmup):
            step()
        return statistics.median(_group(step, device, iters) for _ in range(REPEATS))


def _group(step: Callable[[], None], device: torch.device, iters: int) -> float:
    if device.type != "cuda":
        started = time.perf_counter()
        for _ in range(iters):
            step()
        return (time.perf_counter() - started) * 1e3 / iters
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        step()
    end.record()
    # The one host wait of a group: the events' elapsed time needs both to have run.
    end.synchronize()
    return float(start.elapsed_time(end)) / iters


def graphed(step: Callable[[], None], device: torch.device, warmup: int = 3) -> Callable[[], None]:
    """`step` captured in a CUDA graph on `device`, given back as the graph's replay, which
    launches all of its kernels at once: what a probe then times is the GPU's time, not the
    host's time to launch the kernels. A small layer's step is mostly launches: on an H200
    (2026-12-02, Qwen1.5-0.5B shape, 16,384 rows) a 1024 x 1024 linear timed as launched ran
    near 0.8 ms in bf16 and 1.2 ms in float8, whatever its size, and the `float8_linears` probe
    summed 168 of them into a predicted 143 ms a step against a whole step of 113 ms that ran
    the same with them or without (the whole model compiled launches them from one graph).
    `step` itself elsewhere, and where capture fails (an op the graph cannot hold): as launched.
    The warm-up runs on a side stream, as capture asks (compiles and lazy inits happen there)."""
    if device.type != "cuda":
        return step
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        # The side stream starts after what the current stream has queued (the inputs).
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step()
        # And the capture after the warm-up's kernels.
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                step()
        except RuntimeError:
            return step
    return graph.replay
