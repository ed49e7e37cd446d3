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
