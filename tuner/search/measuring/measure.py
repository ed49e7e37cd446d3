"""Measuring one config for the tuner: a short real training run, turned into window throughputs.

Every measurement of a study uses the same protocol (`Protocol`): `warmup` untimed steps, then
`windows` timed windows of `window_steps` steps each, with a device sync at both ends of each
window. A sync interval longer than a window is therefore capped by the window's own sync; the
defaults (20-step windows) keep that cap above the intervals that matter (GPU-FACTS: the gain of
deferred syncs is reached by an interval of 10).

A failure (out of memory, a CUDA error, a step that cannot be captured) becomes a `Failure` with
its reason, never an exception that ends the study.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import re
import statistics
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

import trainers
from trainers import LoopConfig, RunArgs, RunResult, Window, Workload
from trainers.gate import floor_applies
from trainers.program import PREFIX as PROGRAM_PREFIX
from trainers.program import (
    Program,
    ProgramStopped,
    find_program,
    run_distributed,
    run_program,
)
from tuner.errors import users_frame

# The protocol is the request's word, one layer down: named here for the code that reads it with
# the measurement.
from tuner.search.protocol import Protocol as Protocol

# The search tries up to 4 workers on any machine; the DataLoader's advice against it is noise here.
warnings.filterwarnings("ignore", message="This DataLoader will create")

PRECISIONS = trainers.MATMUL_PRECISIONS
"""torch.set_float32_matmul_precision values (owned by `trainers.precision`)."""
set_matmul_precision = trainers.set_matmul_precision
"""The one setter of the process's matmul precision, `trainers.set_matmul_precision`; named here
for the modules that import it from the measurement."""


@dataclasses.dataclass(kw_only=True, frozen=True)
class Measured:
    """What one run of one config gave. `throughputs` are samples/s, one per timed window."""

    throughputs: tuple[float, ...]
    step_ms: float
    peak_memory_bytes: int | None
    n_syncs: int
    sync_wait_ms: float
    seconds: float
    stopped_early: bool
    compile: dict[str, Any] | None = None
    """compile_s, recompiles, graph_breaks, unstable, cache hits and misses: a compiled run's
    one-off cost and whether the timed windows were clean (None for an uncompiled config)."""
    tflops: float | None = None
    """Achieved model TFLOP/s at the median step (`trainers.flops`; None without a count)."""
    mfu: float | None = None
    """Model FLOP utilisation, 0..1 (None on a CPU, an unknown GPU or without a count)."""
    first_nonfinite: int | None = None
    """The first of the run's read losses that was NaN or infinite (its index), or None."""

    @property
    def median(self) -> float:
        return statistics.median(self.throughputs)

    def to_attrs(self) -> dict[str, Any]:
        return {
            "windows": list(self.throughputs),
            "median": self.median,
            "step_ms": self.step_ms,
            "peak_memory_bytes": self.peak_memory_bytes,
            "n_syncs": self.n_syncs,
            "sync_wait_ms": self.sync_wait_ms,
            "seconds": self.seconds,
            "tflops": self.tflops,
            "mfu": self.mfu,
        } | ({} if self.compile is None else {"compile": dict(self.compile)})


@dataclasses.dataclass(kw_only=True, frozen=True)
class Failure:
    reason: str
    kind: str  # "oom", "cuda", "capture", "config", "workload", "error", "stopped"
    seconds: float
    # Raised in this process by a run of the built workload (not by a launch of others, whose
    # failure can be the launch's own, as a DDP twin's unused parameters are).
    in_process: bool = False


