"""One training step, eager or replayed from a CUDA graph. Each returns the step's loss as a device
tensor that stays valid until the host reads it.

Either step takes the model as the run built it (eager or `torch.compile`d), a PrecisionPlan (for
fp16 the loss scaler around backward and step) and one list of contexts entered around each
forward and loss (`forward_contexts`: the precision's autocast, then each lever's
`around_forward` in table order), built from the config.

A step may take several micro-batches (gradient accumulation, `trainers.fit`): each one's loss is
divided by their count before its backward, so the summed gradients are the mean gradient of the
whole batch, and the step's loss is the mean of theirs. `clip_norm` clips the gradients' total
norm before the optimizer step, with `torch.nn.utils.clip_grad_norm_` (which never reads a value
on the host, so it can be captured). The harness measures one micro-batch and no clipping.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext

import torch
from torch import nn

from trainers.config import LoopConfig
from trainers.errors import CaptureError, WorkloadError
from trainers.levers import LEVERS
from trainers.parallel import SyncSkipper
from trainers.precision import PrecisionPlan
from trainers.streams import StreamPlan, on, wait
from trainers.workloads.base import Batch, LossFn

GRAPH_WARMUP_STEPS = 3
"""Eager steps run on a side stream before capture (cuBLAS/cuDNN handles, autograd's lazy state,
optimizer state). They are real training steps: their losses are the run's first losses."""

_mark_cudagraph_step: Callable[[], None] = torch.compiler.cudagraph_mark_step_begin

Context = Callable[[], AbstractContextManager[object]]
"""Makes a fresh context to enter around one forward."""


def forward_contexts(config: LoopConfig, precision: PrecisionPlan) -> tuple[Context, ...]:
    """What the step enters around each forward and loss, outermost first: the precision's
    autocast, then the context of every lever that declares `around_forward`, in table order."""
    contexts: list[Context] = [precision.autocast]
    for name, item in LEVERS.items():
        effect = item.around_forward
        if effect is not None:
            contexts.append(functools.partial(effect, config.get(name)))
    return tuple(contexts)


