"""A user's own workloads as a new user wrote them (a trial of 2026-12-02), loaded with
`--workload tests.trainers.own_workloads:NAME`: each failed every step. Dict and bare-tensor
batches are now fed as tuples (`trainers.workloads.as_tuples`); the others are refused when built
(`trainers.workloads.checks`). `NAME_fixed` is the same with the fix the error names, and builds."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.data import Dataset

from trainers import Workload
from trainers.workloads.mlp import classification_loss


class Pair(NamedTuple):
    """A sample as a namedtuple: module-level, as a spawned loader worker unpickles it."""

    x: torch.Tensor
    y: torch.Tensor


class _Samples(Dataset[Any]):
    """Eight samples of 6 features and a class of 3, as `shape` gives each."""

    def __init__(self, shape: str) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(8, 6, generator=generator)
        self.y = torch.randint(0, 3, (8,), generator=generator)
        self.shape = shape

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> Any:
        if self.shape == "dict":
            return {"features": self.x[index], "label": self.y[index]}
        if self.shape == "dict-with-text":
            return {"features": self.x[index], "label": self.y[index], "text": f"sample {index}"}
        if self.shape == "tensor":
            return self.x[index]
        if self.shape == "namedtuple":
            return Pair(self.x[index], self.y[index])
        return self.x[index], self.y[index]


def _workload(shape: str = "tuple", loss_fn: Any = classification_loss, **more: Any) -> Workload:
    torch.manual_seed(0)
    fields: dict[str, Any] = {
        "name": "own",
        "preset": "tiny",
        "model": nn.Linear(6, 3),
        "dataset": _Samples(shape),
        "loss_fn": loss_fn,
        "samples_per_batch": 4,
        "batch_size": 4,
    }
    return Workload(**(fields | more))


def tuple_batches(preset: str, *, seed: int) -> Workload:
    return _workload()


def dict_batches(preset: str, *, seed: int) -> Workload:
    return _workload("dict", lambda m, b: nn.functional.cross_entropy(m(b["features"]), b["label"]))


def dict_batches_with_text(preset: str, *, seed: int) -> Workload:
    return _workload(
        "dict-with-text", lambda m, b: nn.functional.cross_entropy(m(b["features"]), b["label"])
    )


def tensor_batches(preset: str, *, seed: int) -> Workload:
    return _workload("tensor", lambda m, b: m(b).pow(2).mean())


def tuple_loss(preset: str, *, seed: int) -> Workload:
    def loss(model: nn.Module, batch: Any) -> Any:
        x, y = batch
        logits = model(x)
        return nn.functional.cross_entropy(logits, y), logits

    return _workload(loss_fn=loss)


def swapped_loss(preset: str, *, seed: int) -> Workload:
    def loss(batch: Any, model: nn.Module) -> Any:  # the arguments the other way round
        x, y = batch
        return nn.functional.cross_entropy(model(x), y)

    return _workload(loss_fn=loss)


def criterion_loss(preset: str, *, seed: int) -> Workload:
    # A criterion of (outputs, targets), as `nn.CrossEntropyLoss()` is called.
    return _workload(loss_fn=nn.CrossEntropyLoss())


def three_argument_loss(preset: str, *, seed: int) -> Workload:
    def loss(model: nn.Module, x: Any, y: Any) -> Any:  # the batch unpacked into arguments
        return nn.functional.cross_entropy(model(x), y)

    return _workload(loss_fn=loss)


def loader_as_dataset(preset: str, *, seed: int) -> Workload:
    # As `workload_from_parts` takes it: the loop had failed at its first step, "'DataLoader'
    # object is not subscriptable".
    return _workload(dataset=torch.utils.data.DataLoader(_Samples("tuple"), batch_size=4))


def loss_of_shape_one(preset: str, *, seed: int) -> Workload:
    return _workload(loss_fn=lambda m, b: classification_loss(m, b).reshape(1))


def loss_of_shape_one_fixed(preset: str, *, seed: int) -> Workload:
    return _workload(loss_fn=lambda m, b: classification_loss(m, b).reshape(1).squeeze())


def too_few_samples(preset: str, *, seed: int) -> Workload:
    return _workload(batch_size=16, samples_per_batch=16)


def meta_model(preset: str, *, seed: int) -> Workload:
    """A model built on the meta device (sizes, no values) and never materialised."""
    return _workload(model=nn.Linear(6, 3, device="meta"))


def miscounted_samples(preset: str, *, seed: int) -> Workload:
    """samples_per_batch 1000 over batches of 4: every samples/s 250x too high."""
    return _workload(batch_size=4, samples_per_batch=1000)


def optimizer_class(preset: str, *, seed: int) -> Workload:
    """The optimizer given as its class, as `optimizer=torch.optim.Adam`: built with Adam's
    defaults (it was called as Adam(params, False), a learning rate of 0)."""
    return _workload(make_optimizer=torch.optim.Adam)


def foreign_optimizer(preset: str, *, seed: int) -> Workload:
    """An Adam built on another module's parameters: the model never trained, and every gate
    passed (the losses of a model that does not change are reproducible)."""
    other = nn.Linear(6, 3)
    return _workload(make_optimizer=lambda params, capturable: torch.optim.Adam(other.parameters()))


def closure_optimizer(preset: str, *, seed: int) -> Workload:
    """LBFGS, whose step() needs a closure: it failed at the first step."""
    return _workload(make_optimizer=torch.optim.LBFGS)


def model_and_data_disagree(preset: str, *, seed: int) -> Workload:
    """A Linear(32, 3) fed 6 features: it failed in the baselines, after a job's setup."""
    return _workload(model=nn.Linear(32, 3))


