"""Measurement, the same for every workload and setting: timed windows, `RunResult`, fingerprint."""

from __future__ import annotations

import dataclasses
import functools
import platform
import subprocess
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from trainers.errors import ConfigError
from trainers.flops import Utilisation, utilisation
from trainers.streams import StreamPlan


@dataclasses.dataclass(kw_only=True, slots=True)
class Window:
    steps: int
    wall_ms: float
    gpu_ms: float | None

    @property
    def step_ms(self) -> float:
        return self.wall_ms / self.steps

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "wall_ms": self.wall_ms,
            "gpu_ms": self.gpu_ms,
            "step_ms": self.step_ms,
        }


class WindowTimer:
    """Wall time of a window of steps, with the device idle at both ends (nothing queued before
    the start is counted, everything queued inside is), plus the same span in CUDA events."""

    def __init__(self, device: torch.device, plan: StreamPlan) -> None:
        self.device = device
        self.plan = plan
        self._cuda = device.type == "cuda"
        self._start = 0.0
        self._start_event: torch.cuda.Event | None = None

    def start(self) -> None:
        if self._cuda:
            # Device sync: the window starts with nothing of the previous window still running.
            torch.cuda.synchronize(self.device)
            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record()
        self._start = time.perf_counter()

    def stop(self, steps: int) -> Window:
        gpu_ms = None
        if self._cuda:
            current = torch.cuda.current_stream(self.device)
            for stream in self.plan.all_streams():
                # The end event must come after the work of every stream the loop used.
                current.wait_stream(stream)
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            # Device sync: every step of the window has finished before the clock is read.
            torch.cuda.synchronize(self.device)
            assert self._start_event is not None
            gpu_ms = self._start_event.elapsed_time(end)
        wall_ms = (time.perf_counter() - self._start) * 1e3
        return Window(steps=steps, wall_ms=wall_ms, gpu_ms=gpu_ms)


