"""The `Workload` interface: a model, a deterministic dataset, a loss and an optimizer recipe.

A workload factory is any callable `factory(preset: str, *, seed: int) -> Workload`. The same
preset and seed must give the same initial weights and the same batches, so two runs can be
compared loss for loss (`trainers.gate.parity`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, cast

import torch
from torch import nn
from torch.utils.data import Dataset

from trainers.errors import WorkloadError, did_you_mean

Batch = tuple[torch.Tensor, ...]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]
OptimizerFactory = Callable[[Iterable[nn.Parameter], bool], torch.optim.Optimizer]


class WorkloadFactory(Protocol):
    def __call__(self, preset: str, *, seed: int) -> Workload: ...


def adam(lr: float = 1e-3) -> OptimizerFactory:
    """Adam; `capturable=True` keeps its step counter on the device, as CUDA graphs require."""

    def make(params: Iterable[nn.Parameter], capturable: bool) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=lr, capturable=capturable)

    return make


def adamw(lr: float = 1e-3, weight_decay: float = 0.01) -> OptimizerFactory:
    """AdamW, the usual optimizer of the library models (`trainers.workloads.vision`, `.text`);
    `capturable=True` keeps its step counter on the device, as CUDA graphs require."""

    def make(params: Iterable[nn.Parameter], capturable: bool) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, capturable=capturable)

    return make


class SyntheticBatches(Dataset[Batch]):
    """Batches made once from a seeded generator; item i is batch i (use with batch_size=None).

    Serving whole batches keeps per-sample Python out of the loop, so the DataLoader's cost is
    the real cost of moving a batch (worker IPC, pinning), not an artefact of indexing.
    """

    def __init__(self, tensors: Batch) -> None:
        if not tensors:
            raise WorkloadError("SyntheticBatches needs at least one tensor")
        n = tensors[0].shape[0]
        if any(t.shape[0] != n for t in tensors):
            raise WorkloadError("SyntheticBatches: every tensor needs the same number of batches")
        self.tensors = tensors

    def __len__(self) -> int:
        return int(self.tensors[0].shape[0])

    def __getitem__(self, index: int) -> Batch:
        return tuple(t[index] for t in self.tensors)


@dataclasses.dataclass(kw_only=True)
class Workload:
    """What the loop trains. `dataset[i]` is one batch when `batch_size` is None (the built-ins),
    or one sample that the DataLoader batches when `batch_size` is an integer.

    `collate_fn` turns a list of samples into one batch (a tuple of tensors; a user's dict of
    tensors, or one tensor, is fed as one: `trainers.workloads.as_tuples`) when `batch_size` is
    an integer; None keeps the DataLoader's default (stacking). It runs in the loader's worker
    processes when `num_workers > 0` (picklable, a module-level function or class, where workers
    are spawned rather than forked).

    `loss_fn(model, batch)` returns a scalar loss with the batch already on the model's device. It
    must not sync with the host (no `.item()`, no data-dependent shapes) if the workload is to be
    captured in a CUDA graph.

    `blocks(model)` returns the model's repeated blocks in forward order, where activation
    checkpointing and regional compilation apply; None: found by structure (`trainers.blocks`).
    """

    name: str
    preset: str
    model: nn.Module
    dataset: Dataset[Batch]
    loss_fn: LossFn
    samples_per_batch: int
    make_optimizer: OptimizerFactory = dataclasses.field(default_factory=adam)
    batch_size: int | None = None
    tokens_per_sample: int | None = None
    collate_fn: Callable[[list[Any]], Batch] | None = None
    blocks: Callable[[nn.Module], Sequence[nn.Module]] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise WorkloadError(f"workload {self.name!r}: model must be an nn.Module")
        size = self.batch_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            # Caught here, not as an IndexError from the loader's first (empty) batch.
            raise WorkloadError(
                f"workload {self.name!r}: batch_size={size!r} is invalid: allowed an integer "
                ">= 1, or None for a dataset whose items are whole batches"
            )
        if self.samples_per_batch < 1:
            raise WorkloadError(f"workload {self.name!r}: samples_per_batch must be >= 1")
        self.make_optimizer = optimizer_factory(self.make_optimizer)


def item_as_loaded(workload: Workload, item: Any) -> Any:
    """An item that is a whole batch (`batch_size` None) as the loader gives it: through its
    collate_fn, else with NumPy arrays made tensors (`default_convert`), as a DataLoader of
    batch_size None converts each item."""
    convert: Any = workload.collate_fn or torch.utils.data.default_convert
    return convert(item)


def optimizer_factory(given: Any) -> OptimizerFactory:
    """`given` as a factory `(params, capturable) -> Optimizer`: an optimizer class
    (`torch.optim.Adam`) is built with its defaults, and `capturable` where it takes one; a
    factory of the parameters alone is given them alone. Either was called as
    `(params, capturable)`, and `torch.optim.Adam(params, False)` trains at a learning rate of
    False, that is 0, with no error (a new user's trial, 2026-12-02)."""
    if isinstance(given, type) and issubclass(given, torch.optim.Optimizer):
        cls: Callable[..., torch.optim.Optimizer] = given
        takes = "capturable" in inspect.signature(cls).parameters

        def build(params: Iterable[nn.Parameter], capturable: bool) -> torch.optim.Optimizer:
            return cls(params, capturable=capturable) if takes else cls(params)

        return build
    try:
        signature = inspect.signature(given)
    except (TypeError, ValueError):  # not callable, or no signature to read: as it is
        return cast(OptimizerFactory, given)
    if not _binds(signature, 1):  # needs two: (params, capturable), as the loop calls it
        return cast(OptimizerFactory, given)
    # It takes the parameters alone; a second positional parameter with a default is not
    # `capturable` unless so named: `partial(SGD, momentum=0.9)` and `lambda p, lr=0.5: ...` had
    # been called as (params, False) and trained at a learning rate of False (a user's probe,
    # 2026-12-05). One named `capturable` (`partial(Adam, lr=1e-2)`) gets it by name.
    named = "capturable" in signature.parameters
    alone = given

    def of_params(params: Iterable[nn.Parameter], capturable: bool) -> torch.optim.Optimizer:
        if named:
            return cast(torch.optim.Optimizer, alone(params, capturable=capturable))
        return cast(torch.optim.Optimizer, alone(params))

    return of_params


def _binds(signature: inspect.Signature, positional: int) -> bool:
    try:
        signature.bind(*range(positional))
    except TypeError:
        return False
    return True


# What the gate must switch off to compare runs loss for loss: every random draw of a training
# step. Modules that draw keep their probability in an attribute: the nn.Dropout family's `p`,
# torchvision's StochasticDepth `p`, timm's DropPath and DropBlock2d `drop_prob`.
_RANDOM_MODULE = re.compile(r"drop|stochasticdepth", re.IGNORECASE)
_RANDOM_MODULE_ATTRIBUTES = ("p", "prob", "drop_prob", "drop_rate")  # timm PatchDropout: prob
# Others keep it as a float attribute of the module that calls the functional form, or read it
# from the model's config in forward: nn.MultiheadAttention's `dropout`, timm's `drop_rate`
# (classifier dropout), transformers' `attention_dropout`, `dropout_prob` (BERT's SDPA attention
# before transformers 5), `attn_pdrop`, `layerdrop` (whole layers skipped at random), and other
# noise drawn in training only: a mixture-of-experts router's `jitter_noise` (Mixtral's
# `router_jitter_noise`), SpecAugment's `mask_time_prob` and `mask_feature_prob` (wav2vec 2).
_DROPOUT_NAME = re.compile(
    r"dropout|pdrop|drop_prob|drop_rate|drop_path|layerdrop|jitter_noise|mask_(time|feature)_prob",
    re.IGNORECASE,
)


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """`model` in eval mode for the block, then each module back in the mode it had: `train()`
    on the way out would switch a submodule its owner froze in eval (a BatchNorm) to train."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training


def disable_dropout(model: nn.Module) -> int:
    """Set every dropout and stochastic-depth probability in `model` to zero; returns how many
    were changed.

    Reaches the probabilities that modules hold (see `_RANDOM_MODULE`) and float attributes named
    like one on any module or on its `config` (see `_DROPOUT_NAME`). A probability passed as a
    literal (`F.dropout(x, 0.1, self.training)`) is out of reach: such a model still draws random
    numbers in training, and the gate cannot compare a graph or a compiled step with it bit for
    bit.
    """
    changed = 0
    for module in model.modules():
        holders: list[Any] = [module]
        config = getattr(module, "config", None)
        if config is not None and not isinstance(config, nn.Module | torch.Tensor):
            holders.append(config)
        for holder in holders:
            for name, value in list(vars(holder).items()):
                probability = _DROPOUT_NAME.search(name) or (
                    holder is module
                    and name in _RANDOM_MODULE_ATTRIBUTES
                    and _RANDOM_MODULE.search(type(module).__name__)
                )
                if probability and _is_probability(value) and value != 0.0:
                    setattr(holder, name, 0.0)
                    changed += 1
    return changed


def _is_probability(value: object) -> bool:
    return isinstance(value, float) and 0.0 <= value <= 1.0


def check_preset(workload: str, preset: str, presets: Iterable[str]) -> None:
    names = list(presets)
    if preset not in names:
        raise WorkloadError(
            f"preset={preset!r} is invalid for workload {workload!r}: allowed {', '.join(names)}"
            + did_you_mean(preset, names),
            field="preset",
        )
