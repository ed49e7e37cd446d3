"""The checks of a `Trainer`'s options and of `Trainer.fit`'s arguments (`trainers.fit`), made
before any step: each raises a ConfigError naming the first bad one and what to give instead.
"""

from __future__ import annotations

import inspect
import itertools
import math
import os
import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler, OneCycleLR, ReduceLROnPlateau

from trainers.checkpoint import checkpoint_file
from trainers.config import LoopConfig
from trainers.core import check_micro_batches
from trainers.errors import ConfigError, NonFiniteLoss, WorkloadError
from trainers.eval_checks import check_eval_data
from trainers.workloads.base import Workload
from trainers.workloads.checks import checked, own_workload, raised_at


def check_options(
    config: object,
    *,
    accumulate: object,
    clip_grad_norm: object,
    scheduler: object,
    lr_tensor: object,
    eval_loss: object,
    eval_data: object,
) -> None:
    """ConfigError naming the first bad Trainer option (the device and precision are the
    core's to check)."""
    if not isinstance(config, LoopConfig):
        raise ConfigError("config", type(config).__name__, "a trainers.LoopConfig")
    check_micro_batches(config, accumulate, field="accumulate")  # type: ignore[arg-type]
    if clip_grad_norm is not None and (
        isinstance(clip_grad_norm, bool)
        or not isinstance(clip_grad_norm, int | float)
        or not clip_grad_norm > 0
    ):
        raise ConfigError("clip_grad_norm", clip_grad_norm, "None or a number > 0")
    if scheduler is not None and not callable(scheduler):
        raise ConfigError(
            "scheduler",
            type(scheduler).__name__,
            "None or a factory: lambda optimizer: CosineAnnealingLR(optimizer, T_max)",
        )
    if isinstance(scheduler, type) and _needs_settings(scheduler):
        # StepLR itself had raised torch's "missing 1 required positional argument" at build.
        raise ConfigError(
            "scheduler",
            scheduler.__name__,
            f"a factory of the optimizer with the scheduler's settings: lambda optimizer: "
            f"{scheduler.__name__}(optimizer, ...)",
        )
    if lr_tensor is not None and not isinstance(lr_tensor, bool):
        raise ConfigError("lr_tensor", lr_tensor, "None (decided by the config), true or false")
    if eval_loss is not None and not callable(eval_loss):
        raise ConfigError("eval_loss", type(eval_loss).__name__, "None or loss_fn(model, batch)")
    check_eval_data(eval_data)


def _needs_settings(kind: type) -> bool:
    """Whether the class `kind` takes a required argument after the optimizer."""
    try:
        parameters = list(inspect.signature(kind).parameters.values())[1:]
    except (TypeError, ValueError):  # no signature to read: left to the build
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.default is p.empty and p.kind in positional for p in parameters)


