"""A user's own workload checked when it is built (`trainers.workloads.checks`), through
`load_workload` as `--workload package.module:factory` loads it, and through
`workload_from_parts` as a `Trainer` is given its parts: each mistake of a new user's trial
(2026-12-02) is refused in one line naming the field and the fix, where it failed every step of
every trial; and the optimizer given as a class trains."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.trainers import own_workloads
from trainers import (
    ConfigError,
    LoopConfig,
    RunArgs,
    Trainer,
    WorkloadError,
    gate,
    load_workload,
    workload_from_parts,
)
from trainers.workloads import adam, mlp

OWN = "tests.trainers.own_workloads"


@pytest.mark.parametrize(
    ("name", "said"),
    [
        (
            "dict_batches_with_text",
            # What the list holds: each sample's text ("is list" had said only the container).
            "a batch's 'text' is a list of 4 str ('sample 0', ...: each sample's str, gathered "
            "by the loader), not a tensor",
        ),
        ("tuple_loss", "loss_fn(model, batch) returned tuple of 2 (Tensor, Tensor)"),
        ("loss_of_shape_one", "loss_fn(model, batch) returned a tensor of shape [1]"),
        ("too_few_samples", "the dataset has 8 items, fewer than one batch (batch_size 16"),
        ("meta_model", "2 of the model's parameters are on the meta device (the first: weight)"),
        (
            "miscounted_samples",
            "samples_per_batch=1000 but batch_size=4: the loader batches 4 samples a step, so "
            "samples/s would be counted 250x; set samples_per_batch=4",
        ),
        ("foreign_optimizer", "2 of the 2 parameters the Adam steps are not the model's"),
        ("closure_optimizer", "LBFGS.step needs a closure"),
        (
            "model_and_data_disagree",
            f"loss_fn(model, batch) on the first batch raised RuntimeError at {mlp.__file__}:",
        ),
        ("detached_loss", "loss_fn(model, batch) returned a loss that does not require grad"),
        # Had failed every trial alike, "too many values to unpack" (a probe, 2026-12-06).
        ("swapped_loss", "loss_fn(model, batch) on the first batch raised TypeError at"),
        # Each had built, then raised a traceback from the loop at the first step (a probe,
        # 2026-12-07).
        ("criterion_loss", "loss_fn(model, batch) on the first batch raised TypeError: "),
        ("three_argument_loss", "loss_fn(model, batch) on the first batch raised TypeError: "),
        ("loader_as_dataset", "the dataset is a DataLoader: a Workload takes a Dataset"),
    ],
)
def test_a_mistake_in_a_users_workload_is_refused_when_it_is_built(name: str, said: str) -> None:
    with pytest.raises(WorkloadError) as caught:
        load_workload(f"{OWN}:{name}", "tiny")
    assert caught.value.field == "workload"
    assert str(caught.value).startswith(f"workload='{OWN}:{name}': {said}"), str(caught.value)
    swapped = "called as loss_fn(batch, model) it returned a loss: the loop passes the model first"
    assert (swapped in str(caught.value)) == (name == "swapped_loss"), str(caught.value)
    criterion = "it was given the model where it took a tensor: the loop calls loss_fn(model, "
    assert (criterion in str(caught.value)) == (name == "criterion_loss"), str(caught.value)
    arguments = "loss_fn(model, x, y) is called with two arguments, the model and the batch"
    assert (arguments in str(caught.value)) == (name == "three_argument_loss"), str(caught.value)


@pytest.mark.parametrize("name", ["dict_batches", "tensor_batches"])
def test_dict_and_tensor_batches_are_fed_as_tuples_and_the_loss_gets_them_back(name: str) -> None:
    """The loop is fed tuples of tensors; the user's loss, written for the dict (`b["features"]`)
    or the tensor, gets it back: it trains, passes the gate, and evaluates on held-out batches
    of its own shape."""
    workload = load_workload(f"{OWN}:{name}", "tiny")
    first = workload.collate_fn([workload.dataset[i] for i in range(4)])  # type: ignore[misc]
    assert isinstance(first, tuple) and all(isinstance(t, torch.Tensor) for t in first)
    held_out = [own_workloads._Samples(name.removesuffix("_batches"))[i] for i in range(2)]
    trainer = Trainer(workload, LoopConfig(num_streams=2), device="cpu", eval_data=held_out)
    done = trainer.fit(3)
    assert len(done.losses) == 3 and all(x == x for x in done.losses)
    assert trainer.evaluate() > 0
    # The same samples taken from the workload's own data are the loop's tuples: the loss gets
    # them back as it was written for (the user's dict loss failed on them mid-fit).
    trainer.eval_data = [workload.collate_fn([workload.dataset[i]]) for i in range(2)]  # type: ignore[misc]
    assert trainer.evaluate() == pytest.approx(
        Trainer(workload, LoopConfig(), device="cpu", eval_data=held_out).evaluate()
    )
    verdict = gate(
        f"{OWN}:{name}", LoopConfig(num_streams=2), RunArgs(steps=4, device="cpu"), preset="tiny"
    )
    assert verdict.passed, verdict.reason


def test_the_fix_the_error_names_builds_and_trains() -> None:
    workload = load_workload(f"{OWN}:loss_of_shape_one_fixed", "tiny")
    done = Trainer(workload, LoopConfig(), device="cpu").fit(3)
    assert len(done.losses) == 3 and all(isinstance(x, float) for x in done.losses)


def test_a_loss_that_reads_a_value_is_left_to_the_run() -> None:
    """Nothing to check on meta tensors: it builds, and trains."""
    workload = load_workload(f"{OWN}:reads_a_value", "tiny")
    assert Trainer(workload, LoopConfig(), device="cpu").fit(2).losses


def test_an_optimizer_given_as_its_class_is_built_with_its_defaults() -> None:
    """`torch.optim.Adam` as the factory was called `Adam(params, False)`: a learning rate of
    False, and the weights never moved. Built with Adam's defaults, they move; a factory of the
    parameters alone is given them alone."""
    workload = load_workload(f"{OWN}:optimizer_class", "tiny")
    built = workload.make_optimizer(workload.model.parameters(), False)
    assert type(built) is torch.optim.Adam and built.defaults["lr"] == 1e-3
    assert built.defaults["capturable"] is False
    before = [p.detach().clone() for p in workload.model.parameters()]
    Trainer(workload, LoopConfig(), device="cpu").fit(2)
    assert any(
        not torch.equal(b, p) for b, p in zip(before, workload.model.parameters(), strict=True)
    )
    alone = own_workloads._workload(make_optimizer=lambda params: torch.optim.SGD(params, lr=0.5))
    assert alone.make_optimizer(alone.model.parameters(), True).defaults["lr"] == 0.5


def test_a_trainers_parts_are_checked_and_the_error_names_the_argument() -> None:
    """Through `workload_from_parts`: the field is the argument given, `data` or `loss_fn`."""
    model = nn.Linear(6, 3)
    texts = own_workloads._Samples("dict-with-text")
    with pytest.raises(WorkloadError) as caught:
        workload_from_parts(
            model,
            texts,
            lambda m, b: m(b["features"]).sum(),
            optimizer=torch.optim.Adam,
            batch_size=4,
        )
    assert caught.value.field == "data"
    said = str(caught.value)
    assert said.startswith("data: a batch's 'text' is a list of 4 str"), said
    with pytest.raises(WorkloadError) as caught:
        workload_from_parts(
            model,
            own_workloads._Samples("tuple"),
            lambda m, b: {"loss": m(b[0]).sum()},
            optimizer=torch.optim.Adam,
            batch_size=4,
        )
    assert caught.value.field == "loss_fn"
    assert "loss_fn(model, batch) returned dict" in str(caught.value)
    # An optimizer named by a string: shown as given (it had read "optimizer='str'").
    with pytest.raises(ConfigError, match=r"^optimizer='adam' is invalid: allowed a torch.optim"):
        workload_from_parts(
            model, own_workloads._Samples("tuple"), lambda m, b: m(b[0]).sum(), optimizer="adam"
        )


def test_an_optimizer_given_built_on_other_parameters_is_refused_naming_the_argument() -> None:
    model, other = nn.Linear(6, 3), nn.Linear(6, 3)
    parts = (model, own_workloads._Samples("tuple"), lambda m, b: m(b[0]).sum())
    with pytest.raises(WorkloadError) as caught:
        workload_from_parts(*parts, optimizer=torch.optim.Adam(other.parameters()), batch_size=4)
    assert caught.value.field == "optimizer"
    assert str(caught.value).startswith("optimizer: 2 of the 2 parameters the Adam steps are not")
    with pytest.raises(WorkloadError, match=r"^optimizer: LBFGS.step needs a closure"):
        workload_from_parts(*parts, optimizer=torch.optim.LBFGS(model.parameters()), batch_size=4)
    # Built on the model's own parameters, or on some of them (the rest frozen), it builds.
    workload_from_parts(*parts, optimizer=torch.optim.Adam(model.parameters()), batch_size=4)
    workload_from_parts(*parts, optimizer=torch.optim.SGD([model.weight], lr=0.1), batch_size=4)


def test_a_first_batch_that_raises_is_said_in_one_line() -> None:
    class Broken(own_workloads._Samples):
        def __getitem__(self, index: int) -> object:
            raise KeyError("no such file: images/0.png")

    with pytest.raises(WorkloadError, match=r"^data: making its first batch raised KeyError: "):
        workload_from_parts(
            nn.Linear(6, 3), Broken("tuple"), lambda m, b: m(b[0]).sum(), optimizer=adam()
        )


def test_a_dataset_that_draws_in_its_workers_is_told_why_it_fails_the_gate() -> None:
    """Random augmentation in `__getitem__`: with DataLoader workers the first batch differs
    from the reference's, and the verdict says why, not only that it differs at step 0."""
    config = LoopConfig(num_workers=2)
    verdict = gate(
        f"{OWN}:augments_randomly", config, RunArgs(steps=4, seed=0, device="cpu"), preset="tiny"
    )
    assert not verdict.passed and verdict.first_diverging_step == 0
    assert "draw random numbers in __getitem__ (an augmentation)" in verdict.reason
    # A collate_fn draws in the workers too, with no index to seed from: named with a fix.
    assert "or in a collate_fn (masking)" in verdict.reason
    assert "move a collate_fn's draws there or into the loss" in verdict.reason
    plain = gate(
        f"{OWN}:tuple_batches", config, RunArgs(steps=4, seed=0, device="cpu"), preset="tiny"
    )
    assert plain.passed and "__getitem__" not in plain.reason
    # A stream copied whole into each worker: the second batch repeats the first (a user's
    # probe, 2026-12-06: "first differs at step 1", and nothing said why).
    stream = gate(
        f"{OWN}:streamed_dicts", config, RunArgs(steps=4, seed=0, device="cpu"), preset="tiny"
    )
    assert not stream.passed and stream.first_diverging_step == 1
    assert "the second batch repeats the first" in stream.reason, stream.reason
    assert "get_worker_info()" in stream.reason
    # The Trainer refuses it before a step; a stream that shards by worker trains.
    with pytest.raises(ConfigError, match=r"^num_workers=2 is invalid: allowed 0 for this Iter"):
        Trainer(load_workload(f"{OWN}:streamed_dicts", "tiny"), config, device="cpu")
    sharded = Trainer(load_workload(f"{OWN}:sharded_stream", "tiny"), config, device="cpu")
    assert len(sharded.fit(3).losses) == 3
    plain = Trainer(load_workload(f"{OWN}:streamed_dicts", "tiny"), LoopConfig(), device="cpu")
    assert plain.fit(2).step == 2  # one process reads the stream once


