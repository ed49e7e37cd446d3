"""Where a config's time goes: a short `torch.profiler` pass over the real loop, its figures, a
verdict, and storing both on the study.

`profile_config(workload, config)` runs `trainers.run` for three windows of `steps` steps under
`torch.profiler.profile` (CPU activity, plus CUDA activity on a GPU) with the schedule
wait 1 / warmup 1 / active 1, stepped after each timed window: the first window runs without the
profiler (its step time is `unprofiled_step_ms`), the second warms the profiler up, the third is
recorded. Its Chrome trace (kineto's JSON) is the one source of every figure (`analyze_trace`),
and is kept gzip-compressed (`Profile.trace_gz`). The recorded region is the `ProfilerStep#2`
annotation, which spans exactly the third window: a device sync at its start, `steps` loop steps
and the device sync that ends the window (`trainers.measure.WindowTimer`).

Figures (per loop step; the ones about the GPU are None without CUDA activity):
- `step_ms`: wall time of the recorded window / steps (profiler overhead included);
- `gpu_busy_fraction`: the union of kernel intervals / the window (overlapping kernels on several
  streams count once);
- `launch_ms_per_step`: host time in kernel and graph launch calls (`cudaLaunchKernel`,
  `cudaLaunchKernelExC`, `cuLaunchKernel(Ex)`, `cudaGraphLaunch`, ...);
- `h2d_ms_per_step`: the union of host-to-device copy intervals; `h2d_overlap_fraction`: the share
  of it during which a kernel ran (None when nothing was copied); `h2d_exposed_ms_per_step`: the
  rest, copies the GPU did instead of compute;
- `sync_ms_per_step`: host time blocked in `cudaStreamSynchronize`, `cudaEventSynchronize` and
  `cudaDeviceSynchronize`, without the window's own two device syncs (the first and the last
  `cudaDeviceSynchronize` of the window: the measurement's, not the loop's). On a CPU: the
  RunResult's `sync_wait_ms` per step;
- `kernels_per_step`; `ops_per_step` (operator events the profiler recorded on the host);
- `breakdown_ms`: the window split into disjoint parts that add up to `step_ms` (see BREAKDOWN):
  on a GPU kernels / exposed H2D copies / other copies and memsets / GPU idle with the host in a
  sync / GPU idle with the host busy; on a CPU data loading / optimizer step / the rest / sync;
- `seconds`: wall time of the whole profiled run (device time, for accounting).

kineto prints `USDT:`/`STAGE:` lines straight to fd 2 whenever a trace starts or stops; they are
dropped (anything else written to stderr meanwhile is passed on), so `run --json` stays quiet.

`verdict(profile)` names what bounds the step. Its GPU fractions (busy, exposed copies) are the
GPU's time per step over `unprofiled_step_ms`, not over the profiled step: the profiler slows the
host, which records every op and launch, and not the kernels. On an H100 the eager transformer
`large` ran 38.7 ms per step unprofiled and 76.3 ms profiled, with 31.5 ms of kernels per step:
41 % busy over the profiled step would call it host-bound, 81 % over the real step says
gpu-bound, which the whole-step graph's mere 1.22x gain confirms (docs/benchmarks/README.md).
Host-side sync time stays a fraction of the profiled step. The checks run in this order, first
match wins:
1. no CUDA activity -> `unknown` (the reason is the CPU note);
2. `transfer-bound`: host-to-device copies that overlap no kernel take more than
   TRANSFER_BOUND_FRACTION (20 %) of the step. First, because exposed copies also leave the
   kernels idle and would otherwise read as host-bound;
3. `sync-bound`: the host is blocked in syncs for more than SYNC_BOUND_FRACTION (30 %) of the step
   while the GPU is busy less than GPU_SATURATED_FRACTION (90 %) of it: host and GPU take turns
   instead of overlapping. A host waiting on a saturated GPU is not sync-bound but gpu-bound;
4. `host-bound`: the GPU is busy less than HOST_BOUND_BUSY (50 %) of the step: it idles while the
   host launches (Python, launch calls, data loading);
5. `gpu-bound`: otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.engine
import sqlalchemy.exc
import torch
from torch.profiler import ProfilerActivity, profile, schedule

import trainers
from trainers import LoopConfig, Window, Workload
from trainers.step import GRAPH_WARMUP_STEPS
from tuner.errors import TunerError

CPU_NOTE = "profiled without CUDA activity (CPU run): GPU figures are not available"

HOST_BOUND_BUSY = 0.50
SYNC_BOUND_FRACTION = 0.30
TRANSFER_BOUND_FRACTION = 0.20
GPU_SATURATED_FRACTION = 0.90
KINDS = ("host-bound", "transfer-bound", "sync-bound", "gpu-bound", "unknown")

TRIAL_ATTR = "profile"
"""User attribute of a trial that was profiled (`--profile all`)."""
STUDY_PREFIX = "profile/"
"""`profile/<name>` on the study: a baseline's or the recommended config's profile."""
RECOMMENDED = "recommended"
ARTIFACTS_ENV = "TUNER_ARTIFACTS"

BREAKDOWN: dict[str, str] = {
    # CUDA: disjoint parts of the window, in stacking order.
    "kernels": "GPU running kernels",
    "h2d_exposed": "H2D copies not overlapped",
    "other_gpu": "other copies and memsets",
    "idle_sync": "GPU idle, host in a sync",
    "idle_host": "GPU idle, host busy",
    # CPU: no GPU; the host loads data, steps the optimizer, runs the rest, or waits in a sync.
    "data": "host loading data",
    "optimizer": "optimizer step",
    "host": "forward, backward and the rest",
    "sync": "host in a sync",
}
"""Keys of `Profile.breakdown_ms` -> what each part is (the report's legend)."""

LAUNCH_CALLS = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch")
"""Name prefixes of the runtime/driver calls that launch kernels or graphs."""
SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")
WINDOW_SYNC = "cudaDeviceSynchronize"
DATA_MARK = "enumerate(DataLoader)"
OPTIMIZER_MARK = "Optimizer."
_STEP_MARK = re.compile(r"ProfilerStep#\d+$")
_KINETO_LINE = re.compile(rb"(USDT|STAGE):\d{4}-\d\d-\d\d [^\n]*\] ")

Interval = tuple[float, float]


# --------------------------------------------------------------------------------------------
# intervals (microseconds, as in the trace)
# --------------------------------------------------------------------------------------------


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, non-overlapping intervals covering the same time as `intervals`."""
    merged: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def total(intervals: Sequence[Interval]) -> float:
    """Length of merged intervals."""
    return sum(end - start for start, end in intervals)


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two merged interval lists."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start, end = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """`a` without `b`, both merged."""
    out: list[Interval] = []
    j = 0
    for start, end in a:
        cursor = start
        while j < len(b) and b[j][1] <= cursor:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


# --------------------------------------------------------------------------------------------
# the trace -> figures
# --------------------------------------------------------------------------------------------


def _complete_events(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", [])
            if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e]


def _span(event: Mapping[str, Any]) -> Interval:
    start = float(event["ts"])
    return start, start + float(event["dur"])


def step_region(trace: Mapping[str, Any]) -> Interval:
    """The recorded window: the last host `ProfilerStep#N` annotation, else all events."""
    events = _complete_events(trace)
    marks = [_span(e) for e in events if e.get("cat") in ("user_annotation", "cpu_op")
             and _STEP_MARK.match(str(e.get("name", "")))]
    if marks:
        return max(marks)
    spans = [_span(e) for e in events]
    if not spans:
        raise ValueError("the trace holds no complete events")
    return min(s for s, _ in spans), max(e for _, e in spans)


def analyze_trace(trace: Mapping[str, Any], *, steps: int, cuda: bool,
                  window_syncs: bool = True) -> dict[str, Any]:
    """The profile's figures from a kineto Chrome trace of `steps` loop steps (see the module doc).

    `window_syncs`: the first and last `cudaDeviceSynchronize` of the region are the measurement
    window's own syncs and are left out of the sync time.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    region = step_region(trace)
    r0, r1 = region
    length = r1 - r0
    if length <= 0:
        raise ValueError("the profiled region is empty")
    window = [region]
    inside = [e for e in _complete_events(trace)
              if _span(e)[1] > r0 and _span(e)[0] < r1]

    def clipped(events: Iterable[Mapping[str, Any]]) -> list[Interval]:
        return intersect(merge(_span(e) for e in events), window)

    ops = [e for e in inside if e.get("cat") == "cpu_op"]
    figures: dict[str, Any] = {
        "step_ms": length / steps / 1e3,
        "ops_per_step": len(ops) / steps,
        "cuda_activity": cuda,
    }
    if not cuda:
        marks = [e for e in inside if e.get("cat") == "user_annotation"]
        data = clipped(e for e in marks if str(e.get("name", "")).startswith(DATA_MARK))
        optimizer = subtract(clipped(
            e for e in marks if str(e.get("name", "")).startswith(OPTIMIZER_MARK)), data)
        parts_us = {"data": total(data), "optimizer": total(optimizer)}
        parts_us["host"] = max(0.0, length - sum(parts_us.values()))
        return figures | {
            "gpu_busy_fraction": None, "launch_ms_per_step": None, "h2d_ms_per_step": None,
            "h2d_overlap_fraction": None, "h2d_exposed_ms_per_step": None,
            "kernels_per_step": None, "sync_ms_per_step": 0.0,
            "breakdown_ms": {k: v / steps / 1e3 for k, v in parts_us.items()} | {"sync": 0.0},
        }

    kernel_events = [e for e in inside if e.get("cat") == "kernel"]
    copies = [e for e in inside if e.get("cat") == "gpu_memcpy"]
    h2d_events = [e for e in copies if "HtoD" in str(e.get("name", ""))]
    other_events = [e for e in copies if "HtoD" not in str(e.get("name", ""))] + [
        e for e in inside if e.get("cat") == "gpu_memset"]
    runtime = [e for e in inside if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launches = [e for e in runtime if str(e.get("name", "")).startswith(LAUNCH_CALLS)]
    syncs = sorted((e for e in runtime if e.get("name") in SYNC_CALLS), key=lambda e: e["ts"])
    if window_syncs:
        device_syncs = [e for e in syncs if e.get("name") == WINDOW_SYNC]
        edges = {id(e) for e in device_syncs[:1] + device_syncs[-1:]}
        syncs = [e for e in syncs if id(e) not in edges]

    kernels = clipped(kernel_events)
    h2d = clipped(h2d_events)
    h2d_exposed = subtract(h2d, kernels)
    gpu_copy_busy = merge([*kernels, *h2d])
    other = subtract(clipped(other_events), gpu_copy_busy)
    busy = merge([*gpu_copy_busy, *other])
    # Host sync time: the calls' own durations (one host thread cannot be in two calls at once).
    sync_us = sum(total(intersect([_span(e)], window)) for e in syncs)
    idle_sync = subtract(clipped(syncs), busy)
    h2d_us = total(h2d)
    parts_us = {
        "kernels": total(kernels),
        "h2d_exposed": total(h2d_exposed),
        "other_gpu": total(other),
        "idle_sync": total(idle_sync),
    }
    parts_us["idle_host"] = max(0.0, length - sum(parts_us.values()))
    return figures | {
        "gpu_busy_fraction": total(kernels) / length,
        "launch_ms_per_step": sum(float(e["dur"]) for e in launches) / steps / 1e3,
        "h2d_ms_per_step": h2d_us / steps / 1e3,
        "h2d_overlap_fraction": None if h2d_us == 0 else 1.0 - total(h2d_exposed) / h2d_us,
        "h2d_exposed_ms_per_step": total(h2d_exposed) / steps / 1e3,
        "kernels_per_step": len(kernel_events) / steps,
        "sync_ms_per_step": sync_us / steps / 1e3,
        "breakdown_ms": {k: v / steps / 1e3 for k, v in parts_us.items()},
    }


# --------------------------------------------------------------------------------------------
# Profile
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True)
class Profile:
    """What one profiled run of one config showed (see the module doc for each figure)."""

    config: dict[str, Any]
    device: str
    cuda_activity: bool
    steps: int
    step_ms: float
    unprofiled_step_ms: float | None
    gpu_busy_fraction: float | None
    launch_ms_per_step: float | None
    h2d_ms_per_step: float | None
    h2d_overlap_fraction: float | None
    h2d_exposed_ms_per_step: float | None
    sync_ms_per_step: float
    kernels_per_step: float | None
    ops_per_step: float
    breakdown_ms: dict[str, float]
    note: str | None
    seconds: float = 0.0
    """Wall time of the whole profiled run (device time, for the study's accounting)."""
    trace_gz: bytes | None = dataclasses.field(default=None, repr=False)

    def to_attrs(self) -> dict[str, Any]:
        """JSON-safe figures (no trace): what is stored as a user attribute."""
        values = dataclasses.asdict(self)
        del values["trace_gz"]
        return values

    @classmethod
    def from_attrs(cls, attrs: Mapping[str, Any]) -> Profile:
        names = {f.name for f in dataclasses.fields(cls)} - {"trace_gz"}
        return cls(**{k: v for k, v in attrs.items() if k in names})

    def trace(self) -> dict[str, Any]:
        if self.trace_gz is None:
            raise ValueError("this profile carries no trace")
        return dict(json.loads(gzip.decompress(self.trace_gz)))


def profile_config(workload: Workload, config: LoopConfig, *, steps: int = 10, warmup: int = 5,
                   device: str | torch.device = "auto") -> Profile:
    """Profile `steps` steps of `config` (after `warmup` and one unprofiled window of `steps`).

    The workload's model trains during the run, as with `trainers.run`; its weights are put back
    afterwards. Errors of the run (out of memory, capture) propagate.
    """
    if steps < 1:
        raise trainers.ConfigError("steps", steps, "an integer >= 1")
    dev = trainers.resolve_device(device)
    cuda = dev.type == "cuda"
    if config.cuda_graph:
        warmup = max(warmup, GRAPH_WARMUP_STEPS + 1)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    started = time.perf_counter()
    saved = {k: v.detach().clone() for k, v in workload.model.state_dict().items()}
    with tempfile.TemporaryDirectory(prefix="streamtune-profile-") as tmp:
        trace_path = os.path.join(tmp, "trace.json")

        def export(prof: profile) -> None:
            prof.export_chrome_trace(trace_path)

        try:
            with _kineto_quiet(), profile(
                    activities=activities, on_trace_ready=export,
                    schedule=schedule(wait=1, warmup=1, active=1, repeat=1)) as prof:

                def on_window(index: int, window: Window) -> bool:
                    prof.step()
                    return True

                result = trainers.run(workload, config, steps=3 * steps, warmup=warmup,
                                      windows=3, device=dev, on_window=on_window)
        finally:
            workload.model.load_state_dict(saved)
        with open(trace_path, "rb") as f:
            raw = f.read()
    trace = _scrub(json.loads(raw))
    figures = analyze_trace(trace, steps=steps, cuda=cuda)
    if not cuda:
        total_steps = result.warmup_steps + result.steps
        sync_ms = result.sync_wait_ms / total_steps
        breakdown = figures["breakdown_ms"]
        figures["sync_ms_per_step"] = sync_ms
        breakdown["sync"] = min(sync_ms, breakdown["host"])
        breakdown["host"] -= breakdown["sync"]
    return Profile(
        config=config.to_dict(),
        device=str(dev),
        cuda_activity=cuda,
        steps=steps,
        step_ms=figures["step_ms"],
        unprofiled_step_ms=result.windows[0].step_ms if result.windows else None,
        gpu_busy_fraction=figures["gpu_busy_fraction"],
        launch_ms_per_step=figures["launch_ms_per_step"],
        h2d_ms_per_step=figures["h2d_ms_per_step"],
        h2d_overlap_fraction=figures["h2d_overlap_fraction"],
        h2d_exposed_ms_per_step=figures["h2d_exposed_ms_per_step"],
        sync_ms_per_step=figures["sync_ms_per_step"],
        kernels_per_step=figures["kernels_per_step"],
        ops_per_step=figures["ops_per_step"],
        breakdown_ms=figures["breakdown_ms"],
        note=None if cuda else CPU_NOTE,
        seconds=time.perf_counter() - started,
        trace_gz=gzip.compress(json.dumps(trace, separators=(",", ":")).encode(), mtime=0),
    )


@contextlib.contextmanager
def _kineto_quiet() -> Iterator[None]:
    """Drop the `USDT:`/`STAGE:` lines kineto writes straight to fd 2 when a trace starts and
    stops (whatever KINETO_LOG_LEVEL says): `run --json` keeps an empty stderr. Anything else
    written to stderr meanwhile is passed on when the block ends."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2: nothing to keep clean
        yield
        return
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True)
                    if not _KINETO_LINE.match(line)]
            if kept:
                os.write(2, b"".join(kept))


def _scrub(trace: dict[str, Any]) -> dict[str, Any]:
    """No host name and no temporary path in a stored trace (fingerprints carry no hostname)."""
    trace.pop("host_name", None)
    trace.pop("traceName", None)
    return trace


# --------------------------------------------------------------------------------------------
# verdict and explanation
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True, frozen=True)
class Verdict:
    kind: str
    explanation: str
    figures: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Verdict:
        return cls(kind=values["kind"], explanation=values["explanation"],
                   figures=dict(values.get("figures", {})))


def _pct(fraction: float) -> str:
    return f"{round(fraction * 100)} %"


def verdict(prof: Profile | Mapping[str, Any]) -> Verdict:
    """What bounds the profiled step; the checks and their order are in the module doc."""
    p = prof if isinstance(prof, Profile) else Profile.from_attrs(prof)
    step_ms = p.step_ms
    figures: dict[str, Any] = {"step_ms": step_ms, "cuda_activity": p.cuda_activity,
                               "sync_fraction": p.sync_ms_per_step / step_ms if step_ms else None}
    if not p.cuda_activity or p.gpu_busy_fraction is None:
        reason = p.note or CPU_NOTE
        return Verdict(kind="unknown", explanation=f"unknown: {reason}", figures=figures)
    # The profiler slows the host (every op and launch is recorded), not the kernels: GPU time
    # is taken over the step as it runs unprofiled (see the module doc).
    base_ms = p.unprofiled_step_ms if p.unprofiled_step_ms else step_ms
    busy = min(1.0, p.gpu_busy_fraction * step_ms / base_ms)
    sync = p.sync_ms_per_step / step_ms
    exposed = min(1.0, (p.h2d_exposed_ms_per_step or 0.0) / base_ms)
    figures |= {
        "gpu_busy_fraction": busy,
        "gpu_busy_fraction_profiled": p.gpu_busy_fraction,
        "unprofiled_step_ms": p.unprofiled_step_ms,
        "gpu_idle_fraction": 1.0 - busy,
        "h2d_exposed_fraction": exposed,
        "h2d_overlap_fraction": p.h2d_overlap_fraction,
        "launch_ms_per_step": p.launch_ms_per_step,
        "kernels_per_step": p.kernels_per_step,
    }
    if exposed > TRANSFER_BOUND_FRACTION:
        return Verdict(kind="transfer-bound", figures=figures, explanation=(
            f"transfer-bound: host-to-device copies not overlapped with compute take "
            f"{_pct(exposed)} of the step"))
    if sync > SYNC_BOUND_FRACTION and busy < GPU_SATURATED_FRACTION:
        return Verdict(kind="sync-bound", figures=figures, explanation=(
            f"sync-bound: host blocked in syncs {_pct(sync)} of the step while the GPU idled "
            f"{_pct(1.0 - busy)}"))
    if busy < HOST_BOUND_BUSY:
        return Verdict(kind="host-bound", figures=figures,
                       explanation=f"host-bound: GPU idle {_pct(1.0 - busy)} of the step")
    return Verdict(kind="gpu-bound", figures=figures,
                   explanation=f"gpu-bound: GPU busy {_pct(busy)} of the step")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _every(n: int) -> str:
    return "every step" if n == 1 else f"every {n} steps"


def _changes(config: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, str]:
    """What `config` changes against `base`, field -> a few words."""
    out: dict[str, str] = {}
    for field in trainers.field_names():
        new, old = config.get(field), base.get(field)
        if new == old or new is None:
            continue
        if field == "cuda_graph":
            out[field] = "whole-step CUDA graph" if new else "no CUDA graph"
        elif field == "num_streams":
            out[field] = f"{_plural(new, 'stream')} instead of {old}"
        elif field == "sync_interval":
            out[field] = f"syncing {_every(int(new))} instead of {_every(int(old or 1))}"
        elif field == "sync_mode":
            out[field] = f"{new} syncs instead of {old}"
        elif field == "prefetch_depth":
            out[field] = f"prefetching {_plural(new, 'batch')}" if new else "no prefetch"
            out[field] = out[field].replace("batchs", "batches")
        elif field == "pin_memory":
            out[field] = "pinned batches" if new else "unpinned batches"
        elif field == "non_blocking":
            out[field] = "non-blocking copies" if new else "blocking copies"
        elif field == "num_workers":
            out[field] = f"{_plural(new, 'DataLoader worker')}" if new else "no DataLoader workers"
        else:  # a field added to LoopConfig later
            out[field] = f"{field}={new}"
    return out


# For each verdict kind: the settings that act on that bottleneck, what they did, in order.
_EFFECTS: dict[str, list[tuple[str, str, Any]]] = {
    "host-bound": [("cuda_graph", "removed the launch overhead", True),
                   ("sync_interval", "let the host queue work ahead of the GPU", None),
                   ("sync_mode", "let the host queue work ahead of the GPU", "query")],
    "sync-bound": [("sync_interval", "removed most of the host's waits", None),
                   ("sync_mode", "removed the host's waits", "query"),
                   ("cuda_graph", "removed the launch overhead", True)],
    # Busy most of the step, the GPU still idles between kernels; only the graph closes those
    # gaps (H100, transformer large: busy 76 % eager, 97 % as one graph, 1.26x).
    "gpu-bound": [("cuda_graph", "closed the GPU's idle gaps between kernels", True)],
    "transfer-bound": [(field, "overlapped the copies with compute", None) for field in (
        "prefetch_depth", "pin_memory", "non_blocking", "num_streams", "num_workers")],
}


def _ratio(value: float) -> str:
    return f"{value:.2f}" if value < 2 else f"{value:.1f}"


def speedup_text(entry: Mapping[str, Any]) -> str:
    """`6.4x (CI 6.2-6.6)` from a recommendation's `speedup` entry."""
    low, high = entry["ci95"]
    return f"{_ratio(entry['median'])}x (CI {_ratio(low)}-{_ratio(high)})"


def _config_of(rec: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    for entry in rec.get("final_round", []):
        if entry.get("name") == name:
            return dict(entry["config"])
    return None


def explain(recommendation: Mapping[str, Any], verdicts: Mapping[str, Verdict],
            *, baseline: str | None = None) -> str:
    """One line: the baseline's verdict, what the recommended config changed, its speedup.

    "host-bound: GPU idle 83 % of the step; whole-step CUDA graph removed the launch overhead:
    6.4x (CI 6.2-6.6) over seed-baseline". The baseline is `seed-baseline` when it was measured
    and profiled, else `pytorch-default`, else the first one with a speedup. When the
    recommended config's own verdict is in `verdicts` (key "recommended") and differs, it is added
    ("; now gpu-bound: GPU busy 96 % of the step").
    """
    speedups: Mapping[str, Any] = recommendation.get("speedup") or {}
    if baseline is None:
        candidates = [n for n in ("seed-baseline", "pytorch-default", *speedups)
                      if n in speedups or n in verdicts]
        baseline = next((n for n in candidates if n in speedups and n in verdicts),
                        candidates[0] if candidates else None)
    head = verdicts[baseline].explanation if baseline is not None and baseline in verdicts else (
        None)
    config = recommendation.get("config")
    if config is None:
        text = f"no recommendation: {recommendation.get('reason', 'none was decided')}"
        return f"{head} ({baseline}); {text}" if head else text
    if baseline is None:
        return "recommended config measured without baselines"

    base_config = _config_of(recommendation, baseline)
    if base_config is None and baseline == "pytorch-default":
        base_config = trainers.REFERENCE.to_dict()
    changes = _changes(config, base_config or config)
    kind = verdicts[baseline].kind if baseline in verdicts else "unknown"
    main, effect = None, ""
    for field, words, when in _EFFECTS.get(kind, []):
        if field in changes and (when is None or config.get(field) == when):
            main, effect = field, words
            break
    if recommendation.get("source") == baseline or not changes:
        what = f"keeping {baseline}'s settings"
    elif recommendation.get("source") == "pytorch-default":
        what = "the PyTorch default (change nothing)"
    else:
        ordered = ([main] if main else []) + [f for f in changes if f != main]
        what = changes[ordered[0]] + (f" {effect}" if effect else "")
        if len(ordered) > 1:
            what += " (also " + ", ".join(changes[f] for f in ordered[1:]) + ")"
    line = f"{head}; {what}" if head else what
    if baseline in speedups:
        line += f": {speedup_text(speedups[baseline])} over {baseline}"
    now = verdicts.get(RECOMMENDED)
    if now is not None and now.kind not in (kind, "unknown"):
        line += f"; now {now.explanation}"
    return line


# --------------------------------------------------------------------------------------------
# storing: figures as user attributes, the trace as an Optuna artifact
# --------------------------------------------------------------------------------------------


def artifact_dir(storage_url: str, explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where traces go: `explicit`, else $TUNER_ARTIFACTS, else beside an SQLite database file
    (`sqlite:///tuner.db` -> `tuner-artifacts/`). Another storage needs one of the first two."""
    chosen = explicit or os.environ.get(ARTIFACTS_ENV)
    if chosen:
        return Path(chosen)
    try:
        url = sqlalchemy.engine.make_url(storage_url)
    except sqlalchemy.exc.ArgumentError as exc:
        raise TunerError(f"--storage: {storage_url!r} is not a database URL") from exc
    database = url.database
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:" or (
            database.startswith("file:")):
        raise TunerError(
            f"--artifacts: traces of {url.get_backend_name()} storage {storage_url!r} need a "
            f"directory: pass --artifacts DIR or set {ARTIFACTS_ENV}")
    path = Path(database)
    return path.with_name(f"{path.stem}-artifacts")


def trace_dir(storage_url: str, explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """`artifact_dir`, or None where it cannot be placed (another storage and no --artifacts nor
    $TUNER_ARTIFACTS): the figures are stored then, the traces are not."""
    try:
        return artifact_dir(storage_url, explicit)
    except TunerError:
        return None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "profile"


def store_profile(study_or_trial: optuna.Study | optuna.Trial | optuna.trial.FrozenTrial,
                  prof: Profile, artifact_dir: str | os.PathLike[str] | None, *,
                  name: str | None = None) -> str | None:
    """Store `prof`: its trace as an artifact, its figures and verdict as a user attribute.

    On a Study: attribute `profile/<name>` (`name` required: a baseline's name or "recommended").
    On a running Trial: attribute `profile`. A FrozenTrial cannot take an artifact once it has
    finished (Optuna 5.0), so it is refused. The trace goes to a `FileSystemArtifactStore` in
    `artifact_dir`; with `artifact_dir=None` only the figures are stored. Returns the artifact id
    (None when no trace was stored).
    """
    if isinstance(study_or_trial, optuna.trial.FrozenTrial):
        raise TypeError("store_profile needs the running optuna.Trial or the Study: a finished "
                        "(frozen) trial cannot take artifacts")
    if isinstance(study_or_trial, optuna.Study):
        if not name:
            raise ValueError("store_profile on a Study needs name= (a baseline or 'recommended')")
        key = f"{STUDY_PREFIX}{name}"
    else:
        name = name or f"trial-{study_or_trial.number}"
        key = TRIAL_ATTR
    attrs = prof.to_attrs() | {"verdict": verdict(prof).to_dict(), "artifact_id": None,
                               "artifact_file": None}
    if prof.trace_gz is not None and artifact_dir is not None:
        directory = Path(artifact_dir)
        directory.mkdir(parents=True, exist_ok=True)
        store = optuna.artifacts.FileSystemArtifactStore(str(directory))
        filename = f"{_safe(name)}.trace.json.gz"
        with tempfile.TemporaryDirectory(prefix="streamtune-trace-") as tmp:
            path = os.path.join(tmp, filename)
            with open(path, "wb") as f:
                f.write(prof.trace_gz)
            attrs["artifact_id"] = optuna.artifacts.upload_artifact(
                artifact_store=store, file_path=path, study_or_trial=study_or_trial,
                mimetype="application/json", encoding="gzip")
        attrs["artifact_file"] = filename
    study_or_trial.set_user_attr(key, attrs)
    return attrs["artifact_id"]


def load_trace(artifact_dir: str | os.PathLike[str], artifact_id: str) -> dict[str, Any]:
    """A stored trace, downloaded, decompressed and parsed."""
    store = optuna.artifacts.FileSystemArtifactStore(str(artifact_dir))
    with tempfile.TemporaryDirectory(prefix="streamtune-trace-") as tmp:
        path = os.path.join(tmp, "trace.json.gz")
        optuna.artifacts.download_artifact(artifact_store=store, file_path=path,
                                           artifact_id=artifact_id)
        with gzip.open(path, "rb") as f:
            return dict(json.loads(f.read()))


def study_profiles(study: optuna.Study) -> dict[str, dict[str, Any]]:
    """`profile/<name>` attributes of the study, by name (those that hold figures)."""
    return profiles_in(study.user_attrs)


def profiles_in(user_attrs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`profile/<name>` entries of a study's user attributes that hold figures, by name."""
    return {k[len(STUDY_PREFIX):]: v for k, v in user_attrs.items()
            if k.startswith(STUDY_PREFIX) and isinstance(v, dict) and "step_ms" in v}


def stored_verdicts(profiles: Mapping[str, Mapping[str, Any]]) -> dict[str, Verdict]:
    return {name: verdict(attrs) for name, attrs in profiles.items()}


def reread(recommendation: Mapping[str, Any],
           user_attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The recommendation with its verdicts and explanation derived again from the profile
    figures stored in the study, under this code's rules.

    The figures are the measurement; the verdicts and the sentence are their reading, which the
    code may improve (it did twice: GPU time over the unprofiled step, and what a gpu-bound
    baseline credits). A study without stored profiles is returned as it was.
    """
    profiles = profiles_in(user_attrs)
    if not profiles or recommendation.get("config") is None:
        return dict(recommendation)
    verdicts = stored_verdicts(profiles)
    return {**recommendation, "verdicts": {name: v.to_dict() for name, v in verdicts.items()},
            "explanation": explain(recommendation, verdicts)}


# --------------------------------------------------------------------------------------------
# what the search calls (see the wiring in the report of this change)
# --------------------------------------------------------------------------------------------


Profiler = Callable[[LoopConfig], Profile]


def in_process(workload: Workload, *, device: str | torch.device, steps: int = 10,
               warmup: int = 5) -> Profiler:
    """A profiler that profiles in this process (on a CPU; on a GPU the tuner profiles in a
    child process, `tuner.isolated.ProfileProcess`, since CUPTI outlasts the profile)."""
    return functools.partial(profile_config, workload, steps=steps, warmup=warmup, device=device)


def profile_trial(trial: optuna.Trial, config: LoopConfig, directory: Path | None,
                  profiler: Profiler) -> None:
    """`--profile all`: profile a trial's config and store it on the (running) trial. A failure
    is recorded as the attribute `profile_error`, never raised: the trial's measurement stands."""
    try:
        store_profile(trial, profiler(config), directory)
    except Exception as exc:  # noqa: BLE001 - a profile is evidence, not the trial's result
        trial.set_user_attr("profile_error", f"{type(exc).__name__}: {exc}"[:2000])


def profile_recommendation(study: optuna.Study, recommendation: Mapping[str, Any],
                           baselines: Mapping[str, LoopConfig], directory: Path | None,
                           profiler: Profiler) -> dict[str, Any]:
    """Profile the baselines and the recommended config, store them on the study, and return
    what to add to the recommendation: `verdicts` (name -> verdict) and `explanation`."""
    targets: dict[str, LoopConfig] = dict(baselines)
    if recommendation.get("config") is not None:
        targets[RECOMMENDED] = LoopConfig.from_dict(recommendation["config"])
    verdicts: dict[str, Verdict] = {}
    errors: dict[str, str] = {}
    for name, config in targets.items():
        try:
            prof = profiler(config)
        except Exception as exc:  # noqa: BLE001 - recorded; the recommendation stands
            errors[name] = f"{type(exc).__name__}: {exc}"[:2000]
            with contextlib.suppress(Exception):
                study.set_user_attr(f"{STUDY_PREFIX}{name}", {"error": errors[name]})
            continue
        store_profile(study, prof, directory, name=name)
        verdicts[name] = verdict(prof)
    return {
        "verdicts": {name: v.to_dict() for name, v in verdicts.items()},
        "explanation": explain(recommendation, verdicts),
        "profile_errors": errors,
    }
