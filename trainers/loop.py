"""`run()`: train a workload under one LoopConfig and measure it.

Read top to bottom: resolve the device, build the optimizer, the (compiled) model, the streams,
the data feed, the step and the loss harvester; run the warm-up steps; run the timed windows;
drain the losses; report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

from trainers.compilation import (
    CompileStats,
    CompileWatch,
    compile_model,
    compiles,
    min_warmup_for_compile,
)
from trainers.config import LoopConfig, device_error
from trainers.errors import ConfigError, UnsupportedOnDevice
from trainers.feed import DeviceFeed, cycle, make_loader
from trainers.harvest import Harvester, make_harvester
from trainers.measure import RunResult, Window, WindowTimer, fingerprint, window_sizes
from trainers.optim import prepare_optimizer
from trainers.precision import Precision, check_precision, make_plan, matmul_precision_for
from trainers.step import GRAPH_WARMUP_STEPS, EagerStep, GraphStep
from trainers.streams import StreamPlan
from trainers.workloads.base import Workload

WindowCallback = Callable[[int, Window], bool]
"""Called after each timed window with its index; returning False stops the run there (a pruned
trial, a cancelled job). What was measured so far stays in the result."""

CPU_NOTE = (
    "CPU run: streams, events, pinned memory and non-blocking copies do not exist on a CPU; "
    "those settings were accepted and had no effect"
)


def resolve_device(device: str | torch.device) -> torch.device:
    if isinstance(device, torch.device):
        resolved = device
    elif device == "auto":
        resolved = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif device in ("cpu", "cuda") or device.startswith("cuda:"):
        resolved = torch.device(device)
    else:
        raise ConfigError("device", device, "auto, cpu, cuda or cuda:INDEX")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedOnDevice(
            f"device={device!r}: CUDA is not available here (torch {torch.__version__}); "
            "use --device cpu or auto"
        )
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def min_warmup(config: LoopConfig) -> int:
    """The fewest warm-up steps `run()` accepts for `config`: CUDA-graph warm-up and capture, and
    compilation, stay out of the timed windows."""
    graph = GRAPH_WARMUP_STEPS + 1 if config.cuda_graph else 0
    return max(graph, min_warmup_for_compile(config))


def check_run_args(
    config: LoopConfig,
    device: torch.device,
    *,
    steps: int,
    warmup: int,
    windows: int,
    precision: str | None = None,
) -> None:
    if steps < 1:
        raise ConfigError("steps", steps, "an integer >= 1")
    if warmup < 0:
        raise ConfigError("warmup", warmup, "an integer >= 0")
    if windows < 1 or windows > steps:
        raise ConfigError("windows", windows, f"an integer in 1..steps ({steps})")
    if precision is not None:
        check_precision(precision, cuda_graph=config.cuda_graph)
    reason = device_error(config, device.type)
    if reason is not None:
        raise UnsupportedOnDevice(reason)
    if config.cuda_graph and warmup < GRAPH_WARMUP_STEPS + 1:
        raise ConfigError(
            "warmup",
            warmup,
            f"an integer >= {GRAPH_WARMUP_STEPS + 1} with cuda_graph=True "
            f"({GRAPH_WARMUP_STEPS} eager warm-up steps and the capture stay untimed)",
        )
    if warmup < min_warmup(config):
        raise ConfigError(
            "warmup",
            warmup,
            f"an integer >= {min_warmup(config)} with compile={config.compile!r} and "
            f"optimizer={config.optimizer!r} (compilation stays out of the timed windows)",
        )


def run(
    workload: Workload,
    config: LoopConfig,
    *,
    steps: int = 50,
    warmup: int = 10,
    windows: int = 5,
    device: str | torch.device = "auto",
    on_window: WindowCallback | None = None,
    precision: Precision | None = None,
    capturable: bool | None = None,
) -> RunResult:
    """Train `workload` for `warmup + steps` steps under `config`; time `steps` in `windows`.

    precision: the run's numeric precision (`trainers.precision`), a property of the experiment
    and never tuned; None keeps the process's float32 matmul precision and no autocast.
    capturable: build the optimizer capturable (None: exactly when `config.cuda_graph`); the
    parity gate runs a graph config's eager twin with True (`trainers.gate.parity`).
    """
    dev = resolve_device(device)
    check_run_args(config, dev, steps=steps, warmup=warmup, windows=windows, precision=precision)
    # Probes the autocast first: an unsupported precision fails before any step runs.
    numerics = make_plan(precision, dev)
    for param in workload.model.parameters():
        # A model trained before (another run, another config) starts without its gradients,
        # so they neither leak into this run's peak memory nor into its first step.
        param.grad = None
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        _release_blas_workspaces(dev)
        torch.cuda.reset_peak_memory_stats(dev)

    model = workload.model.to(dev)
    model.train()
    # Memory already allocated (the model, and whatever earlier runs in this process left) is
    # subtracted from the peak; the model's own bytes are added back (see RunResult).
    allocated_at_start = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
    # Before anything is compiled: resets Dynamo for a compiling config (see CompileWatch).
    watch = CompileWatch(dev, active=compiles(config))
    # A CUDA graph needs a capturable optimizer (its step counter on the device).
    if capturable is None:
        capturable = config.cuda_graph
    optimizer = prepare_optimizer(
        workload.make_optimizer(model.parameters(), capturable),
        config.optimizer,
        capturable=capturable,
    )
    # The compiled wrapper shares the model's parameters; workload.model itself stays eager.
    step_model = compile_model(model, config.compile)
    plan = StreamPlan.create(config.num_streams, dev, cuda_graph=config.cuda_graph)
    loader = make_loader(workload, config, dev)
    feed = DeviceFeed(cycle(loader), plan, config, dev)
    step_fn: GraphStep | EagerStep
    if config.cuda_graph:
        step_fn = GraphStep(step_model, optimizer, workload.loss_fn, plan, precision=numerics)
    else:
        step_fn = EagerStep(
            step_model,
            optimizer,
            workload.loss_fn,
            plan,
            precision=numerics,
            cudagraph_trees=config.compile == "reduce-overhead",
        )
    harvester = make_harvester(config, plan, warmup + steps, dev)
    timer = WindowTimer(dev, plan)

    def train_step(step: int) -> None:
        harvester.push(step, step_fn(feed.next()))
        if (step + 1) % config.sync_interval == 0:
            harvester.sync_point()

    measured: list[Window] = []
    stopped_early = False
    step = 0
    # The matmul precision is process-wide: set for the steps, the previous one back after them.
    with matmul_precision_for(precision) as matmul, contextlib.closing(LoaderCloser(loader)):
        for _ in range(warmup):
            with watch.warmup_step():
                train_step(step)
            step += 1
        watch.end_warmup()
        for index, size in enumerate(window_sizes(steps, windows)):
            timer.start()
            for _ in range(size):
                train_step(step)
                step += 1
            measured.append(timer.stop(size))
            if (
                on_window is not None
                and not on_window(index, measured[-1])
                and (index + 1 < windows)
            ):
                stopped_early = True
                break
        harvester.drain()
    compiled = watch.finish([w.step_ms for w in measured])

    peak = None
    if dev.type == "cuda":
        model_bytes = sum(
            t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]
        )
        peak = torch.cuda.max_memory_allocated(dev) - allocated_at_start + model_bytes
    return _result(
        workload,
        config,
        dev,
        harvester,
        measured,
        warmup=warmup,
        steps=step - warmup,
        stopped_early=stopped_early,
        peak_memory_bytes=peak,
        precision=precision,
        matmul_precision=matmul,
        compiled=compiled,
    )


def _release_blas_workspaces(dev: torch.device) -> None:
    """Free the cuBLAS workspaces that earlier runs in this process left allocated.

    cuBLAS keeps one workspace per (handle, stream), allocated through the caching allocator on
    the first matmul on that stream. Left in place, whether a run's peak counted them depended on
    which streams earlier runs had used: measured on an H200, transformer small peaked at 329 MiB
    in a fresh process for 1-4 streams, but at 264 MiB for 1 stream after another run. Freed here,
    every run allocates (and counts) the workspaces its own streams need, as a fresh process
    does. torch's own memory-leak checks and cudagraph trees free them the same way.
    """
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        torch.cuda.synchronize(dev)  # nothing in flight still uses a workspace
        clear()


class LoaderCloser:
    """Shuts persistent DataLoader workers down when the run ends, even on error."""

    def __init__(self, loader: torch.utils.data.DataLoader[Any]) -> None:
        self.loader = loader

    def close(self) -> None:
        iterator = getattr(self.loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()


def _result(
    workload: Workload,
    config: LoopConfig,
    dev: torch.device,
    harvester: Harvester,
    windows: list[Window],
    *,
    warmup: int,
    steps: int,
    stopped_early: bool,
    peak_memory_bytes: int | None,
    precision: str | None,
    matmul_precision: str,
    compiled: CompileStats,
) -> RunResult:
    on_cuda = dev.type == "cuda"
    effective = {
        "streams": on_cuda,
        "sync_mode": on_cuda,
        "pin_memory": on_cuda,
        "non_blocking": on_cuda,
        "note": None if on_cuda else CPU_NOTE,
    }
    return RunResult(
        config=config.to_dict(),
        workload=workload.name,
        preset=workload.preset,
        device=str(dev),
        effective=effective,
        warmup_steps=warmup,
        steps=steps,
        stopped_early=stopped_early,
        losses=harvester.ledger.losses,
        loss_check=harvester.ledger.proof(warmup + steps),
        n_syncs=harvester.n_syncs,
        n_polls=harvester.n_polls,
        sync_wait_ms=harvester.sync_wait_s * 1e3,
        windows=windows,
        samples_per_batch=workload.samples_per_batch,
        tokens_per_sample=workload.tokens_per_sample,
        peak_memory_bytes=peak_memory_bytes,
        fingerprint=fingerprint(dev),
        # Not loop settings (they change the results) but they change the speed: recorded.
        matmul_precision=matmul_precision,
        precision=precision,
        compile_s=compiled.compile_s,
        recompiles=compiled.recompiles,
        graph_breaks=compiled.graph_breaks,
        compile_unstable=compiled.unstable,
        compile_notes=list(compiled.notes),
        compile_cache_hits=compiled.cache_hits,
        compile_cache_misses=compiled.cache_misses,
    )