def test_a_stream_of_dicts_is_fed_as_tuples_and_its_mistakes_are_refused() -> None:
    """An IterableDataset: its first batch is read from an iterator of its own when built, so
    its dicts are fed as tuples, and a tuple loss or a stream shorter than a batch is refused
    (each failed every trial: a second new user's trial, 2026-12-02)."""
    workload = load_workload(f"{OWN}:streamed_dicts", "tiny")
    assert Trainer(workload, LoopConfig(), device="cpu").fit(3).losses
    with pytest.raises(WorkloadError, match="loss_fn\\(model, batch\\) returned tuple of 2"):
        load_workload(f"{OWN}:streamed_tuple_loss", "tiny")
    with pytest.raises(WorkloadError, match="the dataset yields 3 items, fewer than one batch"):
        load_workload(f"{OWN}:stream_shorter_than_a_batch", "tiny")


@pytest.mark.parametrize("given", ["stream", "loader"])
def test_a_stream_given_to_workload_from_parts_trains_as_a_plain_loop_over_it(given: str) -> None:
    """An IterableDataset, bare or in a DataLoader, as a hand-built Workload takes it: the parts
    had refused it, the loader's as "sampler=_InfiniteConstantSampler ... shuffle=False, no
    sampler", which it had neither (a probe, 2026-12-07)."""
    stream = own_workloads._Stream("tuple", count=16)
    data: object = stream if given == "stream" else torch.utils.data.DataLoader(stream, 4)
    torch.manual_seed(0)
    model = nn.Linear(6, 3)
    plain = [
        float(mlp.classification_loss(model, b)) for b in torch.utils.data.DataLoader(stream, 4)
    ]
    optimizer = functools.partial(torch.optim.SGD, lr=0.0)
    built = workload_from_parts(
        model, data, mlp.classification_loss, optimizer=optimizer, batch_size=4
    )
    assert Trainer(built, device="cpu").fit(4).losses == pytest.approx(plain)
    with pytest.raises(ConfigError, match="data='range_iterator' is invalid"):
        loss = mlp.classification_loss
        workload_from_parts(model, iter(range(3)), loss, optimizer=optimizer, batch_size=4)