class _Step:
    """What both steps hold: the model as stepped, its optimizer and loss, the streams, the
    precision plan, the contexts around each forward and the clipping norm."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        plan: StreamPlan,
        *,
        precision: PrecisionPlan | None = None,
        contexts: Sequence[Context] | None = None,
        clip_norm: float | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.plan = plan
        self.precision = precision if precision is not None else PrecisionPlan()
        # None: the precision's autocast alone (a step built outside a run: the graph floor).
        self.contexts = tuple(contexts) if contexts is not None else (self.precision.autocast,)
        self.clip_norm = clip_norm

    def _loss(self, batch: Batch) -> torch.Tensor:
        """The forward and loss of one batch, inside every context of `contexts`."""
        if len(self.contexts) == 1:
            # The usual case (autocast alone): no ExitStack on the step's host path.
            with self.contexts[0]():
                return tensor_loss(self.loss_fn(self.model, batch))
        with ExitStack() as stack:
            for make in self.contexts:
                stack.enter_context(make())
            return tensor_loss(self.loss_fn(self.model, batch))


def tensor_loss(loss: object) -> torch.Tensor:
    """`loss` if it is a tensor, else WorkloadError naming what `loss_fn` returned. The build's
    check runs the loss on meta tensors, where a loss that reads a value (`float(loss)`) or a
    model that does (a Hugging Face output returned whole) cannot run: every step then failed
    with "'float' object has no attribute 'detach'" (a new user's trial, 2026-12-05)."""
    if isinstance(loss, torch.Tensor):
        return loss
    raise WorkloadError(
        f"loss_fn(model, batch) returned {type(loss).__name__}, not a tensor: return one "
        "batch's loss as a scalar tensor (a Hugging Face model's output: its .loss; not "
        ".item() or float(), which cut it from the model)",
        field="loss_fn",
    )


class EagerStep(_Step):
    """Forward, backward and optimizer step issued op by op (or compiled graph by compiled graph).

    cudagraph_trees: the model was compiled with mode="reduce-overhead", whose forward and
    backward replay from Inductor's CUDA graphs; each step then starts by telling Inductor so,
    and the loss is cloned out of the graphs' memory.
    skip_sync: under data parallelism (`trainers.parallel.sync_skipper`), the context every
    micro-batch but the last runs under, so the gradients cross processes once per step.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        plan: StreamPlan,
        *,
        precision: PrecisionPlan | None = None,
        contexts: Sequence[Context] | None = None,
        cudagraph_trees: bool = False,
        clip_norm: float | None = None,
        skip_sync: SyncSkipper | None = None,
    ) -> None:
        super().__init__(
            model,
            optimizer,
            loss_fn,
            plan,
            precision=precision,
            contexts=contexts,
            clip_norm=clip_norm,
        )
        self.cudagraph_trees = cudagraph_trees
        self.skip_sync = skip_sync

    @property
    def optimizer_stream(self) -> torch.cuda.Stream | None:
        """The stream the optimizer step runs on (None: the current stream)."""
        return self.plan.backward

    def __call__(self, *batches: Batch) -> torch.Tensor:
        if self.cudagraph_trees:
            # A new iteration: the outputs of the last one (activations, gradients) are dead, so
            # the cudagraph trees may replay over their memory instead of recording anew.
            _mark_cudagraph_step()
        forward, backward = self.plan.forward, self.plan.backward
        # The forward reads the weights that the previous optimizer step wrote on `backward`.
        wait(forward, backward)
        # set_to_none frees last step's gradients; the wait above already ordered their reuse.
        self.optimizer.zero_grad(set_to_none=True)
        kept: list[torch.Tensor] = []
        step_loss = None
        for index, batch in enumerate(batches):
            # Every micro-batch but the last leaves its gradients unreduced (DDP's no_sync,
            # FSDP2's set_requires_gradient_sync(False)): the cross-process hand-off, one
            # all-reduce or reduce-scatter of the summed gradients, is in the last backward.
            last = index == len(batches) - 1
            deferred = self.skip_sync() if self.skip_sync and not last else nullcontext()
            with deferred:
                step_loss = self._micro_step(batch, len(batches), kept, last=last)
        with on(backward):
            # No clipping (the harness): no hook, so fp16's scaler does not unscale separately.
            self.precision.step(
                self.optimizer, before_step=None if self.clip_norm is None else self._clip
            )
        # One micro-batch (the harness): its loss as it is, no extra kernel.
        assert step_loss is not None
        return step_loss

    def _micro_step(
        self, batch: Batch, count: int, kept: list[torch.Tensor], *, last: bool
    ) -> torch.Tensor | None:
        """Forward and backward of one of `count` micro-batches, its loss appended to `kept`;
        after the `last` one, the step's loss."""
        forward, backward = self.plan.forward, self.plan.backward
        step_loss = None
        with on(forward):
            loss = self._loss(batch)
            value = loss.detach()
            if self.cudagraph_trees:
                # A loss the compiled model returns itself lives in the cudagraph trees'
                # memory, which the next step's replay overwrites, while the harvester may not
                # have read it yet (sync_interval > 1): a copy in ordinary memory, queued
                # before `backward` waits on this stream so every later reader is ordered
                # after it.
                value = value.clone()
            kept.append(value)
            if count > 1:
                loss = loss / count
            if last:
                # The step's loss, made on `forward` before `backward` waits on it below:
                # the harvester's copy on the last stream is ordered after it.
                step_loss = kept[0] if len(kept) == 1 else torch.stack(kept).mean()
        with on(backward):
            # The seed gradient is made on `backward` and needs the loss.
            wait(backward, forward)
            # Backward kernels run on `forward` (their forward ops' stream); autograd makes
            # `backward` wait for them before returning, so the step below sees the
            # gradients. A next micro-batch's backward accumulates into them on `forward`,
            # behind this one's kernels.
            self.precision.backward(loss)
        return step_loss

    def _clip(self) -> None:
        assert self.clip_norm is not None
        clip_gradients(self.model, self.clip_norm)


class GraphStep(_Step):
    """Forward, backward and optimizer step captured once in a CUDA graph, then replayed.

    The first GRAPH_WARMUP_STEPS calls run eagerly on a side stream; the next captures the step
    and replays it. Inputs are copied into static buffers before each replay. The optimizer must
    have been built with `capturable=True`. A compiled model (compile="default" or
    "max-autotune-no-cudagraphs") compiles in the first warm-up step; the capture then records
    Inductor's kernels like any others, so the whole compiled step replays as one graph.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: LossFn,
        plan: StreamPlan,
        *,
        precision: PrecisionPlan | None = None,
        contexts: Sequence[Context] | None = None,
        clip_norm: float | None = None,
    ) -> None:
        super().__init__(
            model,
            optimizer,
            loss_fn,
            plan,
            precision=precision,
            contexts=contexts,
            clip_norm=clip_norm,
        )
        # GradScaler decides on the host whether to step (trainers.precision.check_precision).
        assert self.precision.scaler is None, "fp16-autocast cannot be captured"
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_batches: tuple[Batch, ...] = ()
        self.static_loss: torch.Tensor | None = None
        self._side = torch.cuda.Stream()

    @property
    def optimizer_stream(self) -> torch.cuda.Stream | None:
        """The stream the optimizer step is ordered on: warm-up steps join `forward` after, and
        replays run on it."""
        return self.plan.forward

    def __call__(self, *batches: Batch) -> torch.Tensor:
        self.calls += 1
        if self.calls <= GRAPH_WARMUP_STEPS:
            return self._warmup_step(batches)
        if self.graph is None:
            self._capture(batches)
        return self._replay(batches)

    def _train(self, batches: Sequence[Batch]) -> torch.Tensor:
        """Forward, backward and optimizer step on the current stream (warm-up and capture)."""
        self.optimizer.zero_grad(set_to_none=True)
        kept: list[torch.Tensor] = []
        for batch in batches:
            loss = self._loss(batch)
            kept.append(loss.detach())
            (loss / len(batches) if len(batches) > 1 else loss).backward()
        if self.clip_norm is not None:
            clip_gradients(self.model, self.clip_norm)
        self.optimizer.step()
        return kept[0] if len(kept) == 1 else torch.stack(kept).mean()

    def _warmup_step(self, batches: Sequence[Batch]) -> torch.Tensor:
        forward = self.plan.forward
        # Warm-up on a side stream, as capture requires; it starts after queued work on `forward`.
        wait(self._side, forward)
        with on(self._side):
            for batch in batches:
                for tensor in batch:
                    tensor.record_stream(self._side)
            loss = self._train(batches).clone()
        # Later work on `forward` (the next step, the loss copy) comes after this step.
        wait(forward, self._side)
        if forward is not None:
            loss.record_stream(forward)
        return loss

    def _capture(self, batches: Sequence[Batch]) -> None:
        forward = self.plan.forward
        with on(forward):
            self.static_batches = tuple(
                tuple(torch.empty_like(t) for t in batch) for batch in batches
            )
        torch.cuda.synchronize()
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: the DataLoader's pin-memory thread may call CUDA during capture.
            # stream: torch.cuda.graph's default capture stream is one per process, made on the
            # device current at the first capture; a later capture on another GPU would run on
            # it (seen on 2 H200s: cuda:0 then cuda:1 in one process -> capture invalidated).
            # A fresh, unused stream of this run's device is what the default is on one GPU.
            capture_stream = torch.cuda.Stream(device=self._side.device)
            with torch.cuda.graph(graph, stream=capture_stream, capture_error_mode="thread_local"):
                loss = self._train(self.static_batches)
        except RuntimeError as exc:
            _release_rng_from_failed_capture(self._side.device)
            raise CaptureError(
                "the step could not be captured in a CUDA graph: it must not sync with the host "
                "(.item(), .cpu(), printing tensors, data-dependent shapes such as boolean "
                "indexing or nonzero()), must keep its shapes static, and its optimizer must be "
                f"built with capturable=True. PyTorch said: {exc}"
            ) from exc
        self.graph = graph
        self.static_loss = loss.detach()

    def _replay(self, batches: Sequence[Batch]) -> torch.Tensor:
        assert self.graph is not None and self.static_loss is not None
        if len(batches) != len(self.static_batches):
            raise ValueError(
                f"the graph was captured for {len(self.static_batches)} micro-batches per step, "
                f"not {len(batches)}"
            )
        with on(self.plan.forward):
            # Device-to-device into the graph's fixed input addresses, ordered before the replay.
            for statics, batch in zip(self.static_batches, batches, strict=True):
                for static, tensor in zip(statics, batch, strict=True):
                    static.copy_(tensor, non_blocking=True)
            self.graph.replay()
            # The next replay overwrites static_loss: keep this step's value.
            return self.static_loss.clone()


def clip_gradients(model: nn.Module, max_norm: float) -> None:
    """Scale the gradients down so their total 2-norm is at most `max_norm`.

    `clip_grad_norm_` computes the norm and the factor on the device and never reads them on the
    host (error_if_nonfinite stays False), so it runs inside a captured step as well.
    """
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def _release_rng_from_failed_capture(device: torch.device) -> None:
    """Give `device`'s default CUDA generator a state that is not stuck in capture.

    A capture that fails never reaches the generator's capture epilogue, so the generator still
    believes a capture is underway, and every later random op outside a graph (dropout) raises
    "Offset increment outside graph capture encountered unexpectedly": one failed trial would
    fail every later trial of the process (seen on an H100, torch 2.11). A fresh generator takes
    the old seed and offset (`get_state` reads them without the capture flag) and the default
    generator adopts its state, so the random stream goes on where it was.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    stuck = torch.cuda.default_generators[index]
    fresh = torch.Generator(device=f"cuda:{index}")
    fresh.set_state(stuck.get_state())
    stuck.graphsafe_set_state(fresh)