class Measurer:
    """Runs configs of one workload and preset on one device.

    The workload is built once; each run starts from the same initial weights (restored with
    load_state_dict), so runs differ only by their config.
    """

    def __init__(
        self,
        workload: str,
        preset: str,
        *,
        device: str | torch.device,
        protocol: Protocol,
        model_args: Mapping[str, str] | None = None,
        precision: trainers.Precision | None = None,
        nproc: int = 1,
    ) -> None:
        self.workload_name = workload
        # Above 1, each measurement is a torchrun launch of `nproc` processes
        # (`trainers.program.run_distributed`); the workload is still built here, for its checks.
        self.nproc = nproc
        self.preset = preset
        self.model_args = dict(model_args or {})
        # The study's (it changes the results); None: fp32, or --matmul-precision's setting. A
        # study searching precisions names another per run (`measure(..., precision=...)`).
        self.precision = precision
        self.device = trainers.resolve_device(device)
        self.protocol = protocol
        self._workload: Workload | None = None
        self._initial: dict[str, torch.Tensor] = {}
        # A registered program (`program:NAME`, trainers/program/) runs in its own process per
        # measurement; everything else is a Workload built here.
        self.program: Program | None = (
            find_program(workload) if workload.startswith(PROGRAM_PREFIX) else None
        )
        self._samples_per_batch: int | None = None
        self._others: dict[str, Measurer] = {}
        # What MFU is computed from, taken from the last complete run in each precision (the
        # FLOPs of a step do not depend on the config: recomputation is not counted; the peak
        # they are counted against depends on the precision).
        self._basis: dict[str | None, RunResult] = {}

    def check(self) -> None:
        """Build the workload (or check the program's preset) now: a bad name or preset fails
        before a study is stored."""
        if self.program is not None:
            self.program.check(self.preset)
            return
        size = self.workload.samples_per_batch
        if size % self.nproc:
            raise trainers.ConfigError(
                "nproc_per_node",
                self.nproc,
                f"a divisor of the global batch ({self.workload_name} {self.preset} has {size} "
                "samples per batch: each process trains on an equal shard)",
            )

    @property
    def samples_per_batch(self) -> int:
        if self.program is None:
            return self.workload.samples_per_batch
        if self._samples_per_batch is None:
            raise trainers.TrainerError(
                f"program {self.program.name!r}: no run has reported its batch size yet"
            )
        return self._samples_per_batch

    @property
    def workload(self) -> Workload:
        if self._workload is None:
            self._workload = trainers.load_workload(
                self.workload_name, self.preset, seed=self.protocol.seed, model_args=self.model_args
            )
            self._initial = {
                k: v.detach().clone() for k, v in self._workload.model.state_dict().items()
            }
        return self._workload

    def has_blocks(self) -> bool:
        """Whether the block levers apply (a program's model is elsewhere: they do not)."""
        return self.program is None and trainers.has_blocks(self.workload)

    def parameters(self) -> int | None:
        """The workload's trainable parameters (None for a program: its model is elsewhere)."""
        if self.program is not None:
            return None
        return sum(p.numel() for p in self.workload.model.parameters() if p.requires_grad)

    def measure(
        self,
        config: LoopConfig,
        *,
        on_window: Callable[[int, float], bool] | None = None,
        precision: str | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Measured | Failure:
        """One run of `config`. `on_window(index, throughput)` returning False stops it early.
        `precision`: this run's, in a study searching precisions (None: the study's).
        `should_stop()`: asked all along a program's run or a torchrun launch (True: a Failure
        of kind "stopped"); a run in this process reads a stop at its windows (`on_window`)."""
        if precision is not None and precision != self.precision:
            # A run in another precision: the same measurement, by a Measurer of that precision
            # sharing this one's workload and initial weights.
            return self._in(precision).measure(config, on_window=on_window, should_stop=should_stop)
        if self.program is not None:
            return self._measure_program(self.program, config, on_window, should_stop)
        if self.nproc > 1:
            return self._measure_distributed(config, on_window, should_stop)
        workload = self.workload
        workload.model.load_state_dict(self._initial)
        # Every run starts from the same allocator state: what earlier runs cached is returned.
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        started = time.perf_counter()

        def window_done(index: int, window: Window) -> bool:
            if on_window is None:
                return True
            return on_window(index, workload.samples_per_batch / (window.step_ms / 1e3))

        failure: Failure | None = None
        try:
            result = trainers.run(
                workload,
                config,
                self._run_args(config),
                on_window=window_done,
            )
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, none ends the study
            failure = self._failure(exc, time.perf_counter() - started, in_process=True)
        # After the except block: the failed run's traceback, which holds its tensors, is gone.
        self._give_back(workload)
        if failure is not None:
            return failure
        self._basis[self.precision] = result
        return _measured(result, time.perf_counter() - started)

    def _run_args(self, config: LoopConfig) -> RunArgs:
        """One measurement of `config`: the protocol's windows after its warm-up for `config`,
        on this device, in this precision, from the protocol's seed (a program's and a torchrun
        launch's; `trainers.run` takes the workload built from it)."""
        protocol = self.protocol
        return RunArgs(
            steps=protocol.windows * protocol.window_steps,
            warmup=protocol.warmup_for(config),
            windows=protocol.windows,
            device=self.device,
            precision=self.precision,
            seed=protocol.seed,
        )

    def _give_back(self, workload: Workload) -> None:
        """Between runs this process holds no GPU memory for the model: the parity and profile
        children run next, on the same GPU, in their own processes. On the 1.1B preset (8 x 2048
        tokens, a 43-56 GB step) the gate's plain reference ran out of memory in the child while
        this process still held its allocator's cache (H100, 2026-11-25); at 16 x 2048 the gate
        could not run a 66-71 GB config beside the 18.6 GB this process then kept: the weights,
        their gradients and more (2026-11-26). The next run starts from `_initial` anyway, and
        moves the model back (1.1B weights: about a second each way)."""
        for param in workload.model.parameters():
            param.grad = None
        if self.device.type == "cuda":
            workload.model.to("cpu")
            gc.collect()
            torch.cuda.empty_cache()

    def utilisation(
        self,
        step_ms: float,
        *,
        precision: str | None = None,
        config: LoopConfig | None = None,
    ) -> trainers.Utilisation | None:
        """Achieved TFLOP/s and MFU of a step of `step_ms` on this workload and device, in
        `precision` (None: the study's); None before a complete run in it, or for a program
        (its FLOPs are not counted here). With `config`, also the share of FLOPs its activation
        checkpointing computes again (`recompute_share`, counted once per lever setting)."""
        if precision is not None and precision != self.precision:
            return self._in(precision).utilisation(step_ms, config=config)
        basis = self._basis.get(self.precision)
        if basis is None:
            return None
        use = trainers.utilisation(
            basis.flops_per_step,
            step_ms,
            gpu_name=basis.fingerprint.get("gpu"),
            precision=basis.precision,
            matmul_precision=basis.matmul_precision,
        )
        if config is None or not basis.flops_per_step or self.program is not None:
            return use
        again = trainers.count_recompute_flops(self.workload, config, self.device)
        return dataclasses.replace(use, recompute_share=again / basis.flops_per_step)

    def device_memory_bytes(self) -> int | None:
        """The device's total memory (None on a CPU): what a peak's headroom is counted from."""
        if self.device.type != "cuda":
            return None
        return int(torch.cuda.get_device_properties(self.device).total_memory)

    def _measure_program(
        self,
        program: Program,
        config: LoopConfig,
        on_window: Callable[[int, float], bool] | None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Measured | Failure:
        started = time.perf_counter()

        def window_done(index: int, window: Window) -> bool:
            if on_window is None or self._samples_per_batch is None:
                return True
            return on_window(index, self._samples_per_batch / (window.step_ms / 1e3))

        try:
            result = run_program(
                program,
                self.preset,
                config,
                self._run_args(config),
                on_window=window_done,
                on_start=self._started,
                should_stop=should_stop,
            )
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, none ends the study
            return self._failure(exc, time.perf_counter() - started)
        self._samples_per_batch = result.samples_per_batch
        return _measured(result, time.perf_counter() - started)

    def _measure_distributed(
        self,
        config: LoopConfig,
        on_window: Callable[[int, float], bool] | None,
        should_stop: Callable[[], bool] | None = None,
    ) -> Measured | Failure:
        """One torchrun launch of `nproc` processes (a failed or hung rank: a Failure naming it,
        with its stderr; no process left behind). Windows are samples/s of the global batch."""
        started = time.perf_counter()
        samples = self.workload.samples_per_batch

        def window_done(index: int, window: Window) -> bool:
            if on_window is None:
                return True
            return on_window(index, samples / (window.step_ms / 1e3))

        try:
            result = run_distributed(
                self.workload_name,
                self.preset,
                config,
                self._run_args(config),
                nproc=self.nproc,
                on_window=window_done,
                model_args=self.model_args,
                should_stop=should_stop,
            )
        except Exception as exc:  # noqa: BLE001 - every failure is recorded, none ends the study
            return self._failure(exc, time.perf_counter() - started)
        return _measured(result, time.perf_counter() - started)

    def _in(self, precision: str) -> Measurer:
        """This Measurer in `precision`: made once, sharing the built workload and its initial
        weights (every run restores them), so runs differ by their config and precision only."""
        other = self._others.get(precision)
        if other is None:
            other = Measurer(
                self.workload_name,
                self.preset,
                device=self.device,
                protocol=self.protocol,
                model_args=self.model_args,
                precision=precision,  # type: ignore[arg-type]  # RunOptions checked it
                nproc=self.nproc,
            )
            if self.program is None:
                other._workload, other._initial = self.workload, self._initial
            self._others[precision] = other
        return other

    def _started(self, samples_per_batch: int) -> None:
        # From the program's start line: windows are converted to samples/s as they come.
        self._samples_per_batch = samples_per_batch

    def _failure(self, exc: Exception, seconds: float, *, in_process: bool = False) -> Failure:
        if self.device.type == "cuda":
            # Give back what the failed run cached (after an OOM above all); a broken context
            # raises again here, and the next trial records that as its own failure.
            with contextlib.suppress(RuntimeError):
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()
        kind = _failure_kind(exc)
        # Where in the user's code (their model or loss), for what their code raised.
        where = users_frame(exc) if kind in ("error", "cuda") else ""
        text = (
            oom_reason(str(exc))
            if kind == "oom"
            else str(exc)
            if kind == "stopped"
            else f"{type(exc).__name__}{where}: {exc}"
        )
        said = f"{kind}: {text}".strip()[:2000]
        return Failure(reason=said, kind=kind, seconds=seconds, in_process=in_process)

    def floor_ms(
        self, config: LoopConfig | None = None, *, precision: str | None = None
    ) -> float | None:
        """The CUDA-graph floor of this workload in `precision` (None: the study's); None on a
        CPU, if it cannot be captured, or where it does not bound `config`'s step (compiled)."""
        if precision is not None and precision != self.precision:
            return self._in(precision).floor_ms(config)
        if self.device.type != "cuda" or self.program is not None or self.nproc > 1:
            return None
        if config is not None and floor_applies(config) is not None:
            return None
        workload = self.workload
        workload.model.load_state_dict(self._initial)
        try:
            return trainers.graph_floor(
                workload, device=self.device, precision=self.precision
            ).step_ms
        except trainers.TrainerError:
            return None


_ASKED = re.compile(r"Tried to allocate ([\d.]+ [KMGT]?i?B)")
_FREE = re.compile(r"total capacity of ([\d.]+ [KMGT]?i?B) of which ([\d.]+ [KMGT]?i?B) is free")
_IN_USE = re.compile(r"([\d.]+ [KMGT]?i?B) is allocated by PyTorch")


def oom_reason(message: str) -> str:
    """One line from PyTorch's out-of-memory message: what the run asked for, what the device
    had free of its total, what the run held (the rest of the message is allocator advice that
    does not apply to a tuning trial). The message as it is when it is not in that form."""
    asked, free, in_use = _ASKED.search(message), _FREE.search(message), _IN_USE.search(message)
    if asked is None or free is None:
        return " ".join(message.split())[:300]
    held = f"; the run held {in_use.group(1)}" if in_use is not None else ""
    return (
        f"out of memory: asked for {asked.group(1)} with {free.group(2)} free of "
        f"{free.group(1)}{held}"
    )


def _failure_kind(exc: Exception) -> str:
    if isinstance(exc, ProgramStopped):
        return "stopped"
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return "oom"
    if isinstance(exc, trainers.CaptureError):
        return "capture"
    if isinstance(exc, trainers.ConfigError | trainers.UnsupportedOnDevice):
        return "config"
    if isinstance(exc, trainers.WorkloadError):
        return "workload"
    if isinstance(exc, RuntimeError) and "CUDA" in str(exc):
        return "cuda"
    return "error"


def _first_nonfinite(losses: list[float]) -> int | None:
    return next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)


def _measured(result: RunResult, seconds: float) -> Measured:
    use = result.utilisation
    return Measured(
        tflops=use.tflops,
        mfu=use.mfu,
        throughputs=tuple(result.window_throughputs()),
        step_ms=result.step_time_ms["median"],
        peak_memory_bytes=result.peak_memory_bytes,
        n_syncs=result.n_syncs,
        sync_wait_ms=result.sync_wait_ms,
        seconds=seconds,
        stopped_early=result.stopped_early,
        first_nonfinite=next(
            (i for i, x in enumerate(result.losses) if not math.isfinite(x)), None
        ),
        compile=None
        if result.config.get("compile", "none") == "none"
        and result.config.get("optimizer") != "compiled"
        else {
            "compile_s": result.compile_s,
            "recompiles": result.recompiles,
            "graph_breaks": result.graph_breaks,
            "unstable": result.compile_unstable,
            "notes": list(result.compile_notes)[:10],
            "cache_hits": result.compile_cache_hits,
            "cache_misses": result.compile_cache_misses,
            "kept_s": result.compile_kept_s,
        },
    )