def test_a_one_shot_stream_is_refused_before_its_first_batch_is_taken() -> None:
    """An IterableDataset whose `__iter__` returns one generator for good: the check took its
    first batch, and the run ended mid-fit with "the workload's dataset yields no batch" (a
    probe, 2026-12-07)."""
    features, labels = torch.randn(64, 6), torch.randint(0, 3, (64,))

    class OneShot(torch.utils.data.IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
        def __init__(self) -> None:
            self.samples = ((features[i], labels[i]) for i in range(64))

        def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            return self.samples

    with pytest.raises(WorkloadError, match=r"^data: OneShot.__iter__ returns the same iterator"):
        workload_from_parts(
            nn.Linear(6, 3), OneShot(), mlp.classification_loss, optimizer=adam(), batch_size=8
        )

    class Fresh(OneShot):
        def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            return ((features[i], labels[i]) for i in range(64))

    class Resets(torch.utils.data.IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
        def __iter__(self) -> Resets:  # its own iterator, from the start at each pass
            self.index = 0
            return self

        def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
            if self.index == 64:
                raise StopIteration
            self.index += 1
            return features[self.index - 1], labels[self.index - 1]

    for again in (Fresh(), Resets()):
        built = workload_from_parts(
            nn.Linear(6, 3), again, mlp.classification_loss, optimizer=adam(), batch_size=8
        )
        assert len(Trainer(built, device="cpu").fit(12).losses) == 12  # passes again after 8


def test_a_workload_built_by_hand_and_given_to_a_trainer_is_fed_as_tuples() -> None:
    """`examples/my_workload.py`'s way: a `Workload` filled by hand, straight to a `Trainer`,
    with dict batches (it failed at the first step); one built by a factory is not read again."""
    by_hand = own_workloads._workload(
        "dict", lambda m, b: nn.functional.cross_entropy(m(b["features"]), b["label"])
    )
    trainer = Trainer(by_hand, LoopConfig(), device="cpu")
    assert len(trainer.fit(2).losses) == 2
    built = load_workload("mlp", "tiny")
    assert Trainer(built, LoopConfig(), device="cpu").workload is built


def test_a_mistyped_preset_is_refused_with_the_close_names() -> None:
    with pytest.raises(WorkloadError) as caught:
        load_workload("mlp", "smal")
    assert caught.value.field == "preset"
    assert str(caught.value).endswith("allowed tiny, small, large (did you mean small?)")
    with pytest.raises(WorkloadError) as far:
        load_workload("mlp", "huge")
    assert "did you mean" not in str(far.value)


def test_a_preset_the_factory_has_no_entry_for_is_named_as_the_preset() -> None:
    # `{"tiny": 64, ...}[preset]`, as the README's example picks its width: a KeyError of the
    # preset itself is the preset's error, and says how to have the presets named.
    with pytest.raises(WorkloadError) as caught:
        load_workload(f"{OWN}:sized", "medium")
    assert caught.value.field == "preset"
    said = str(caught.value)
    assert said.startswith("preset='medium' is invalid for workload 'tests.trainers.own_workloads")
    assert "KeyError: 'medium'" in said and "own_workloads.py:" in said
    assert "factory.presets" in said and "\n" not in said
    assert load_workload(f"{OWN}:sized", "small").model.in_features == 6
    # Another key's KeyError inside the factory is the factory's own mistake.
    with pytest.raises(WorkloadError) as other:
        load_workload(f"{OWN}:raises_a_key_error", "tiny")
    assert other.value.field == "workload" and "KeyError: 'hiden'" in str(other.value)


def test_declared_presets_are_checked_before_the_factory_runs() -> None:
    with pytest.raises(WorkloadError) as caught:
        load_workload(f"{OWN}:sized_and_declared", "medium")
    assert caught.value.field == "preset"
    assert "allowed tiny, small" in str(caught.value)
    assert "KeyError" not in str(caught.value)  # refused before the factory ran
    assert load_workload(f"{OWN}:sized_and_declared", "tiny").preset == "tiny"
    with pytest.raises(WorkloadError) as malformed:
        load_workload(f"{OWN}:declares_a_name", "tiny")
    assert malformed.value.field == "workload"
    assert "presets must be a tuple or list of names, not 'tiny'" in str(malformed.value)


class _WholeBatches(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Four items, each a whole batch of 16 samples; `sequence_first` as an RNN takes them."""

    def __init__(self, sequence_first: bool) -> None:
        self.sequence_first = sequence_first

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(5, 16, 4) if self.sequence_first else torch.randn(16, 4)
        return x, torch.randint(0, 3, (16,))


@pytest.mark.parametrize("sequence_first", [False, True])
def test_a_dataset_of_whole_batches_counts_each_batchs_samples(sequence_first: bool) -> None:
    # It had counted 1 sample a step: steps/s shown as samples/s, 16x too low (2026-12-02).
    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        out = model(x).mean(0) if sequence_first else model(x)
        return nn.functional.cross_entropy(out, y)

    workload = workload_from_parts(
        nn.Linear(4, 3), _WholeBatches(sequence_first), loss, optimizer=adam(1e-2)
    )
    assert workload.batch_size is None and workload.samples_per_batch == 16
    # Given a batch size, the samples a step counts are that, as before.
    given = workload_from_parts(
        nn.Linear(6, 3),
        own_workloads._Samples("tuple"),
        own_workloads.classification_loss,
        optimizer=adam(1e-2),
        batch_size=4,
    )
    assert given.samples_per_batch == 4


def test_a_factorys_value_error_is_the_presets_only_where_it_names_the_preset() -> None:
    # "my config file is missing" was said as `--preset: ...` (a new user's trial, 2026-12-02).
    with pytest.raises(WorkloadError, match="my config file is missing") as caught:
        load_workload(f"{OWN}:raises_a_value_error", "tiny")
    assert caught.value.field == "workload"
    with pytest.raises(WorkloadError, match="unknown preset 'huge'") as caught:
        load_workload(f"{OWN}:refuses_its_preset", "huge")
    assert caught.value.field == "preset"


def test_a_model_with_no_trainable_parameter_is_refused_naming_the_model() -> None:
    with pytest.raises(WorkloadError, match="the model has no trainable parameter") as caught:
        load_workload(f"{OWN}:frozen", "tiny")
    assert caught.value.field == "workload"
    assert "its 2 parameters all have requires_grad=False" in str(caught.value)
    model = nn.Linear(6, 3).requires_grad_(False)
    data = [(torch.randn(6), torch.tensor(1)) for _ in range(8)]
    with pytest.raises(WorkloadError) as caught:
        workload_from_parts(
            model, data, mlp.classification_loss, optimizer=adam(1e-3), batch_size=4
        )
    assert caught.value.field == "model"
    # No parameter at all: "unfreeze some" could not apply (a user's probe, 2026-12-06).
    with pytest.raises(WorkloadError, match=r"^model: the model has no parameters: the loop"):
        workload_from_parts(
            nn.ReLU(), data, mlp.classification_loss, optimizer=torch.optim.SGD, batch_size=4
        )


def test_lazy_modules_get_their_sizes_from_the_first_batch_and_train() -> None:
    """Sized by one forward in eval mode: no running statistic moved, the same weights from the
    same seed, and it trains and passes the gate."""
    workload = load_workload(f"{OWN}:lazy", "tiny", seed=1)
    model = workload.model
    assert not any(nn.parameter.is_lazy(p) for p in model.parameters())
    assert model.first.weight.shape == (16, 6) and model.training  # type: ignore[union-attr]
    assert torch.equal(model.norm.running_mean, torch.zeros(16))  # type: ignore[union-attr]
    again = load_workload(f"{OWN}:lazy", "tiny", seed=1).model
    assert all(
        torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters(), strict=True)
    )
    assert Trainer(workload, LoopConfig(), device="cpu").fit(2).losses
    verdict = gate(
        f"{OWN}:lazy", LoopConfig(num_streams=2), RunArgs(steps=4, device="cpu"), preset="tiny"
    )
    assert verdict.passed, verdict.reason


def test_lazy_modules_whose_first_forward_fails_are_said_in_one_line() -> None:
    with pytest.raises(WorkloadError, match="the model has lazy modules") as caught:
        load_workload(f"{OWN}:lazy_and_wrong", "tiny")
    assert "loss_fn(model, batch) on the first batch raised IndexError" in str(caught.value)


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("parts_with_a_foreign_optimizer", "optimizer: 2 of the 2 parameters the Adam steps"),
        ("parts_with_batch_size_zero", "batch_size=0 is invalid"),
    ],
)
def test_a_part_refused_inside_a_factory_is_the_workloads_error_under_its_name(
    name: str, said: str
) -> None:
    """`workload_from_parts` inside a `--workload` factory: the error is the workload's (the
    CLI had named `--optimizer`, a flag `run` does not have) and names it as the user did."""
    with pytest.raises(WorkloadError) as caught:
        load_workload(f"{OWN}:{name}", "tiny")
    assert caught.value.field == "workload"
    assert str(caught.value).startswith(f"workload='{OWN}:{name}': {said}"), str(caught.value)
    swapped = "called as loss_fn(batch, model) it returned a loss: the loop passes the model first"
    assert (swapped in str(caught.value)) == (name == "swapped_loss"), str(caught.value)
    criterion = "it was given the model where it took a tensor: the loop calls loss_fn(model, "
    assert (criterion in str(caught.value)) == (name == "criterion_loss"), str(caught.value)
    arguments = "loss_fn(model, x, y) is called with two arguments, the model and the batch"
    assert (arguments in str(caught.value)) == (name == "three_argument_loss"), str(caught.value)
    assert "custom" not in str(caught.value)


def test_a_loss_returned_as_a_float_fails_its_first_step_naming_what_it_returned() -> None:
    workload = load_workload(f"{OWN}:loss_as_a_float", "tiny")  # meta tensors cannot tell
    with pytest.raises(WorkloadError, match=r"loss_fn\(model, batch\) returned float, not a "):
        Trainer(workload, LoopConfig(), device="cpu").fit(1)


def test_an_optimizer_factory_that_raises_is_named_with_the_line_it_raised_at() -> None:
    workload = load_workload(f"{OWN}:optimizer_factory_raises", "tiny")
    with pytest.raises(WorkloadError) as caught:
        Trainer(workload, LoopConfig(), device="cpu").fit(1)
    said = str(caught.value)
    assert said.startswith("workload 'own': its optimizer factory raised ValueError at ")
    assert own_workloads.__file__ in said and said.endswith(": bad lr")


def test_an_optimizer_class_that_needs_a_setting_is_refused_naming_the_optimizer() -> None:
    """`optimizer=MyOpt` where `MyOpt(params, lr)` needs `lr`: it had built, then failed at
    `Trainer(...)` as the workload's fault at a line inside trainers (a probe, 2026-12-07)."""

    class NeedsLr(torch.optim.SGD):
        def __init__(self, params: object, lr: float) -> None:
            super().__init__(params, lr=lr)  # type: ignore[arg-type]

    data = torch.utils.data.TensorDataset(torch.randn(16, 6), torch.randint(0, 3, (16,)))
    loss = mlp.classification_loss
    with pytest.raises(WorkloadError) as caught:
        workload_from_parts(nn.Linear(6, 3), data, loss, optimizer=NeedsLr, batch_size=4)
    assert caught.value.field == "optimizer"
    said = str(caught.value)
    assert said.startswith("optimizer: the optimizer factory raised TypeError: ")
    assert said.endswith(
        "NeedsLr.__init__() missing 1 required positional argument: 'lr': give its settings, "
        "e.g. functools.partial(MyOptimizer, lr=1e-3)"
    )
    given = functools.partial(NeedsLr, lr=0.1)
    built = workload_from_parts(nn.Linear(6, 3), data, loss, optimizer=given, batch_size=4)
    assert len(Trainer(built, device="cpu").fit(2).losses) == 2


class _Bag(nn.Module):
    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 4, sparse=sparse)
        self.head = nn.Linear(4, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).mean(1))


