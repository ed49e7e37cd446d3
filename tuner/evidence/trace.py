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
- `comm_ms_per_step`, `comm_exposed_ms_per_step`, `comm_exposed_fraction`, `comm_kind`: NCCL's
  kernels (a data-parallel run), and the share of their time no compute kernel ran beside
  (`tuner.evidence.comm`); None without communication;
- `sync_ms_per_step`: host time blocked in `cudaStreamSynchronize`, `cudaEventSynchronize` and
  `cudaDeviceSynchronize`, without the window's own two device syncs (the first and the last
  `cudaDeviceSynchronize` of the window: the measurement's, not the loop's). On a CPU: the
  RunResult's `sync_wait_ms` per step;
- `kernels_per_step`; `ops_per_step` (operator events the profiler recorded on the host);
- `breakdown_ms`: the window split into disjoint parts that add up to `step_ms` (see BREAKDOWN):
  on a GPU kernels / exposed H2D copies / other copies and memsets / GPU idle with the host in a
  sync / GPU idle with the host busy; on a CPU data loading / optimizer step / the rest / sync;
- `seconds`: wall time of the whole profiled run (device time, for accounting); `phases`: where
  those seconds went (`build`: the workload, in a child that had none; `compile`: the warm-up
  steps that compiled; `run`: the rest of the run, the trace's export included; `trace`: reading
  and scoring it).

kineto prints `USDT:`/`STAGE:` lines straight to fd 2 whenever a trace starts or stops; they are
dropped (anything else written to stderr meanwhile is passed on), so `run --json` stays quiet.

The verdict drawn from these figures is `tuner.evidence.verdicts`; storing them on a study is
`tuner.evidence.profiles`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule

import trainers
from trainers import LoopConfig, Window, Workload
from tuner.evidence.comm import communication
from tuner.evidence.intervals import Interval, intersect, merge, subtract, total

CPU_NOTE = "profiled without CUDA activity (CPU run): GPU figures are not available"


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


# --------------------------------------------------------------------------------------------
# the trace -> figures
# --------------------------------------------------------------------------------------------


def _complete_events(trace: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        e
        for e in trace.get("traceEvents", [])
        if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e
    ]


def _span(event: Mapping[str, Any]) -> Interval:
    start = float(event["ts"])
    return start, start + float(event["dur"])


def step_region(trace: Mapping[str, Any]) -> Interval:
    """The recorded window: the last host `ProfilerStep#N` annotation, else all events."""
    events = _complete_events(trace)
    marks = [
        _span(e)
        for e in events
        if e.get("cat") in ("user_annotation", "cpu_op")
        and _STEP_MARK.match(str(e.get("name", "")))
    ]
    if marks:
        return max(marks)
    spans = [_span(e) for e in events]
    if not spans:
        raise ValueError("the trace holds no complete events")
    return min(s for s, _ in spans), max(e for _, e in spans)


def analyze_trace(
    trace: Mapping[str, Any], *, steps: int, cuda: bool, window_syncs: bool = True
) -> dict[str, Any]:
    """The profile's figures from a kineto Chrome trace of `steps` loop steps (see the module doc).

    `window_syncs`: the first and last `cudaDeviceSynchronize` of the region are the measurement
    window's own syncs and are left out of the sync time.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    region = step_region(trace)
    r0, r1 = region
    if r1 - r0 <= 0:
        raise ValueError("the profiled region is empty")
    inside = [e for e in _complete_events(trace) if _span(e)[1] > r0 and _span(e)[0] < r1]
    ops = [e for e in inside if e.get("cat") == "cpu_op"]
    figures: dict[str, Any] = {
        "step_ms": (r1 - r0) / steps / 1e3,
        "ops_per_step": len(ops) / steps,
        "cuda_activity": cuda,
    }
    if not cuda:
        return figures | _host_figures(inside, region, steps)
    return figures | _device_figures(inside, region, steps, window_syncs)


def _clipped(events: Iterable[Mapping[str, Any]], region: Interval) -> list[Interval]:
    """The events' spans, merged and clipped to the region."""
    return intersect(merge(_span(e) for e in events), [region])


def _host_figures(inside: list[dict[str, Any]], region: Interval, steps: int) -> dict[str, Any]:
    """A CPU run's figures: the region split into data loading, the optimizer and the rest."""
    length = region[1] - region[0]
    marks = [e for e in inside if e.get("cat") == "user_annotation"]
    data = _clipped((e for e in marks if str(e.get("name", "")).startswith(DATA_MARK)), region)
    optimizer = subtract(
        _clipped((e for e in marks if str(e.get("name", "")).startswith(OPTIMIZER_MARK)), region),
        data,
    )
    parts_us = {"data": total(data), "optimizer": total(optimizer)}
    parts_us["host"] = max(0.0, length - sum(parts_us.values()))
    return {
        "gpu_busy_fraction": None,
        "launch_ms_per_step": None,
        "h2d_ms_per_step": None,
        "h2d_overlap_fraction": None,
        "h2d_exposed_ms_per_step": None,
        "kernels_per_step": None,
        "sync_ms_per_step": 0.0,
        "breakdown_ms": {k: v / steps / 1e3 for k, v in parts_us.items()} | {"sync": 0.0},
    }