def detached_loss(preset: str, *, seed: int) -> Workload:
    """A loss cut from the model (`.detach()`): backward() fails at the first step."""
    return _workload(loss_fn=lambda m, b: classification_loss(m, b).detach())


def nan_loss(preset: str, *, seed: int) -> Workload:
    """A loss that is NaN at every step, whatever the settings (a new user's trial, 2026-12-02:
    each trial's gate blamed reproducibility, then failed on the stored envelope)."""
    return _workload(loss_fn=lambda m, b: classification_loss(m, b) * float("nan"))


def reads_a_value(preset: str, *, seed: int) -> Workload:
    """A loss that reads a value (`.item()`): nothing to check on meta tensors, so it builds."""

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        value = classification_loss(model, batch)
        if value.item() < 0:
            raise AssertionError("a cross-entropy is never negative")
        return value

    return _workload(loss_fn=loss)


def float64_features(preset: str, *, seed: int) -> Workload:
    """Features in float64 (what `torch.from_numpy` gives) for a float32 model: meta kernels do
    not check dtypes, so it builds, and each trial failed on "mat1 and mat2 must have the same
    dtype" (a probe, 2026-12-06)."""
    workload = _workload()
    workload.dataset.x = workload.dataset.x.double()  # type: ignore[attr-defined]
    return workload


def fails_in_its_loss(preset: str, *, seed: int) -> Workload:
    """A loss that raises at every real step (it reads a value, so the meta check passes): each
    trial had failed the same way, after the baselines had (a probe, 2026-12-06)."""

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        value = classification_loss(model, batch)
        if value.item() >= 0:
            raise ValueError("this loss refuses every batch")
        return value

    return _workload(loss_fn=loss)


class _Augmented(_Samples):
    """Each sample with noise drawn in `__getitem__` from the process's global generator: a
    DataLoader worker draws otherwise than the main process."""

    def __getitem__(self, index: int) -> Any:
        x, y = super().__getitem__(index)
        return x + 0.1 * torch.rand(x.shape), y


def augments_randomly(preset: str, *, seed: int) -> Workload:
    return _workload(dataset=_Augmented("tuple"))


class _Stream(torch.utils.data.IterableDataset[Any]):
    """A stream of `count` samples as `shape` gives them (dicts by default), as an
    IterableDataset yields them: from a fresh iterator each time."""

    def __init__(self, shape: str = "dict", count: int = 8) -> None:
        self.samples, self.count = _Samples(shape), count

    def __iter__(self) -> Any:
        return (self.samples[i % 8] for i in range(self.count))


class _ShardedStream(_Stream):
    """The stream, each DataLoader worker yielding its own share (every num_workers-th item)."""

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        share = range(self.count) if info is None else range(info.id, self.count, info.num_workers)
        return (self.samples[i % 8] for i in share)


def sharded_stream(preset: str, *, seed: int) -> Workload:
    return _workload(dataset=_ShardedStream("tuple", count=16))


def streamed_dicts(preset: str, *, seed: int) -> Workload:
    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch["features"]), batch["label"])

    return _workload(dataset=_Stream(), loss_fn=loss)


def streamed_tuple_loss(preset: str, *, seed: int) -> Workload:
    return _workload(dataset=_Stream("tuple"), loss_fn=tuple_loss("", seed=0).loss_fn)


def stream_shorter_than_a_batch(preset: str, *, seed: int) -> Workload:
    return _workload(dataset=_Stream("tuple", count=3))


def sized(preset: str, *, seed: int) -> Workload:
    """A factory that picks its width by preset, as the README's example does."""
    features = {"tiny": 6, "small": 6}[preset]  # the samples' 6 features at either preset
    return _workload(model=nn.Linear(features, 3))


def sized_and_declared(preset: str, *, seed: int) -> Workload:
    return sized(preset, seed=seed)