def _without_decay_on_the_embedding(model: nn.Module) -> torch.optim.Optimizer:
    groups = [
        {"params": model.embed.parameters(), "weight_decay": 0.0},
        {"params": model.head.parameters()},
    ]
    return torch.optim.SGD(groups, lr=0.1, weight_decay=0.01)


_SGD = functools.partial(torch.optim.SGD, lr=0.1)


@pytest.mark.parametrize(
    ("sparse", "optimizer", "clip", "loop", "field", "said"),
    [
        (True, torch.optim.Adam, None, "as-built", "optimizer", r"Adam says: Adam does not"),
        # AdamW's defaults hold a key its constructor does not take: the probe takes only those.
        (True, torch.optim.AdamW, None, "as-built", "optimizer", r"AdamW says: Adam does not"),
        (True, _SGD, 1.0, "as-built", "clip_grad_norm", "clipping"),
        (True, _SGD, None, "fused", "config.optimizer", r"SGD made fused says: .*sparse"),
        (True, _SGD, None, "as-built", None, None),
        (True, torch.optim.Adagrad, None, "as-built", None, None),
        # Weight decay on the other group only: probed by the embedding's own group's settings.
        (True, _without_decay_on_the_embedding, None, "as-built", None, None),
        (False, torch.optim.Adam, 1.0, "fused", None, None),
    ],
)
def test_sparse_gradients_the_step_cannot_take_are_refused_naming_the_option(
    sparse: bool,
    optimizer: Any,
    clip: float | None,
    loop: Any,
    field: str | None,
    said: str | None,
) -> None:
    """`nn.Embedding(sparse=True)`: Adam had failed at step 1 inside torch, and clipping with a
    page of dispatcher registrations (a probe, 2026-12-07). The optimizer is asked by a probe
    step of its own class under each group's settings, so SGD and Adagrad train, Adam and AdamW
    are refused, and the loop's fused optimizer is named where it is what refuses."""
    data = torch.utils.data.TensorDataset(torch.randint(0, 50, (16, 5)), torch.randint(0, 3, (16,)))
    model = _Bag(sparse)
    built = optimizer(model) if optimizer is _without_decay_on_the_embedding else optimizer
    workload = workload_from_parts(
        model, data, mlp.classification_loss, optimizer=built, batch_size=4
    )
    config = LoopConfig(optimizer=loop)
    if field is None:
        before = model.embed.weight.detach().clone()
        Trainer(workload, config, device="cpu", clip_grad_norm=clip).fit(2)
        assert not torch.equal(before, model.embed.weight)  # it trained the embedding
        return
    with pytest.raises(ConfigError, match=said) as caught:
        Trainer(workload, config, device="cpu", clip_grad_norm=clip)
    assert caught.value.field == field
    assert "module 'embed' (Embedding, sparse=True) gives " in str(caught.value)


