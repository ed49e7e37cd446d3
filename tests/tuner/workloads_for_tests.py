"""Workloads for the tuner's tests, loaded with `--workload tests.tuner.workloads_for_tests:NAME`.

Each one is tiny (an 8 -> 3 linear classifier, 4 samples a batch) and fails in a known way:
- `raises_in_loss`: every step raises a device fault (CUDA's text, as a GPU whose context is
  broken raises), so every measurement (baselines included) fails; a fault in the user's code
  that is no device's stops the job before its trials instead (`tuner.search.measuring`);
- `fails_in_workers`: batches made in a DataLoader worker process raise, so only configs with
  `num_workers > 0` fail (the baselines, with 0 workers, run);
- `interrupts_when_armed`: a step raises KeyboardInterrupt once `ARMED["interrupt"]` is set, as
  Ctrl-C would;
- `slow_when_armed`: a step sleeps `SLOW_STEP_S` once `ARMED["slow"]` is set (a config that is
  far slower than every earlier one, for the pruner);
- `paced`: every step sleeps `PACE_S`, as a host waits on a GPU: a trial costs the same on an idle
  machine and a loaded one, so a test of several workers is not a race against imports;
- `own_loss_function`: fails in no way; its model computes its loss through a `loss_function`
  of its own, as a Hugging Face model does, so the `loss` lever can compile it on a CPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import Dataset, get_worker_info

from trainers import Workload
from trainers.workloads import Batch, SyntheticBatches, adam
from trainers.workloads.mlp import classification_loss

INJECTED = "CUDA error: injected failure: the loss exploded"
WORKER_FAILURE = "injected failure: batches cannot be made in a worker process"
ARMED = {"interrupt": False, "slow": False}
SLOW_STEP_S = 0.01

LossFn = Callable[[nn.Module, Batch], torch.Tensor]


def _batches(seed: int) -> SyntheticBatches:
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(8, 4, 8, generator=generator)
    return SyntheticBatches((x, torch.randint(0, 3, (8, 4), generator=generator)))


def _workload(
    name: str,
    preset: str,
    seed: int,
    dataset: Dataset[Batch],
    loss_fn: LossFn = classification_loss,
) -> Workload:
    torch.manual_seed(seed)
    return Workload(
        name=name,
        preset=preset,
        model=nn.Linear(8, 3),
        dataset=dataset,
        loss_fn=loss_fn,
        samples_per_batch=4,
        make_optimizer=adam(1e-2),
    )


def raises_in_loss(preset: str, *, seed: int) -> Workload:
    def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
        raise RuntimeError(INJECTED)

    return _workload("raises_in_loss", preset, seed, _batches(seed), loss_fn)


INJECTED_AT = raises_in_loss.__code__.co_firstlineno + 2
"""The line of `raises_in_loss`'s raise: a failure's reason names where the user's code raised."""


class _MainProcessOnly(Dataset[Batch]):
    def __init__(self, seed: int) -> None:
        self.batches = _batches(seed)

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> Batch:
        if get_worker_info() is not None:
            raise RuntimeError(WORKER_FAILURE)
        return self.batches[index]


def fails_in_workers(preset: str, *, seed: int) -> Workload:
    return _workload("fails_in_workers", preset, seed, _MainProcessOnly(seed))


def interrupts_when_armed(preset: str, *, seed: int) -> Workload:
    def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
        if ARMED["interrupt"]:
            raise KeyboardInterrupt
        return classification_loss(model, batch)

    return _workload("interrupts_when_armed", preset, seed, _batches(seed), loss_fn)


def slow_when_armed(preset: str, *, seed: int) -> Workload:
    def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
        if ARMED["slow"]:
            time.sleep(SLOW_STEP_S)
        return classification_loss(model, batch)

    return _workload("slow_when_armed", preset, seed, _batches(seed), loss_fn)


PACE_S = 0.1


def paced(preset: str, *, seed: int) -> Workload:
    def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
        time.sleep(PACE_S)
        return classification_loss(model, batch)

    return _workload("paced", preset, seed, _batches(seed), loss_fn)


OOM_SAMPLES = 2
"""`needs_micro_batches` runs out of memory on any forward of more samples than this."""


def needs_micro_batches(preset: str, *, seed: int) -> Workload:
    """A model whose step 'does not fit' above OOM_SAMPLES samples a forward: it raises the
    error CUDA raises (`torch.cuda.OutOfMemoryError`, which a CPU build has too), with what it
    asked for, as a model too large for its device does. micro_batches >= 2 make it fit."""

    def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
        x, _ = batch
        if x.shape[0] > OOM_SAMPLES:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (a forward of {x.shape[0]} "
                "samples). GPU 0 has a total capacity of 1.00 GiB of which 0.50 GiB is free."
            )
        return classification_loss(model, batch)

    return _workload("needs_micro_batches", preset, seed, _batches(seed), loss_fn)


class _WithLossFunction(nn.Linear):
    """A classifier that computes its loss through `self.loss_function`, the attribute the `loss`
    lever compiles (`trainers.levers.loss`)."""

    def __init__(self) -> None:
        super().__init__(8, 3)
        self.loss_function = nn.functional.cross_entropy


def own_loss_function(preset: str, *, seed: int) -> Workload:
    def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
        x, y = batch
        computed: torch.Tensor = model.loss_function(model(x), y)
        return computed

    workload = _workload("own_loss_function", preset, seed, _batches(seed), loss_fn)
    torch.manual_seed(seed)
    workload.model = _WithLossFunction()
    return workload


def half_parameters(preset: str, *, seed: int) -> Workload:
    """A model cast to float16 by its user: fp16-autocast's gradient scaler cannot unscale it."""

    def loss_fn(model: nn.Module, batch: Batch) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0].half()).float(), batch[1])

    workload = _workload("half_parameters", preset, seed, _batches(seed), loss_fn)
    workload.model = workload.model.half()
    return workload