sized_and_declared.presets = ("tiny", "small")  # type: ignore[attr-defined]


def declares_a_name(preset: str, *, seed: int) -> Workload:
    return sized(preset, seed=seed)


declares_a_name.presets = "tiny"  # type: ignore[attr-defined]


def raises_a_key_error(preset: str, *, seed: int) -> Workload:
    return {"hidden": _workload()}["hiden"]


def raises_a_value_error(preset: str, *, seed: int) -> Workload:
    """A ValueError of the factory's own, not about its preset."""
    raise ValueError("my config file is missing")


def refuses_its_preset(preset: str, *, seed: int) -> Workload:
    """A ValueError that names the preset: the factory refusing it."""
    if preset != "tiny":
        raise ValueError(f"unknown preset {preset!r}: I have tiny only")
    return _workload()


def frozen(preset: str, *, seed: int) -> Workload:
    """Every parameter frozen: each step failed at its backward."""
    workload = _workload()
    workload.model.requires_grad_(False)
    return workload


class _LazyNet(nn.Module):
    """Lazy linears with a BatchNorm between: its sizes come from the first forward."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.norm, self.last = nn.LazyLinear(16), nn.BatchNorm1d(16), nn.LazyLinear(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last(torch.relu(self.norm(self.first(x))))


def lazy(preset: str, *, seed: int) -> Workload:
    """A model of lazy modules: the meta copy of the loss check failed on its uninitialised
    parameters, blamed on the factory (a new user's trial, 2026-12-03)."""
    torch.manual_seed(seed)
    return _workload(model=_LazyNet())


def lazy_and_wrong(preset: str, *, seed: int) -> Workload:
    """Lazy modules and a loss that fails on the first batch."""
    torch.manual_seed(seed)
    return _workload(model=_LazyNet(), loss_fn=lambda m, b: m(b[0][:, :2]).sum() + b[5])


def printing(preset: str, *, seed: int) -> Workload:
    """A factory that says what it does on stdout, as many do."""
    print(f"building model for {preset} seed={seed}")
    return _workload()


def parts_with_a_foreign_optimizer(preset: str, *, seed: int) -> Workload:
    """`workload_from_parts` inside a factory, given an Adam of another module: its error named
    the argument (`optimizer`), which the CLI took for its own `--optimizer` flag."""
    from trainers import workload_from_parts

    torch.manual_seed(seed)
    other = nn.Linear(6, 3)
    adam = torch.optim.Adam(other.parameters())
    return workload_from_parts(
        nn.Linear(6, 3), _Samples("tuple"), classification_loss, optimizer=adam, batch_size=4
    )


def parts_with_batch_size_zero(preset: str, *, seed: int) -> Workload:
    """The same, with a batch size of 0: the error named the parts' default name, `custom`."""
    from trainers import workload_from_parts

    adam = lambda params, capturable: torch.optim.Adam(params)  # noqa: E731
    return workload_from_parts(
        nn.Linear(6, 3), _Samples("tuple"), classification_loss, optimizer=adam, batch_size=0
    )


def loss_as_a_float(preset: str, *, seed: int) -> Workload:
    """A loss returned as a Python float: on meta tensors `float()` cannot run, so the build's
    check leaves it to the run, whose every step had failed with "'float' object has no
    attribute 'detach'"."""
    return _workload(loss_fn=lambda model, batch: float(classification_loss(model, batch)))


def optimizer_factory_raises(preset: str, *, seed: int) -> Workload:
    """An optimizer factory that raises: left to the run by the build's check (a factory may
    need the GPU's parameters), where its error named nothing of the factory."""

    def broken(params: Any, capturable: bool) -> torch.optim.Optimizer:
        raise ValueError("bad lr")

    return _workload(make_optimizer=broken)


def float_token_ids(preset: str, *, seed: int) -> Workload:
    """Float ids into an embedding: every step fails, and no autocast makes indices of them."""
    model = nn.Sequential(nn.Embedding(10, 3), nn.Flatten(), nn.Linear(18, 3))
    return _workload(model=model)


def labels_int32(preset: str, *, seed: int) -> Workload:
    """Labels of int32: cross-entropy refuses them at every step, on meta tensors not at all."""
    workload = _workload()
    workload.dataset.y = workload.dataset.y.to(torch.int32)  # type: ignore[attr-defined]
    return workload


class _WithAnUnusedLayer(nn.Module):
    """A layer its forward never calls (a head kept for later): under DDP its parameters get
    no gradient, and the reducer stops the second step."""

    def __init__(self) -> None:
        super().__init__()
        self.used, self.unused = nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def unused_layer(preset: str, *, seed: int) -> Workload:
    torch.manual_seed(seed)
    return _workload(model=_WithAnUnusedLayer())