def test_sparse_adam_over_dense_weights_is_refused_naming_the_optimizer() -> None:
    """It had passed the build and raised torch's "SparseAdam does not support dense gradients"
    at step 1 (a probe, 2026-12-07); over the sparse embedding alone it trains."""
    data = torch.utils.data.TensorDataset(torch.randint(0, 50, (16, 5)), torch.randint(0, 3, (16,)))
    model = _Bag(sparse=True)
    workload = workload_from_parts(
        model, data, mlp.classification_loss, optimizer=torch.optim.SparseAdam, batch_size=4
    )
    with pytest.raises(ConfigError) as caught:
        Trainer(workload, device="cpu")
    assert caught.value.field == "optimizer"
    assert "the dense gradients of 2 weights ('head.weight' first): SparseAdam takes only" in str(
        caught.value
    )
    model.head.requires_grad_(False)
    alone = workload_from_parts(
        model,
        data,
        mlp.classification_loss,
        optimizer=torch.optim.SparseAdam(model.parameters()),  # the frozen head has no grad
        batch_size=4,
    )
    before = model.embed.weight.detach().clone()
    Trainer(alone, device="cpu").fit(2)
    assert not torch.equal(before, model.embed.weight)


def test_float_ids_into_an_embedding_are_refused_when_built() -> None:
    with pytest.raises(WorkloadError, match=r"'indices' to have one of the following scalar"):
        load_workload(f"{OWN}:float_token_ids", "tiny")


