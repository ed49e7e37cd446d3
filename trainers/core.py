"""The loop core: the parts of a training run, built once from a `LoopConfig`, a workload and a
precision, and the steps that drive them.

`trainers.loop.run` (measurement) and `trainers.fit.Trainer` (training) are thin users of it, so
what the tuner measured is what a user trains with. Two stages:
- `Engine`, built once per run (once per `Trainer`): the device check, the precision plan, the
  model on the device (gradients reset), the optimizer, the model as it is stepped (compiled or
  not), and the `CompileWatch`.
- `Session`, once per pass of steps (a `run`, a `fit` call): the streams, the data feed from its
  position, the step (eager or CUDA graph), the loss harvester and the sync test. Entered as a
  context manager, it sets the matmul precision and closes the data loaders on the way out.

Each lever has one spot here, which both users reach: the model transform in
`Engine._transform_model` (block levers, then the data-parallel wrapper of `trainers.parallel`,
then the compiler), the optimizer in `Engine._build_optimizer`, the batches one step draws in
`Session.step` (each process's shard of them: `DataParallel.shard`).

`trainers.gate.faults` swaps `DeviceFeed`, `EagerStep` and `GraphStep` in this module's
namespace to plant its faults: they are looked up here when a Session is built.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from types import TracebackType
from typing import Any

import torch
from torch import nn

from trainers.compilation import (
    CompileWatch,
    compile_model,
    compiles,
    min_warmup_for_compile,
    reuse_key,
)
from trainers.config import LoopConfig, device_error, precision_error
from trainers.errors import ConfigError, UnsupportedOnDevice, WorkloadError
from trainers.feed import DeviceFeed, close_loaders, positioned_batches, split_batch
from trainers.float8 import Float8Report, apply_float8
from trainers.flops import count_step_flops, count_step_flops_by_linear
from trainers.harvest import Harvester, make_harvester
from trainers.levers.declare import nothing, transformed
from trainers.measure import check_counts
from trainers.optim import prepare_optimizer
from trainers.parallel import DataParallel, sync_skipper
from trainers.precision import (
    Precision,
    check_precision,
    check_precision_here,
    check_scaled_parameters,
    make_plan,
    matmul_precision_for,
)
from trainers.recompute import apply_block_levers
from trainers.step import GRAPH_WARMUP_STEPS, EagerStep, GraphStep, forward_contexts
from trainers.streams import StreamPlan
from trainers.workloads.base import Batch, Workload
from trainers.workloads.checks import raised_at

OptimizerHook = Callable[[torch.optim.Optimizer, torch.device], None]
"""Called with the optimizer the core built, before a compiled optimizer step is compiled
(`Trainer` makes its learning rates device tensors and builds its scheduler there)."""


DEVICES_ALLOWED = "auto, cpu, cuda or cuda:INDEX"
DEVICE_PATTERN = re.compile(r"\A(auto|cpu|cuda(:(0|[1-9]\d?))?)\Z")
r"""The one device syntax of a run (`--device`) and of a service job (its `device`). Anchored by
`\A` and `\Z`, not `^` and `$`: `$` also matches before a final newline, and `"cpu\n"` had
passed, a job no worker offered a device for (queued for good) and a CLI run torch refused. An
index has no leading zero: `cuda:01` is GPU 1 to torch, but a worker offers `cuda:1`, and the job
had been queued for good (a probe, 2026-12-07)."""


def resolve_device(device: str | torch.device) -> torch.device:
    if isinstance(device, torch.device):
        resolved = device
    elif not isinstance(device, str) or not DEVICE_PATTERN.fullmatch(device):
        # Before torch reads it: `cuda:x` is torch's RuntimeError, not the flag's error; `0`
        # or None had been the pattern's TypeError.
        said = (
            DEVICES_ALLOWED if isinstance(device, str) else f"{DEVICES_ALLOWED}, or a torch.device"
        )
        raise ConfigError("device", device, said)
    elif device == "auto":
        resolved = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedOnDevice(
            f"device={device!r}: CUDA is not available here (torch {torch.__version__}); "
            "allowed cpu or auto"
        )
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


def check_setup(config: LoopConfig, device: torch.device, precision: str | None) -> None:
    """ConfigError / UnsupportedOnDevice unless `config` and `precision` can run on `device`."""
    if precision is not None:
        check_precision(precision, cuda_graph=config.cuda_graph, parallel=config.parallel)
        refused = precision_error(config, precision)
        if refused is not None:
            raise refused
        # float8 on a CPU, an older GPU or without torchao: one line, before anything is built.
        check_precision_here(precision, device)
    reason = device_error(config, device.type)
    if reason is not None:
        raise UnsupportedOnDevice(reason)


def min_warmup(config: LoopConfig) -> int:
    """The fewest warm-up steps `run()` accepts for `config`: CUDA-graph warm-up and capture, and
    compilation, stay out of the timed windows."""
    graph = GRAPH_WARMUP_STEPS + 1 if config.cuda_graph else 0
    return max(graph, min_warmup_for_compile(config))


def check_warmup(config: LoopConfig, warmup: int) -> None:
    """ConfigError naming `warmup` when it leaves capture or compilation in the timed windows."""
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


def check_run_args(
    config: LoopConfig,
    device: torch.device,
    *,
    steps: int,
    warmup: int,
    windows: int,
    precision: str | None = None,
) -> None:
    """Every check of a measured run's arguments, in the order a user meets them."""
    check_counts(steps=steps, warmup=warmup, windows=windows)
    check_setup(config, device, precision)
    check_warmup(config, warmup)


