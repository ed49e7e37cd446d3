"""Train with a tuned `LoopConfig`: the step, feed and loss harvest the tuner measured, for a real
run of any length, with what real training adds.

    trainer = Trainer(workload, config, scheduler=lambda opt: CosineAnnealingLR(opt, 1000),
                      clip_grad_norm=1.0, accumulate=2, eval_data=held_out)
    result = trainer.fit(1000, on_losses=print, eval_every=100,
                         checkpoint_every=250, checkpoint_path="run-{step}.pt")
    Trainer(workload, config, ...).fit(1000, resume_from="run-250.pt")  # same losses from 250

What each addition does under the loop's settings, and why it is correct there:
- Loss callbacks (`on_losses(first_step, losses)`) are called when the configured sync mode
  harvests the losses (every `sync_interval` steps, or as `query` finds them done), in step
  order; they never add a sync.
- Learning-rate schedules: any per-step `torch.optim.lr_scheduler` scheduler, built by a factory
  on the optimizer the loop made (the loop may rebuild it fused or capturable). It steps after
  every optimizer step. A captured step (cuda_graph) replays the learning rate it was captured
  with unless the rate is a device tensor, and a compiled optimizer step recompiles for each new
  float; for those configs each group's `lr` becomes a 0-d tensor on the device, which the
  scheduler updates in place (`fill_`) on the stream the optimizer runs on, between steps.
- Gradient clipping by total norm (`clip_grad_norm`), inside the step, captured with it.
- Gradient accumulation: `accumulate` micro-batches per optimizer step, each loss divided by their
  count (`trainers.step`); a step's loss is their mean. With a CUDA graph the graph holds all of
  them.
- Evaluation every N steps on held-out batches, outside any graph, with the eager model in eval
  mode and no gradients; one host read per evaluation (its mean loss).
- Checkpoints: model, optimizer, scheduler, loss scaler, step count, the RNG states and the data
  position, written atomically after the losses so far are harvested and the device is idle.
  Resuming loads them before the first step and skips the batches already trained on, so a
  resumed run trains on the same batches from the same state as an uninterrupted one; on the
  same device and config its losses equal the uninterrupted run's (`tests/trainers/test_fit.py`).
  Under `compile` that holds only with deterministic kernels: on an H100 (2026-12-06) two
  uninterrupted compiled runs already differed by one ulp at some steps, under Inductor's own
  deterministic mode too; `torch.use_deterministic_algorithms(True)` made runs and resumes equal.
  For that, each epoch's loader draws its base seed from a generator of the run's own
  (`trainers.feed`), not from torch's global one: a model with dropout therefore draws other
  masks than a plain loop over a `DataLoader` whose epochs take that seed from the global
  generator, and its losses differ from that loop's by dropout's noise, not by a fault. Items
  that draw random numbers (augmentation) resume exactly only with neither workers nor
  prefetch (`trainers.feed.positioned_batches` says why).

Refused before any step, each naming what to do instead: `ReduceLROnPlateau` (it steps on a
metric, not per step); a scheduler that cycles momentum (`cycle_momentum=True`) with a captured
or compiled optimizer, which reads the betas/momentum as constants; and a scheduler under a CUDA
graph with an optimizer that is neither capturable nor fused (e.g. plain SGD), whose step reads
a tensor learning rate on the host, which a capture cannot do.

Those refusals and every other check of the options are in `trainers.fit_checks` (of
`eval_data`: `trainers.eval_checks`); the checkpoint's format, its random-number states and
whether a Trainer may resume from it in `trainers.checkpoint` (`CHECKPOINT_FORMAT` and
`checkpoint_file` are importable from here too).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from trainers.checkpoint import (
    CHECKPOINT_FORMAT,
    check_fits,
    check_model,
    check_resumable,
    check_target,
    checkpoint_file,
    checkpoint_of,
    data_of,
    filled_path,
    read_checkpoint,
    refusal_naming,
    rng_state,
    set_rng_state,
)
from trainers.config import REFERENCE, LoopConfig
from trainers.core import Engine, Session
from trainers.errors import ConfigError, WorkloadError
from trainers.eval_checks import (
    check_eval_batch,
    held_out_position,
    held_out_samples,
    moved_batch,
)
from trainers.fit_checks import (
    Deferred,
    DtypesSaid,
    check_fit_arguments,
    check_graph_rates,
    check_options,
    check_schedule_room,
    checked_scheduler,
    checked_workload,
)
from trainers.parts import workload_from_parts
from trainers.precision import Precision
from trainers.schedules import warmup_cosine
from trainers.sparse import check_sparse_gradients
from trainers.streams import StreamPlan, on, wait
from trainers.workloads.as_tuples import original_loss
from trainers.workloads.base import Batch, LossFn, Workload, evaluating
from trainers.workloads.checks import raised_at

__all__ = [
    "CHECKPOINT_FORMAT",
    "EvalCallback",
    "FitResult",
    "LossCallback",
    "SchedulerFactory",
    "Trainer",
    "checkpoint_file",
    "warmup_cosine",
    "workload_from_parts",
]

SchedulerFactory = Callable[[torch.optim.Optimizer], Any]
"""Builds the scheduler on the optimizer the loop made: `lambda opt: CosineAnnealingLR(opt, T)`."""
LossCallback = Callable[[int, list[float]], None]
"""`on_losses(first_step, losses)`: the losses of steps first_step, first_step + 1, ..."""
EvalCallback = Callable[[int, float], None]
"""`on_eval(step, mean_loss)`, after the evaluation that follows step `step`."""


@dataclasses.dataclass(frozen=True)
class FitResult:
    start_step: int
    """The step this call started from (0, or the step of the checkpoint it resumed)."""
    step: int
    """The steps trained in all, this call's included."""
    losses: list[float]
    """This call's losses, one per optimizer step, in order (step start_step first)."""
    evals: list[tuple[int, float]]
    checkpoints: list[str]
    wall_s: float
    n_syncs: int
    """Blocking host syncs the loss harvest made. Under sync_mode synchronize and event, one
    at each step where losses were pending and were harvested: the config's sync points, each
    checkpoint (which harvests the losses before it is written) and the end. Under query, only
    the waits for losses not yet ready (none on a CPU). An evaluation's sync is not counted."""