def test_a_loss_redefined_under_the_same_name_is_checked_again() -> None:
    """A notebook cell run again with `reduction="none"`: the check had been keyed by the loss's
    name and was skipped, and torch raised "grad can be implicitly created only for scalar
    outputs" mid-fit (a user's probe, 2026-12-05). Two lambdas share the name `<lambda>` too."""

    def parts(loss_fn: object) -> object:
        torch.manual_seed(0)
        return workload_from_parts(
            nn.Linear(4, 1),
            torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1)),
            loss_fn,  # type: ignore[arg-type]
            optimizer=torch.optim.SGD,
            batch_size=8,
        )

    def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return nn.functional.mse_loss(model(batch[0]), batch[1])

    first = parts(loss)
    assert len(Trainer(first, device="cpu").fit(2).losses) == 2  # type: ignore[arg-type]

    def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return nn.functional.mse_loss(model(batch[0]), batch[1], reduction="none")

    with pytest.raises(WorkloadError, match=r"returned a tensor of shape \[8, 1\]"):
        parts(loss)
    parts(lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))
    with pytest.raises(WorkloadError, match=r"returned a tensor of shape \[8\]"):
        parts(lambda m, b: (m(b[0]) - b[1]).pow(2).mean(dim=1))


def test_the_same_loss_and_model_class_given_other_data_is_checked_again() -> None:
    """A notebook's second build, 12 features for a model of 8: the check was keyed by the loss
    and the model's class alone and was skipped, and torch's "mat1 and mat2 shapes cannot be
    multiplied" came at the first step (a probe, 2026-12-07)."""

    def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    def parts(features: int) -> object:
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        data = torch.utils.data.TensorDataset(torch.randn(64, features), torch.randint(0, 3, (64,)))
        return workload_from_parts(model, data, loss, optimizer=torch.optim.SGD, batch_size=8)

    parts(8)
    fit = r"\[8, 12\] X \[8, 16\]: the model and the batches it is fed do not fit"
    with pytest.raises(WorkloadError, match=rf"^loss_fn: .*{fit}"):
        parts(12)