def check_micro_batches(config: LoopConfig, count: int, *, field: str) -> None:
    """ConfigError naming `field` unless each step may draw `count` micro-batches."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(field, count, "an integer >= 1")
    if config.compile == "reduce-overhead" and count > 1:
        # The cudagraph trees keep a backward's gradients in their own memory, which the next
        # micro-batch's replay may overwrite (pytorch/pytorch#96693): unverified, refused.
        raise ConfigError(
            field,
            count,
            "1 with compile='reduce-overhead' (its CUDA graphs may overwrite the gradients of "
            "the earlier micro-batches); compile='default' with cuda_graph=True accumulates",
        )


class Engine:
    """What a run builds once: the device, precision plan, model, optimizer and compile watch.

    `model` is the workload's own module, on the device, eager (evaluation and checkpoints use
    it); `step_model` is what the step calls (compiled, or `model` itself), sharing its
    parameters. capturable: build the optimizer capturable (None: exactly when
    `config.cuda_graph`, since a CUDA graph needs its step counter on the device).
    """

    def __init__(
        self,
        workload: Workload,
        config: LoopConfig,
        *,
        device: str | torch.device = "auto",
        precision: Precision | None = None,
        capturable: bool | None = None,
        on_optimizer: OptimizerHook | None = None,
        count_flops: bool = True,
    ) -> None:
        self.workload = workload
        self.config = config
        self.precision = precision
        self.device = dev = resolve_device(device)
        check_setup(config, dev, precision)
        # Probes the autocast first: an unsupported precision fails before any step runs.
        self.precision_plan = make_plan(precision, dev)
        check_scaled_parameters(precision, workload.model)
        for param in workload.model.parameters():
            # A model trained before (another run, another config) starts without its
            # gradients, so they neither leak into this run's peak memory nor its first step.
            param.grad = None
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
            _release_blas_workspaces(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        self.model = workload.model.to(dev)
        if not self.model.training:
            # Built in eval mode (`from_pretrained`): trained in train mode. A model in train mode
            # keeps the modes its owner gave its submodules (a frozen BatchNorm in eval).
            self.model.train()
        # Memory already allocated (the model, and whatever earlier runs in this process left)
        # is subtracted from the peak; the model's own bytes are added back (see RunResult).
        self.allocated_at_start = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
        # Before anything is compiled: resets Dynamo for a compiling config (see CompileWatch).
        self.capturable = config.cuda_graph if capturable is None else capturable
        reuse = reuse_key(workload.model, config, precision, dev)
        self.watch = CompileWatch(dev, active=compiles(config), reuse=reuse)
        # Counted on the plain model, before any lever wraps it: recomputation is not a model
        # FLOP. `count_flops=False` (training) skips it.
        self.flops_per_step = _count_flops(workload, dev) if count_flops else None
        self.data_parallel = DataParallel.create(config, dev)
        self.data_parallel.check_workload(workload)
        self._undo_blocks: Callable[[], None] = nothing
        self._undo_levers: Callable[[], None] = nothing
        self._undo_float8: Callable[[], None] = nothing
        self.float8: Float8Report | None = None
        """What precision float8 converted (None for the other precisions)."""
        # Before the optimizer: FSDP2 replaces the parameters by their shards, which the
        # optimizer must hold (every other transform shares the model's parameters).
        self.step_model = self._transform_model(self.model)
        self.optimizer = self._build_optimizer(on_optimizer)

    def _build_optimizer(self, on_optimizer: OptimizerHook | None) -> torch.optim.Optimizer:
        """The workload's optimizer, rebuilt as `config.optimizer` asks."""
        # A compiled optimizer step is compiled last: what `on_optimizer` wraps around
        # `optimizer.step` (a scheduler counts its calls) must still find the bound method.
        compiled = self.config.optimizer == "compiled"
        optimizer = prepare_optimizer(
            self._made_optimizer(),
            "as-built" if compiled else self.config.optimizer,
            capturable=self.capturable,
        )
        if on_optimizer is not None:
            on_optimizer(optimizer, self.device)
        if compiled:
            optimizer = prepare_optimizer(optimizer, "compiled", capturable=self.capturable)
        return optimizer

    def _made_optimizer(self) -> torch.optim.Optimizer:
        """The workload's own factory's optimizer; what it raises named as its (the build's
        check leaves a factory that fails on the CPU's parameters to the run, which may build
        it on a GPU's: `trainers.workloads.checks._check_optimizer`)."""
        try:
            return self.workload.make_optimizer(self.model.parameters(), self.capturable)
        except Exception as exc:
            if type(exc).__name__ == "OutOfMemoryError":
                raise
            said = " ".join(str(exc).split())[:300]
            raise WorkloadError(
                f"workload {self.workload.name!r}: its optimizer factory raised "
                f"{type(exc).__name__}{raised_at(exc)}: {said}",
                field="optimizer" if self.workload.preset == "custom" else "workload",
            ) from exc

    def _transform_model(self, model: nn.Module) -> nn.Module:
        """The model the step calls. The compiled wrapper shares the model's parameters; the
        workload's own module stays eager, so a later run of it starts from an eager model.

        Precision float8 converts the eligible linears, and the block levers (activation
        checkpointing, each block compiled on its own) change the blocks, all in place;
        `close()` puts them back, so the next run of the same workload starts from the plain
        model. The converted linears share the model's Parameters, and a state dict loads into
        either form."""
        flops = None
        if self.precision == "float8":
            # First: the checkpoint wrappers and the compiler then see the converted layers,
            # and the scaling is fused into the compiled kernels (torchao's order).
            flops = _count_module_flops(self.workload, self.device)
            self.float8, self._undo_float8 = apply_float8(
                model, flops=flops, name=self.workload.name
            )
        try:
            self._undo_blocks = apply_block_levers(self.workload, self.config)
            # The lever modules' changes to the model (trainers.levers: `Lever.transform`).
            self._undo_levers = transformed(model, self.config.get)
            if self.float8 is not None:  # float8_linears may put converted ones back in bf16
                self.float8 = self.float8.after_levers(model, flops)
        except BaseException:
            self.close()  # a refused lever leaves the workload's model as it was
            raise
        # DDP or FSDP2 around the (checkpointed, per-block compiled) model; the whole-model
        # compile goes around the wrapper, so Dynamo sees DDP's buckets (trainers.parallel).
        model = self.data_parallel.wrap(model, self.workload)
        if self.config.compile_scope == "blocks":
            return model  # its blocks are compiled; what lies between them stays eager
        return compile_model(model, self.config.compile)

    def close(self) -> None:
        """Undo the block levers and the float8 conversion on the workload's model, in the
        reverse order of their making (a measured run ends with this)."""
        self._undo_levers()
        self._undo_levers = nothing
        self._undo_blocks()
        self._undo_blocks = nothing
        self._undo_float8()
        self._undo_float8 = nothing

    def session(
        self,
        *,
        capacity: int,
        first_step: int = 0,
        micro_batches: int = 1,
        clip_norm: float | None = None,
    ) -> Session:
        """A pass of steps from `first_step` (the steps already trained) with room for
        `capacity` losses; each step draws `micro_batches` batches."""
        return Session(
            self,
            capacity=capacity,
            first_step=first_step,
            micro_batches=micro_batches,
            clip_norm=clip_norm,
        )

    def peak_memory_bytes(self) -> int | None:
        """The model's bytes plus the most this run allocated on top of what was allocated when
        it started (CUDA only; see RunResult)."""
        if self.device.type != "cuda":
            return None
        model_bytes = sum(
            t.numel() * t.element_size() for t in [*self.model.parameters(), *self.model.buffers()]
        )
        peak = torch.cuda.max_memory_allocated(self.device)
        return peak - self.allocated_at_start + model_bytes