@dataclasses.dataclass
class _Periodic:
    """What `Trainer.fit` does every so many steps, in this order: evaluate, then write the
    checkpoint (which then holds the RNG state after the evaluation, as an uninterrupted run
    goes on from); and what each gave. `deferred` is asked before a checkpoint is written."""

    deferred: Deferred
    eval_every: int | None
    on_eval: EvalCallback | None
    checkpoint_every: int | None
    checkpoint_path: str | os.PathLike[str] | None
    evals: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    checkpoints: list[str] = dataclasses.field(default_factory=list)

    def after(self, trainer: Trainer, session: Session) -> None:
        """After `trainer.step`'s optimizer step, what is due at it."""
        step = trainer.step
        due = self.checkpoint_every is not None and step % self.checkpoint_every == 0
        save = functools.partial(trainer._checkpoint, session, self.checkpoint_path, self.deferred)
        if self.eval_every is not None and step % self.eval_every == 0:
            self.evals.append(trainer._evaluated(session.plan, self.on_eval, save if due else None))
        if due:
            self.checkpoints.append(save())


class Trainer:
    """Trains `workload` under `config` (see the module doc for every option).

    Everything is built and checked here, before any step: a bad option raises ConfigError
    naming it. `workload.model` is trained in place; `trainer.model` is it, on the device.
    """

    def __init__(
        self,
        workload: Workload,
        config: LoopConfig = REFERENCE,
        *,
        device: str | torch.device = "auto",
        precision: Precision | None = None,
        scheduler: SchedulerFactory | None = None,
        clip_grad_norm: float | None = None,
        accumulate: int = 1,
        eval_data: Iterable[Batch] | None = None,
        eval_loss: LossFn | None = None,
        lr_tensor: bool | None = None,
    ) -> None:
        check_options(
            config,
            accumulate=accumulate,
            clip_grad_norm=clip_grad_norm,
            scheduler=scheduler,
            lr_tensor=lr_tensor,
            eval_loss=eval_loss,
            eval_data=eval_data,
        )
        self.workload = workload = checked_workload(workload, config)
        self.config = config
        self.precision = precision
        self.accumulate = accumulate
        self.clip_grad_norm = None if clip_grad_norm is None else float(clip_grad_norm)
        self.eval_data = eval_data
        self._held_out_at: int | None = None  # `held_out_position`, once `_held_out_read`
        self._held_out_read = False
        # Held-out batches as they are made (a dict, a tensor) get the user's own loss; those of
        # `workload.dataset`, the loop's tuples (`trainers.workloads.as_tuples`), the adapted one.
        self.eval_loss = eval_loss or original_loss(workload.loss_fn)
        self._tuple_loss = None if eval_loss is not None else workload.loss_fn
        check_eval_batch(workload.model, eval_data, self.eval_loss, self._tuple_loss)
        # A captured step bakes a float learning rate into the graph, and a compiled optimizer
        # step recompiles for each new float: a schedule must then change a device tensor.
        graphed = config.cuda_graph or config.optimizer == "compiled"
        self.lr_tensor = scheduler is not None and graphed if lr_tensor is None else lr_tensor
        self._scheduler_factory = scheduler
        self.scheduler: LRScheduler | None = None
        # The loop's parts, as `trainers.run` builds them; `_adopt` sees the optimizer first.
        # No FLOP count: training reports no MFU, and the count reads the dataset's first
        # batch, which a run resumed past it must not load.
        self.engine = Engine(
            workload,
            config,
            device=device,
            precision=precision,
            on_optimizer=self._adopt,
            count_flops=False,
        )
        self.device = self.engine.device
        self.precision_plan = self.engine.precision_plan
        self.model = self.engine.model
        self.optimizer = self.engine.optimizer
        # The compiled wrapper shares the model's parameters; evaluation uses the eager model.
        self.step_model = self.engine.step_model
        self.step = 0

    def _adopt(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        """The optimizer the core built: tensor learning rates where needed, the scheduler."""
        self.optimizer = optimizer
        check_sparse_gradients(
            self.workload.model, optimizer, self.clip_grad_norm, device, self.config.optimizer
        )
        check_graph_rates(
            optimizer, self.config, self.lr_tensor, scheduled=self._scheduler_factory is not None
        )
        if self.lr_tensor:
            for group in optimizer.param_groups:
                if not isinstance(group["lr"], torch.Tensor):
                    group["lr"] = torch.tensor(float(group["lr"]), device=device)
        if self._scheduler_factory is not None:
            built = self._scheduler_factory(optimizer)
            self.scheduler = checked_scheduler(built, optimizer, self.config)

    # ----------------------------------------------------------------------------------------
    # training

    def fit(
        self,
        steps: int,
        *,
        on_losses: LossCallback | None = None,
        eval_every: int | None = None,
        on_eval: EvalCallback | None = None,
        checkpoint_every: int | None = None,
        checkpoint_path: str | os.PathLike[str] | None = None,
        resume_from: str | os.PathLike[str] | None = None,
        allow_nonfinite: bool = False,
    ) -> FitResult:
        """Train until `steps` optimizer steps are done in all (a resumed run counts the steps
        of its checkpoint). A second call goes on from where the first stopped. A NaN or
        infinite loss raises `NonFiniteLoss` as it is harvested, unless `allow_nonfinite`.

        `checkpoint_path` is written every `checkpoint_every` steps; a `{step}` in it is replaced
        by the step (`run-{step}.pt` keeps each checkpoint, `run.pt` the latest only)."""
        self._resume(
            resume_from,
            functools.partial(
                check_fit_arguments,
                *(steps, eval_every, checkpoint_every, checkpoint_path),
                has_eval_data=self.eval_data is not None,
                callbacks={"on_losses": on_losses, "on_eval": on_eval},
            ),
            steps,
        )
        start, deferred = self.step, Deferred(on_losses, allow_nonfinite=allow_nonfinite)
        session = self._session(steps - start, deferred)
        periodic = _Periodic(deferred, eval_every, on_eval, checkpoint_every, checkpoint_path)
        started = time.perf_counter()
        with session:
            said = DtypesSaid(self.model, lambda: self.step)
            for step in range(start, steps):
                with said:
                    session.step(step)
                if self.scheduler is not None:
                    # A tensor learning rate is updated on the stream the optimizer step runs
                    # on: after this step has read it, before the next one does.
                    with on(session.step_fn.optimizer_stream):
                        self.scheduler.step()
                self.step = step + 1
                periodic.after(self, session)
                deferred.raise_any(self.step)
            session.drain()
            deferred.raise_any(self.step)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the wall time covers the queued work
        return FitResult(
            start_step=start,
            step=self.step,
            losses=list(session.losses),
            evals=periodic.evals,
            checkpoints=periodic.checkpoints,
            wall_s=time.perf_counter() - started,
            n_syncs=session.harvester.n_syncs,
        )

    def _resume(
        self, resume_from: str | os.PathLike[str] | None, check: Callable[..., None], steps: int
    ) -> None:
        """The checkpoint read, `check` run with the steps trained by then (`trained=`) and the
        schedule's room for `steps` checked, then the checkpoint restored: a refused fit leaves
        the Trainer as it was (a refused resume had already rewound it to the checkpoint)."""
        state = None if resume_from is None else read_checkpoint(resume_from, self.device)
        trained = self.step if state is None else int(checkpoint_of(state, resume_from)["step"])
        check(trained=trained)
        saved = None if state is None else checkpoint_of(state, resume_from).get("scheduler")
        check_schedule_room(self.scheduler, trained, steps, saved)
        if state is not None:
            self._restore(state, resume_from)

    def _session(self, capacity: int, on_losses: LossCallback) -> Session:
        """The core's session for `capacity` more steps from this one, with the loss callback."""
        session = self.engine.session(
            capacity=capacity,
            first_step=self.step,
            micro_batches=self.accumulate,
            clip_norm=self.clip_grad_norm,
        )
        session.on_losses(on_losses)
        return session

    def _evaluated(
        self, plan: StreamPlan, on_eval: EvalCallback | None, save: Callable[[], str] | None
    ) -> tuple[int, float]:
        """The evaluation after this step, handed to `on_eval`: (step, mean loss). Where it
        raises, the checkpoint due at this step (`save`) is written first, then one line says
        what was raised: a held-out batch the first one's check could not fault (an index past
        the vocabulary, read only by a real run) had lost that checkpoint, under a traceback."""
        try:
            value = self.evaluate(plan)
        except Exception as exc:
            said = " ".join(str(exc).split())[:300]
            written = "" if save is None else f"; this step's checkpoint was written: {save()}"
            raise WorkloadError(
                f"eval_data: the evaluation after step {self.step} raised {type(exc).__name__}"
                f"{raised_at(exc)}: {said}{written}",
                field="eval_data",
            ) from exc
        if on_eval is not None:
            on_eval(self.step, value)
        return self.step, value

    def _checkpoint(
        self, session: Session, path: str | os.PathLike[str] | None, deferred: Deferred
    ) -> str:
        """Write this step's checkpoint to `path` (`checkpoint_file`): where it was written."""
        assert path is not None  # `check_fit_arguments`: checkpoint_every needs a path
        # The losses so far reach the callback before the checkpoint is written, and a NaN
        # among them stops the fit before it: the weights it updated had overwritten the last
        # good checkpoint the error tells the user to resume from (a user's probe, 2026-12-06).
        session.drain()
        deferred.raise_any(self.step)
        return str(self._write(filled_path(path, self.step)))

    # ----------------------------------------------------------------------------------------
    # evaluation

    def evaluate(self, plan: StreamPlan | None = None) -> float:
        """The mean loss over `eval_data`'s samples, with the eager model in eval mode and no
        gradients: each batch's loss weighted by its samples (`held_out_samples`). A mean of
        batches had counted a short last batch of one sample as much as a full one (a user's
        probe, 2026-12-06)."""
        if self.eval_data is None:
            raise ConfigError("eval_data", None, "held-out batches to evaluate on")
        current = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
        if plan is not None:
            # The weights were last written by the optimizer on its stream (the backward stream,
            # or `forward` where a graph replays): evaluation reads them after that.
            wait(current, plan.backward)
            wait(current, plan.forward)
        total: torch.Tensor | None = None
        if not self._held_out_read:  # the training data's first batch, read once
            self._held_out_at, self._held_out_read = held_out_position(self.workload), True
        count, position = 0, self._held_out_at
        # Back to the modes the model had, submodule by submodule (a frozen BatchNorm stays so).
        with evaluating(self.model), torch.no_grad(), self.precision_plan.autocast():
            for batch in self.eval_data:
                moved = moved_batch(batch, self.device)
                loss_fn = self.eval_loss
                if self._tuple_loss is not None and isinstance(moved, tuple):
                    loss_fn = self._tuple_loss
                samples = held_out_samples(moved, position)
                loss = loss_fn(self.model, moved).float() * samples
                total = loss if total is None else total + loss
                count += samples
        if total is None:
            raise ConfigError("eval_data", "empty", "at least one batch")
        # The one host read of an evaluation: the mean loss.
        value = float(total.item()) / count
        if plan is not None:
            # The next steps write the weights this evaluation read, and may reuse its memory.
            wait(plan.forward, current)
            wait(plan.backward, current)
        return value

    # ----------------------------------------------------------------------------------------
    # checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs. Call it between steps: `fit` does, after draining."""
        if self.device.type == "cuda":
            # Every queued step has written the weights and optimizer state read below.
            torch.cuda.synchronize(self.device)
        scaler = self.precision_plan.scaler
        return {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "accumulate": self.accumulate,
            "config": self.config.to_dict(),
            "workload": [self.workload.name, self.workload.preset],
            "data": data_of(self.workload),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "scheduler_kind": None if self.scheduler is None else type(self.scheduler).__name__,
            "scaler": None if scaler is None else scaler.state_dict(),
            "precision": self.precision or "fp32",
            "clip_grad_norm": self.clip_grad_norm,
            "rng": rng_state(self.device),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        with refusal_naming("state"):
            self._restore(state, None)

    def _restore(self, state: Mapping[str, Any], path: str | os.PathLike[str] | None) -> None:
        """`state` restored; `path`: the file it was read from, which a refusal names."""
        # Another model: not its config's fault.
        check_model(checkpoint_of(state, path), self.model, path=path)
        check_resumable(
            state,
            accumulate=self.accumulate,
            config=self.config,
            scheduler=None if self.scheduler is None else type(self.scheduler).__name__,
            precision=self.precision or "fp32",
            clip_grad_norm=self.clip_grad_norm,
        )
        # All checked before anything changes.
        check_fits(state, self.model, self.optimizer, data_of(self.workload), path=path)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for group in self.optimizer.param_groups:
            # load_state_dict puts the saved groups' values in place: the rate is made a device
            # tensor again where this Trainer needs one (and one was saved as a float).
            if isinstance(group["lr"], torch.Tensor):
                group["lr"] = group["lr"].to(self.device)
            elif self.lr_tensor:
                group["lr"] = torch.tensor(float(group["lr"]), device=self.device)
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.precision_plan.scaler is not None and state["scaler"] is not None:
            self.precision_plan.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"], self.device)
        self.step = int(state["step"])

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the checkpoint to `path` atomically (a crash mid-write keeps the previous one),
        a `{step}` in it filled in as `fit`'s `checkpoint_path` is (it had been written as a
        file named `run-{step}.pt`). A folder is refused before anything is written (it had
        left `path.partial` beside it, then raised IsADirectoryError)."""
        return self._write(filled_path(path, self.step) if "{" in str(path) else path)

    def _write(self, path: str | os.PathLike[str]) -> Path:
        target = Path(path)
        check_target(target, "path", str(path), "run.pt")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        torch.save(self.state_dict(), partial)
        os.replace(partial, target)
        return target

    def load(self, path: str | os.PathLike[str]) -> None:
        with refusal_naming("path"):
            self._restore(read_checkpoint(path, self.device), path)