@pytest.mark.parametrize(
    "factory",
    [
        functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
        functools.partial(torch.optim.SGD, momentum=0.9),  # lr's own default
        lambda params, lr=0.1: torch.optim.SGD(params, lr=lr),
        functools.partial(torch.optim.Adam, lr=1e-2),  # takes `capturable` by name
        lambda params, capturable: torch.optim.SGD(params, lr=0.1),
        torch.optim.SGD,
    ],
    ids=["partial-lr", "partial-default-lr", "lambda-lr-default", "partial-adam", "two", "cls"],
)
def test_an_optimizer_factory_with_a_defaulted_second_parameter_trains(factory: object) -> None:
    """`partial(SGD, momentum=0.9)` and `lambda p, lr=0.5: ...` were called as (params, False):
    a learning rate of False, and weights that never moved (a user's probe, 2026-12-05)."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    workload = workload_from_parts(
        model,
        data,
        lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
        optimizer=factory,  # type: ignore[arg-type]
        batch_size=8,
    )
    before = model.weight.detach().clone()
    trainer = Trainer(workload, device="cpu")
    trainer.fit(2)
    rate = trainer.optimizer.param_groups[0]["lr"]
    assert not isinstance(rate, bool) and float(rate) > 0, rate
    assert not torch.equal(before, model.weight.detach())


class _NumpyBatches(torch.utils.data.Dataset[tuple[object, object]]):
    """Each item a whole batch of NumPy arrays, as a dataset read from files in batches gives."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[object, object]:
        numbers = np.random.RandomState(i)
        return numbers.randn(4, 8).astype(np.float32), numbers.randint(0, 3, 4)