def _host_syncs(inside: list[dict[str, Any]], window_syncs: bool) -> list[dict[str, Any]]:
    """The host's sync calls in the region, less the window's own first and last device sync."""
    runtime = [e for e in inside if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    syncs = sorted((e for e in runtime if e.get("name") in SYNC_CALLS), key=lambda e: e["ts"])
    if window_syncs:
        device_syncs = [e for e in syncs if e.get("name") == WINDOW_SYNC]
        edges = {id(e) for e in device_syncs[:1] + device_syncs[-1:]}
        syncs = [e for e in syncs if id(e) not in edges]
    return syncs


def _device_figures(
    inside: list[dict[str, Any]], region: Interval, steps: int, window_syncs: bool
) -> dict[str, Any]:
    """A GPU run's figures: kernels, copies, launches and syncs, and the disjoint breakdown."""
    length = region[1] - region[0]
    kernel_events = [e for e in inside if e.get("cat") == "kernel"]
    copies = [e for e in inside if e.get("cat") == "gpu_memcpy"]
    h2d_events = [e for e in copies if "HtoD" in str(e.get("name", ""))]
    other_events = [e for e in copies if "HtoD" not in str(e.get("name", ""))] + [
        e for e in inside if e.get("cat") == "gpu_memset"
    ]
    runtime = [e for e in inside if e.get("cat") in ("cuda_runtime", "cuda_driver")]
    launches = [e for e in runtime if str(e.get("name", "")).startswith(LAUNCH_CALLS)]
    syncs = _host_syncs(inside, window_syncs)

    kernels = _clipped(kernel_events, region)
    h2d = _clipped(h2d_events, region)
    h2d_exposed = subtract(h2d, kernels)
    gpu_copy_busy = merge([*kernels, *h2d])
    other = subtract(_clipped(other_events, region), gpu_copy_busy)
    busy = merge([*gpu_copy_busy, *other])
    # Host sync time: the calls' own durations (one host thread cannot be in two calls at once).
    sync_us = sum(total(intersect([_span(e)], [region])) for e in syncs)
    idle_sync = subtract(_clipped(syncs, region), busy)
    h2d_us = total(h2d)
    parts_us = {
        "kernels": total(kernels),
        "h2d_exposed": total(h2d_exposed),
        "other_gpu": total(other),
        "idle_sync": total(idle_sync),
    }
    parts_us["idle_host"] = max(0.0, length - sum(parts_us.values()))
    return {
        "gpu_busy_fraction": total(kernels) / length,
        "launch_ms_per_step": sum(float(e["dur"]) for e in launches) / steps / 1e3,
        "h2d_ms_per_step": h2d_us / steps / 1e3,
        "h2d_overlap_fraction": None if h2d_us == 0 else 1.0 - total(h2d_exposed) / h2d_us,
        "h2d_exposed_ms_per_step": total(h2d_exposed) / steps / 1e3,
        "kernels_per_step": len(kernel_events) / steps,
        "sync_ms_per_step": sync_us / steps / 1e3,
        "breakdown_ms": {k: v / steps / 1e3 for k, v in parts_us.items()},
    } | communication(kernel_events, region, steps)


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
    comm_ms_per_step: float | None = None
    comm_exposed_ms_per_step: float | None = None
    comm_exposed_fraction: float | None = None
    comm_kind: str | None = None
    seconds: float = 0.0
    """Wall time of the whole profile (the study's accounting): the profiled run, the trace's
    reading and, in a child that had to, the workload's build (`phases`)."""
    phases: dict[str, float] | None = None
    """Seconds by part of `seconds` (module doc); None in a profile stored before they were."""
    compile_cache: dict[str, int] | None = None
    """Inductor's FX-graph cache lookups of the profiled run's compile, `{"hits": H, "misses":
    M}`; None where it compiled nothing. A profile in a child compiles a trial's config again and
    should hit what the trial wrote: at the Qwen2-style shape on one H200 (2026-12-04) the
    recommended config's profile compiled 131 s in the job and 57 s in a child started after a
    run of it in another process, and only these counts say which compile missed."""
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


def profile_config(
    workload: Workload,
    config: LoopConfig,
    *,
    steps: int = 10,
    warmup: int = 5,
    device: str | torch.device = "auto",
    precision: trainers.Precision | None = None,
) -> Profile:
    """Profile `steps` steps of `config` (after `warmup` and one unprofiled window of `steps`).

    The workload's model trains during the run, as with `trainers.run`; its weights are put back
    afterwards. Errors of the run (out of memory, capture) propagate.
    """
    if steps < 1:
        raise trainers.ConfigError("steps", steps, "an integer >= 1")
    dev = trainers.resolve_device(device)
    started = time.perf_counter()
    # Graph capture and compilation stay out of the recorded window.
    warmup = max(warmup, trainers.min_warmup(config))
    result, raw = _profiled_run(workload, config, steps, warmup, dev, precision)
    return profile_from_trace(raw, result, config, dev, steps=steps, started=started)


def _phases(result: trainers.RunResult, ran_s: float, total_s: float) -> dict[str, float]:
    """`Profile.phases` of a run that took `ran_s` of a profile's `total_s`: at 1B the
    recommended config's profile took 126 s in its child against 40 s for the same compile in
    the measuring process (2026-11-28), and only its parts say which part was the rest."""
    compiled = min(result.compile_s, ran_s)
    parts = {"compile": compiled, "run": ran_s - compiled, "trace": total_s - ran_s}
    return {name: round(max(0.0, seconds), 2) for name, seconds in parts.items()}


def _lookups(result: trainers.RunResult) -> dict[str, int] | None:
    """`Profile.compile_cache` of a run: its FX-graph cache hits and misses, where it looked."""
    hits, misses = result.compile_cache_hits or 0, result.compile_cache_misses or 0
    return {"hits": hits, "misses": misses} if hits + misses else None


def profile_from_trace(
    raw: bytes,
    result: trainers.RunResult,
    config: LoopConfig,
    dev: torch.device,
    *,
    steps: int,
    started: float,
) -> Profile:
    """The Profile of a run of three windows of `steps` whose third was recorded into the
    Chrome trace `raw` (this process's run, or rank 0's of a data-parallel launch:
    `tuner.search.deciding.dpprofile`); `started` is the perf_counter time the profiled run
    began."""
    cuda = dev.type == "cuda"
    ran_s = time.perf_counter() - started
    trace = _scrub(json.loads(raw))
    figures = analyze_trace(trace, steps=steps, cuda=cuda)
    if not cuda:
        total_steps = result.warmup_steps + result.steps
        sync_ms = result.sync_wait_ms / total_steps
        breakdown = figures["breakdown_ms"]
        figures["sync_ms_per_step"] = sync_ms
        breakdown["sync"] = min(sync_ms, breakdown["host"])
        breakdown["host"] -= breakdown["sync"]
    names = {f.name for f in dataclasses.fields(Profile)}
    return Profile(
        **{k: v for k, v in figures.items() if k in names and k != "cuda_activity"},
        config=config.to_dict(),
        device=str(dev),
        cuda_activity=cuda,
        steps=steps,
        unprofiled_step_ms=result.windows[0].step_ms if result.windows else None,
        note=None if cuda else CPU_NOTE,
        seconds=(seconds := time.perf_counter() - started),
        phases=_phases(result, ran_s, seconds),
        compile_cache=_lookups(result),
        trace_gz=gzip.compress(json.dumps(trace, separators=(",", ":")).encode(), mtime=0),
    )


def _profiled_run(
    workload: Workload,
    config: LoopConfig,
    steps: int,
    warmup: int,
    device: torch.device,
    precision: trainers.Precision | None,
) -> tuple[trainers.RunResult, bytes]:
    """Three windows of `steps` under the profiler, which records the second (wait one window,
    warm up over one, record one); the run's result and the Chrome trace it wrote."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    saved = {k: v.detach().clone() for k, v in workload.model.state_dict().items()}
    with tempfile.TemporaryDirectory(prefix="streamtune-profile-") as tmp:
        trace_path = os.path.join(tmp, "trace.json")

        def export(prof: profile) -> None:
            prof.export_chrome_trace(trace_path)

        try:
            with (
                _kineto_quiet(),
                profile(
                    activities=activities,
                    on_trace_ready=export,
                    schedule=schedule(wait=1, warmup=1, active=1, repeat=1),
                ) as prof,
            ):

                def on_window(index: int, window: Window) -> bool:
                    prof.step()
                    return True

                result = trainers.run(
                    workload,
                    config,
                    trainers.RunArgs(
                        steps=3 * steps,
                        warmup=warmup,
                        windows=3,
                        device=device,
                        precision=precision,
                    ),
                    on_window=on_window,
                )
        finally:
            workload.model.load_state_dict(saved)
        with open(trace_path, "rb") as f:
            return result, f.read()


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
            kept = [
                line
                for line in captured.read().splitlines(keepends=True)
                if not _KINETO_LINE.match(line)
            ]
            if kept:
                os.write(2, b"".join(kept))


def _scrub(trace: dict[str, Any]) -> dict[str, Any]:
    """No host name and no temporary path in a stored trace (fingerprints carry no hostname)."""
    trace.pop("host_name", None)
    trace.pop("traceName", None)
    return trace