def check_positive(field: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(field, value, "an integer >= 1")


def check_fit_arguments(
    steps: int,
    eval_every: int | None,
    checkpoint_every: int | None,
    checkpoint_path: str | os.PathLike[str] | None,
    *,
    trained: int,
    has_eval_data: bool,
    callbacks: Mapping[str, Any] | None = None,
) -> None:
    """`fit`'s arguments, for a Trainer that has trained `trained` steps already and has
    held-out batches to evaluate on or not (`has_eval_data`); `callbacks` by name, each None
    or callable (one that is not had raised TypeError after the first steps had trained)."""
    for name, callback in (callbacks or {}).items():
        if callback is not None and not callable(callback):
            raise ConfigError(name, callback, "a callable, or None")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < trained + 1:
        raise ConfigError("steps", steps, f"an integer > {trained} (the steps already trained)")
    if eval_every is not None:
        check_positive("eval_every", eval_every)
        if not has_eval_data:
            raise ConfigError("eval_every", eval_every, "None when the Trainer has no eval_data")
    if checkpoint_every is None and checkpoint_path is not None:
        raise ConfigError(
            "checkpoint_every",
            None,
            "an integer >= 1 when checkpoint_path is set (or save with trainer.save(path))",
        )
    if checkpoint_every is not None:
        check_positive("checkpoint_every", checkpoint_every)
        if checkpoint_path is None:
            raise ConfigError("checkpoint_path", None, "a file path when checkpoint_every is set")
        # Its placeholders and that it is no folder, before a step rather than at the first
        # checkpoint (a folder had raised IsADirectoryError there, the steps trained lost).
        checkpoint_file(checkpoint_path, trained)


def check_graph_rates(
    optimizer: torch.optim.Optimizer, config: LoopConfig, lr_tensor: bool, *, scheduled: bool
) -> None:
    """ConfigError where a scheduler's rates cannot reach a captured step: a float rate (baked
    into the graph at capture), or a tensor rate the optimizer reads on the host."""
    if not lr_tensor and scheduled and config.cuda_graph:
        raise ConfigError(
            "lr_tensor",
            False,
            "None or true with cuda_graph=True and a scheduler (a float rate is baked into "
            "the graph at capture and the schedule would be lost)",
        )
    if lr_tensor and config.cuda_graph:
        # A foreach or for-loop step reads a tensor rate on the host (`alpha=-lr`), which a
        # capture refuses (seen on an H100: SGD, cudaErrorStreamCaptureUnsupported); the
        # capturable and fused kernels read it on the device.
        for group in optimizer.param_groups:
            if not (group.get("capturable") or group.get("fused")):
                raise ConfigError(
                    "scheduler",
                    type(optimizer).__name__,
                    "with cuda_graph=True a scheduler needs an optimizer that reads its "
                    "learning rate on the device: optimizer='fused', or one built with "
                    "capturable=True (Adam, AdamW, ...); or a config without cuda_graph",
                )


def checked_scheduler(
    scheduler: Any, optimizer: torch.optim.Optimizer, config: LoopConfig
) -> LRScheduler:
    """The scheduler a `scheduler=` factory built on `optimizer`, refused where it cannot step
    per step under `config` (see `trainers.fit`'s module doc)."""
    if isinstance(scheduler, ReduceLROnPlateau):
        raise ConfigError(
            "scheduler",
            "ReduceLROnPlateau",
            "a per-step schedule (LambdaLR, CosineAnnealingLR, OneCycleLR, SequentialLR, "
            "...): ReduceLROnPlateau steps on a metric; step it yourself from on_eval",
        )
    if not isinstance(scheduler, LRScheduler):
        raise ConfigError(
            "scheduler",
            type(scheduler).__name__,
            "a factory returning a torch.optim.lr_scheduler.LRScheduler",
        )
    if scheduler.optimizer is not optimizer:
        raise ConfigError(
            "scheduler",
            type(scheduler).__name__,
            "a scheduler built on the optimizer the factory receives (the loop may rebuild "
            "the workload's optimizer fused or capturable)",
        )
    captured = config.cuda_graph or config.optimizer == "compiled"
    if captured and getattr(scheduler, "cycle_momentum", False):
        raise ConfigError(
            "scheduler",
            f"{type(scheduler).__name__}(cycle_momentum=True)",
            "cycle_momentum=False with cuda_graph=True or optimizer='compiled' (a captured "
            "or compiled optimizer step reads momentum/betas as constants), or a config "
            "without them",
        )
    return scheduler


def check_schedule_room(
    scheduler: LRScheduler | None, start: int, steps: int, saved: Mapping[str, Any] | None = None
) -> None:
    """ConfigError naming `steps` where the scheduler ends before them: OneCycleLR raises "Tried
    to step N times" past its `total_steps`, after that step trained (a probe, 2026-12-07).
    `saved`: the scheduler's state in the checkpoint a fit resumes, which it will step on from."""
    if not isinstance(scheduler, OneCycleLR):
        return
    state = scheduler.state_dict() if saved is None else saved
    total, done = int(state["total_steps"]), int(state["last_epoch"])
    if steps - start > total - done:
        raise ConfigError(
            "steps",
            steps,
            f"at most {start + total - done}: the scheduler OneCycleLR(total_steps={total}) ends "
            f"there and raises past it; build it with total_steps={done + steps - start}, or fit "
            "fewer steps",
        )


def check_parts(
    data: object, loss_fn: object, batch_size: int | None, samples_per_batch: int | None = None
) -> None:
    """ConfigError for the parts of `workload_from_parts` that would fail every step with a
    message about tensors: a criterion `(input, target)` such as nn.CrossEntropyLoss() or
    F.cross_entropy as the loss, which is called as `loss_fn(model, batch)`; a TensorDataset
    (its items are samples) without a batch size, each step then one sample without its batch
    dimension; a `samples_per_batch` not a count, or not the batch size given."""
    if samples_per_batch is not None:
        check_positive("samples_per_batch", samples_per_batch)
        if batch_size is not None and samples_per_batch != batch_size:
            raise ConfigError(
                "samples_per_batch",
                samples_per_batch,
                f"None or batch_size ({batch_size}) beside batch_size: a loader of batch_size "
                "batches that many samples; samples_per_batch counts a whole-batch item's",
            )
    criterion = isinstance(loss_fn, nn.modules.loss._Loss) or (
        getattr(loss_fn, "__module__", None) == "torch.nn.functional"
    )
    if criterion or not callable(loss_fn):
        raise ConfigError(
            "loss_fn",
            getattr(loss_fn, "__name__", type(loss_fn).__name__),
            "a function loss_fn(model, batch) -> scalar loss, e.g. "
            "def loss(model, batch): x, y = batch; return F.cross_entropy(model(x), y)",
        )
    indexed = hasattr(data, "__getitem__") and hasattr(data, "__len__")
    if not indexed and not isinstance(data, torch.utils.data.IterableDataset):
        raise ConfigError(
            "data",
            type(data).__name__,
            "a Dataset with __getitem__ and __len__, an IterableDataset, a list of batches, or a "
            "DataLoader over any of them (a generator is read once: wrap it in an "
            "IterableDataset whose __iter__ makes it anew)",
        )
    if batch_size is None and isinstance(data, torch.utils.data.TensorDataset):
        raise ConfigError(
            "batch_size",
            None,
            "an integer for a Dataset of samples (a TensorDataset's items are samples); None only "
            "for a dataset whose items are whole batches (trainers.workloads.SyntheticBatches)",
        )


def checked_workload(workload: Workload, config: LoopConfig) -> Workload:
    """A `Workload` built by hand (`examples/my_workload.py`'s way), checked and its dict or
    tensor batches fed as tuples, as a factory's are; one that was (a factory's) as it is.
    Anything else (`Trainer(model)`, which raised AttributeError 'name') is named. A stream
    that `config`'s workers would each yield whole is refused (`_check_stream_workers`)."""
    if not isinstance(workload, Workload):
        raise ConfigError(
            "workload",
            type(workload).__name__,
            "a Workload: trainers.workload_from_parts(model, data, loss_fn, optimizer=...)",
        )
    workload = workload if checked(workload) else own_workload(workload, workload.name)
    _check_stream_workers(workload, config.num_workers)
    return workload


def _check_stream_workers(workload: Workload, workers: int) -> None:
    """ConfigError naming `num_workers` where the dataset is an IterableDataset that each of
    the DataLoader's workers copies whole and yields whole: every batch came `workers` times,
    and the run trained on them without a word (a user's probe, 2026-12-06). Seen as the
    first two batches of two workers being one batch, where one process's two differ; a
    stream that shards by get_worker_info() passes. It costs two worker processes, once."""
    if workers < 2 or not isinstance(workload.dataset, torch.utils.data.IterableDataset):
        return

    def first_two(processes: int) -> list[Any]:
        loader = torch.utils.data.DataLoader(
            workload.dataset,
            batch_size=workload.batch_size,
            collate_fn=workload.collate_fn,
            num_workers=processes,
        )
        return list(itertools.islice(loader, 2))

    plain = first_two(0)
    if len(plain) < 2 or _same(plain[0], plain[1]):
        return
    split = first_two(2)
    if len(split) == 2 and _same(split[0], split[1]):
        raise ConfigError(
            "num_workers",
            workers,
            "0 for this IterableDataset, which each DataLoader worker copies and yields whole: "
            "every batch came once per worker; or shard it by "
            "torch.utils.data.get_worker_info() (worker i yields every num_workers-th item)",
        )


def _same(one: Any, other: Any) -> bool:
    """Whether two batches (tensors, or tuples or dicts of them) hold the same values."""
    if isinstance(one, torch.Tensor) and isinstance(other, torch.Tensor):
        return one.shape == other.shape and bool(torch.equal(one, other))
    if isinstance(one, Mapping) and isinstance(other, Mapping):
        return list(one) == list(other) and all(_same(one[k], other[k]) for k in one)
    if isinstance(one, tuple | list) and isinstance(other, tuple | list):
        return len(one) == len(other) and all(_same(a, b) for a, b in zip(one, other, strict=True))
    try:
        return bool(one == other)
    except Exception:  # noqa: BLE001 - an object without a plain truth of ==: not the same
        return False


def from_loader(
    data: torch.utils.data.DataLoader[Any], batch_size: int | None, collate_fn: Any
) -> tuple[torch.utils.data.Dataset[Any], int | None, Any]:
    """A DataLoader given to `workload_from_parts` as its dataset, batch size and collate_fn
    (those given beside it win); a ConfigError naming `data` where it is not in dataset
    order."""
    stream = isinstance(data.dataset, torch.utils.data.IterableDataset)  # no sampler: in order
    if not stream and not isinstance(data.sampler, torch.utils.data.SequentialSampler):
        raise ConfigError(
            "data",
            f"DataLoader(sampler={type(data.sampler).__name__})",
            "a DataLoader in dataset order (shuffle=False, no sampler): the tuned loop builds "
            "its own loader in dataset order; shuffle the dataset itself, e.g. "
            "Subset(dataset, torch.randperm(n, generator=seeded))",
        )
    for option in ("worker_init_fn", "multiprocessing_context"):
        if getattr(data, option, None) is not None:
            # Dropped with the loader: a worker_init_fn that opened each worker's file handle
            # had failed in every trial with workers, the baselines without passing (a
            # user's probe, 2026-12-06).
            raise ConfigError(
                "data",
                f"DataLoader({option}=...)",
                f"a DataLoader without {option}: the tuned loop builds its own loader and "
                "workers; open what each worker needs lazily in the dataset's __getitem__ "
                "(torch.utils.data.get_worker_info() tells the worker)",
            )
    sampler = data.batch_sampler
    if data.batch_size is None and sampler is not None:
        # batch_size was None beside a batch_sampler, and the loop had fed single samples.
        if type(sampler) is not torch.utils.data.BatchSampler or not isinstance(
            sampler.sampler, torch.utils.data.SequentialSampler
        ):
            raise ConfigError(
                "data",
                f"DataLoader(batch_sampler={type(sampler).__name__})",
                "a DataLoader of batch_size=N in dataset order, or of "
                "BatchSampler(SequentialSampler(dataset), N, drop_last)",
            )
        batch_size = sampler.batch_size if batch_size is None else batch_size
    batch_size = data.batch_size if batch_size is None else batch_size
    if collate_fn is None and data.collate_fn is not torch.utils.data.default_collate:
        collate_fn = data.collate_fn
    return data.dataset, batch_size, collate_fn


class Deferred:
    """A user's loss callback (`Trainer.fit(on_losses=...)`) whose exception waits until the
    step that harvested its losses is counted: raised from inside the loop's harvest, it had
    left `Trainer.step` one behind the optimizer steps taken and the scheduler unstepped, and
    the next `fit` trained a batch twice (a user's probe, 2026-12-05). The first NaN or
    infinite loss waits so too, as `NonFiniteLoss`, unless `allow_nonfinite`: the loop had
    trained on from it without a word, where the CLI stops (a user's probe, 2026-12-06)."""

    def __init__(self, callback: Any, *, allow_nonfinite: bool = False) -> None:
        self.callback = callback  # None: no callback, nothing to raise
        self.allow_nonfinite = allow_nonfinite
        self.error: BaseException | None = None
        self.nonfinite: tuple[int, float] | None = None  # (step counted from 1, loss)

    def __call__(self, first: int, losses: list[float]) -> None:
        if self.callback is not None and self.error is None:  # none after a failure
            try:
                self.callback(first, losses)
            except BaseException as exc:  # noqa: BLE001 - re-raised by `raise_any`, whole
                self.error = exc
        if self.nonfinite is None and not self.allow_nonfinite:
            # Host floats already harvested by the sync mode: the check adds no sync.
            bad = next((i for i, loss in enumerate(losses) if not math.isfinite(loss)), None)
            if bad is not None:
                self.nonfinite = (first + bad + 1, losses[bad])

    def raise_any(self, trained: int) -> None:
        """Raise what the callback raised, then a non-finite loss, once the loop has counted
        the step (`trained`: the steps done)."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        if self.nonfinite is not None:
            step, value = self.nonfinite
            self.nonfinite = None
            raise NonFiniteLoss(step, value, trained)


_DTYPES_DISAGREE = re.compile(
    r"dtype|scalar types?\b|type \(\w+\) and \w+ type|Expected floating point type"
)


class DtypesSaid:
    """Around each step of `Trainer.fit`: an error of dtypes that disagree (a float64 batch
    from NumPy, half features, float labels) is one line naming `data`. The build's meta run
    cannot see it (a meta matmul takes any dtypes), so it had reached the user as torch's
    traceback at the first step, where the tuner's default loop says it (a user's probe,
    2026-12-06). `trained`: the steps done so far."""

    def __init__(self, model: nn.Module, trained: Any) -> None:
        self.model, self.trained = model, trained

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if not isinstance(exc, RuntimeError | TypeError):
            return
        cause, link = exc, exc.__cause__ or exc.__context__
        for _ in range(8):  # torch's own words under the compiler's wrapping
            if link is None:
                break
            if isinstance(link, RuntimeError | TypeError):
                cause = link
            link = link.__cause__ or link.__context__
        said = " ".join(str(cause).split())
        if _DTYPES_DISAGREE.search(said) is None:
            return
        own = sorted({str(p.dtype).removeprefix("torch.") for p in self.model.parameters()})
        double = ""
        if ("Double" in said or "float64" in said) and "float64" in own:
            # The model is the float64 side: `.float()` on the data had been the advice.
            double = " (the model's parameters are float64: .double() the data, or .float() both)"
        elif "Double" in said or "float64" in said:
            double = " (NumPy arrays and torch.from_numpy give float64: .float() them)"
        raise WorkloadError(
            f"data: step {self.trained() + 1} raised {type(exc).__name__}{raised_at(exc)}: "
            f"{said[:300]}: the batch's dtypes do not fit the model (parameters "
            f"{', '.join(own)}) or the loss; cast them in the dataset or the loss (.float() "
            f"features, .long() class labels){double}",
            field="data",
        ) from exc


OPTIMIZER_ALLOWED = (
    "a torch.optim.Optimizer built on the model's parameters, or a factory of one "
    "(torch.optim.AdamW, or lambda params: torch.optim.AdamW(params, lr=3e-4)); a name is not "
    "looked up"
)


def shown_value(value: object) -> object:
    """`value` where it reads as itself in an error (a name, a number), else its type's name: a
    string had been shown as 'str'."""
    return value if isinstance(value, str | int | float | bool | None) else type(value).__name__