def _to_tensors(batch: tuple[object, object]) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(torch.as_tensor(part) for part in batch)  # type: ignore[return-value]


@pytest.mark.parametrize("given", ["dataset", "loader", "loader-collate"])
def test_items_that_are_whole_batches_are_converted_as_the_loader_converts_them(
    given: str,
) -> None:
    """With batch_size=None the loader converts each item (NumPy to tensors, or the collate_fn):
    the build's check had read the item unconverted and refused it, "item 0 is ndarray" (a probe,
    2026-12-07). It trains as a plain loop over the same loader does."""
    data: object = _NumpyBatches()
    if given != "dataset":
        collate = _to_tensors if given == "loader-collate" else None
        data = torch.utils.data.DataLoader(_NumpyBatches(), batch_size=None, collate_fn=collate)

    def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    torch.manual_seed(0)
    model = nn.Linear(8, 3)
    plain = [float(loss(model, b)) for b in torch.utils.data.DataLoader(_NumpyBatches(), None)]
    workload = workload_from_parts(
        model, data, loss, optimizer=functools.partial(torch.optim.SGD, lr=0.0), batch_size=None
    )
    done = Trainer(workload, device="cpu").fit(3)
    assert done.losses == pytest.approx(plain[:3])


def test_batchnorm_at_a_batch_of_one_is_one_line_naming_batch_size() -> None:
    """BatchNorm in training needs two values per channel: Trainer's every step had raised
    torch's traceback (a probe, 2026-12-08), where the library adapters refuse batch=1."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3)
    )
    data = torch.utils.data.TensorDataset(torch.randn(6, 8), torch.randint(0, 3, (6,)))

    def loss(m: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(m(batch[0]), batch[1])

    with pytest.raises(WorkloadError) as refused:  # when built, before any step
        workload_from_parts(model, data, loss, optimizer=adam(), batch_size=1)
    said = str(refused.value)
    assert refused.value.field == "batch_size" and "\n" not in said
    assert said.startswith("batch_size=1 is invalid for this model: loss_fn(model, batch) raised")
    assert "allowed 2 or more" in said
    two = workload_from_parts(model, data, loss, optimizer=adam(), batch_size=2)
    assert len(Trainer(two, device="cpu").fit(2).losses) == 2