class Session:
    """One pass of steps over an Engine's model and optimizer: streams, feed, step, harvester.

    Use as a context manager: inside, the matmul precision is the run's (it is process-wide: the
    previous one comes back on exit) and the data loaders are closed on exit, even on error.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        capacity: int,
        first_step: int,
        micro_batches: int,
        clip_norm: float | None,
    ) -> None:
        check_micro_batches(engine.config, micro_batches, field="micro_batches")
        config, dev = engine.config, engine.device
        self.engine = engine
        self.first_step = first_step
        self.micro_batches = micro_batches
        self.plan = StreamPlan.create(config.num_streams, dev, cuda_graph=config.cuda_graph)
        self.loaders: list[torch.utils.data.DataLoader[Batch]] = []
        # The data position: the batches the steps before `first_step` trained on.
        batches = positioned_batches(
            engine.workload, config, dev, first_step * micro_batches, opened=self.loaders
        )
        # Under data parallelism each process keeps its shard of every global batch.
        batches = engine.data_parallel.shard(batches)
        self.feed = DeviceFeed(batches, self.plan, config, dev)
        self.step_fn = self._make_step(clip_norm)
        self.harvester: Harvester = make_harvester(config, self.plan, capacity, dev)
        self.matmul_precision = torch.get_float32_matmul_precision()
        self._closing = contextlib.ExitStack()

    def _make_step(self, clip_norm: float | None) -> EagerStep | GraphStep:
        engine = self.engine
        # One list around every forward, both steps alike: autocast, then the levers' contexts.
        contexts = forward_contexts(engine.config, engine.precision_plan)
        if engine.config.cuda_graph:
            return GraphStep(
                engine.step_model,
                engine.optimizer,
                engine.workload.loss_fn,
                self.plan,
                precision=engine.precision_plan,
                contexts=contexts,
                clip_norm=clip_norm,
            )
        return EagerStep(
            engine.step_model,
            engine.optimizer,
            engine.workload.loss_fn,
            self.plan,
            precision=engine.precision_plan,
            contexts=contexts,
            cudagraph_trees=engine.config.compile == "reduce-overhead",
            clip_norm=clip_norm,
            # Micro-batches under DDP or FSDP2 reduce their gradients once, in the last one.
            skip_sync=sync_skipper(engine.step_model) if engine.data_parallel.active else None,
        )

    def __enter__(self) -> Session:
        self._closing.callback(close_loaders, self.loaders)
        self.matmul_precision = self._closing.enter_context(
            matmul_precision_for(self.engine.precision)
        )
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._closing.close()

    def step(self, index: int) -> None:
        """Train step `index` (counted from the start of training, `first_step` the first).

        The step draws `micro_batches` batches (a Trainer's `accumulate`) and splits each into
        `config.micro_batches` pieces: the step accumulates the gradients of all the pieces.
        """
        batches = [self.feed.next() for _ in range(self.micro_batches)]
        split = self.engine.config.micro_batches
        if split > 1:
            batches = [piece for batch in batches for piece in split_batch(batch, split)]
        self.harvester.push(index - self.first_step, self.step_fn(*batches))
        # The one sync rule: after every `sync_interval`-th step of the training, counted from
        # its start (a resumed run syncs where the uninterrupted one did).
        if (index + 1) % self.engine.config.sync_interval == 0:
            self.harvester.sync_point()

    def drain(self) -> None:
        """Harvest every loss still pending (the one blocking wait a query-mode run makes)."""
        self.harvester.drain()

    @property
    def losses(self) -> list[float]:
        return self.harvester.ledger.losses

    def on_losses(self, listener: Callable[[int, list[float]], Any]) -> None:
        """Call `listener(first, values)` as losses are harvested (`first` counted from
        `first_step`)."""
        first_step = self.first_step

        def harvested(first: int, values: list[float]) -> None:
            listener(first_step + first, values)

        self.harvester.ledger.listener = harvested


def _count_flops(workload: Workload, dev: torch.device) -> int | None:
    """The model FLOPs of one step (`trainers.flops`); None where they cannot be counted (a loss
    that reads the host, a model that refuses a one-sample batch): MFU is then unknown, and the
    run goes on."""
    try:
        return count_step_flops(workload, dev)
    except Exception:  # noqa: BLE001 - a count that fails leaves MFU unknown, never the run
        return None


def _count_module_flops(workload: Workload, dev: torch.device) -> dict[str, int] | None:
    """The step's model FLOPs by module (for float8's converted share); None where they cannot
    be counted, as for `_count_flops`."""
    try:
        return count_step_flops_by_linear(workload, dev)
    except Exception:  # noqa: BLE001 - a count that fails leaves the share unknown, never the run
        return None


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