def check_counts(*, steps: int, warmup: int, windows: int) -> None:
    """ConfigError naming the count unless `warmup` untimed steps, then `steps` timed steps in
    `windows` windows, make a measurement: the one check of these arguments, for a built-in run
    (`trainers.run`) and a program's (`trainers.program.run_program`) alike."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError("steps", steps, "an integer >= 1")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError("warmup", warmup, "an integer >= 0")
    if isinstance(windows, bool) or not isinstance(windows, int) or not 1 <= windows <= steps:
        raise ConfigError("windows", windows, f"an integer in 1..steps ({steps})")


def window_sizes(steps: int, windows: int) -> list[int]:
    """Split `steps` into `windows` nearly equal windows (the first ones one step longer)."""
    base, extra = divmod(steps, windows)
    return [base + (1 if i < extra else 0) for i in range(windows)]


def step_time_summary(windows: Sequence[Window]) -> dict[str, float]:
    times = np.array([w.step_ms for w in windows], dtype=float)
    return {
        "median": float(np.median(times)),
        "p10": float(np.percentile(times, 10)),
        "p90": float(np.percentile(times, 90)),
    }


@functools.cache
def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


@functools.cache
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint(device: torch.device) -> dict[str, Any]:
    """What a measurement holds for: the GPU, its software stack and the host CPU (no hostname)."""
    info: dict[str, Any] = {
        "device_type": device.type,
        "gpu": None,
        "compute_capability": None,
        "driver": None,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": _cpu_model(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["compute_capability"] = f"{props.major}.{props.minor}"
        info["driver"] = _driver_version()
    return info


def fingerprint_key(fp: dict[str, Any]) -> str:
    """A short readable hardware key, such as 'NVIDIA-H100-80GB-HBM3' or 'cpu'."""
    if fp.get("gpu"):
        return str(fp["gpu"]).replace(" ", "-")
    return "cpu"


@dataclasses.dataclass(kw_only=True)
class RunResult:
    """One measured run. `to_dict()` is what `python -m tuner train --json` prints.

    `peak_memory_bytes` (CUDA only) is the model's parameters and buffers plus the most memory
    the run allocated on top of what was allocated when it started. Memory that earlier runs in
    the same process left allocated is not counted: measured on an H100, it grew by about four
    times the parameter size per run, and would have made later configs look hungrier.

    `precision` is what the run was asked for (`trainers.precision`; None: the process's float32
    matmul precision, recorded in `matmul_precision`, and no autocast).

    Compilation (configs with `compile` other than "none" or `optimizer="compiled"`; zero or None
    otherwise): `compile_s` is the wall time of the warm-up steps in which Dynamo compiled, beyond
    a normal step (the median of the windows), each timed with a device sync at both ends; it
    does not include CUDA-graph capture. `recompiles` counts graphs compiled after the first
    step that compiled; `graph_breaks` the graph breaks met while tracing (a compiled
    torch.optim optimizer has one by design). `compile_unstable` is True when a graph was
    compiled or a graph break met during the timed windows, whose times then include
    compilation; `compile_notes` says which. `compile_cache_hits` / `compile_cache_misses` count
    Inductor's FX-graph cache lookups (TORCHINDUCTOR_CACHE_DIR). A run that kept the compiled
    code of the process's last compiling run (`trainers.compilation.reuse_key`) compiles nothing:
    its `compile_s` is 0 and `compile_kept_s` what that code cost.
    """

    config: dict[str, Any]
    workload: str
    preset: str
    device: str
    effective: dict[str, Any]
    warmup_steps: int
    steps: int
    stopped_early: bool
    losses: list[float]
    loss_check: dict[str, Any]
    n_syncs: int
    n_polls: int
    sync_wait_ms: float
    windows: list[Window]
    samples_per_batch: int
    tokens_per_sample: int | None
    peak_memory_bytes: int | None
    fingerprint: dict[str, Any]
    matmul_precision: str = "highest"
    precision: str | None = None
    compile_s: float = 0.0
    recompiles: int = 0
    graph_breaks: int = 0
    compile_unstable: bool = False
    compile_notes: list[str] = dataclasses.field(default_factory=list)
    compile_cache_hits: int | None = None
    compile_cache_misses: int | None = None
    compile_kept_s: float = 0.0
    """Where the run kept the compiled code of the process's previous run of the same model
    build and arithmetic (`trainers.compilation.reuse_key`; its `compile_s` then 0): what that
    code cost to compile, which a run in a fresh process pays."""
    flops_per_step: int | None = None
    """The model's FLOPs in one optimizer step (forward + backward, recomputation not counted;
    `trainers.flops`); None where they were not counted."""
    float8: dict[str, Any] | None = None
    """Precision float8 only (`trainers.float8.Float8Report.to_dict`): how many linears were
    converted, which stayed in bf16 and why, and the share of the step's FLOPs converted."""

    @property
    def step_time_ms(self) -> dict[str, float]:
        return step_time_summary(self.windows)

    @property
    def utilisation(self) -> Utilisation:
        """Achieved model TFLOP/s and MFU at the median step time (MFU: None on a CPU or an
        unknown GPU, with the reason in `.note`)."""
        return utilisation(
            self.flops_per_step,
            self.step_time_ms["median"],
            gpu_name=self.fingerprint.get("gpu"),
            precision=self.precision,
            matmul_precision=self.matmul_precision,
        )

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_batch / (self.step_time_ms["median"] / 1e3)

    @property
    def tokens_per_s(self) -> float | None:
        if self.tokens_per_sample is None:
            return None
        return self.samples_per_s * self.tokens_per_sample

    def window_throughputs(self) -> list[float]:
        """Samples per second of each window: the samples a tuner's statistics work on."""
        return [self.samples_per_batch / (w.step_ms / 1e3) for w in self.windows]

    def to_dict(self) -> dict[str, Any]:
        use = self.utilisation
        return {
            "config": self.config,
            "workload": self.workload,
            "preset": self.preset,
            "device": self.device,
            "effective": self.effective,
            "warmup_steps": self.warmup_steps,
            "steps": self.steps,
            "stopped_early": self.stopped_early,
            "losses": self.losses,
            "loss_check": self.loss_check,
            "n_syncs": self.n_syncs,
            "n_polls": self.n_polls,
            "sync_wait_ms": self.sync_wait_ms,
            "windows": [w.to_dict() for w in self.windows],
            "step_time_ms": self.step_time_ms,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "fingerprint": self.fingerprint,
            "matmul_precision": self.matmul_precision,
            "precision": self.precision,
            "compile_s": self.compile_s,
            "recompiles": self.recompiles,
            "graph_breaks": self.graph_breaks,
            "compile_unstable": self.compile_unstable,
            "compile_notes": self.compile_notes,
            "compile_cache_hits": self.compile_cache_hits,
            "compile_cache_misses": self.compile_cache_misses,
            "compile_kept_s": self.compile_kept_s,
            "flops_per_step": self.flops_per_step,
            "tflops": use.tflops,
            "mfu": use.mfu,
            "peak_tflops": use.peak_tflops,
            "mfu_note": use.note,
            "float8": self.float8,
        }
