"""What a user's own batches hold, as `workload_from_parts` counts and hands them: a dataset of
samples given without a batch size, a whole batch whose tensors share another size than its
samples, a namedtuple batch, and two losses made from one code (a user's probe, 2026-12-06)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.trainers import own_workloads
from trainers import ConfigError, LoopConfig, Trainer, WorkloadError, workload_from_parts
from trainers.workloads import SyntheticBatches, adam


def _classify(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def test_a_dataset_of_samples_without_a_batch_size_is_refused_not_counted_by_a_feature() -> None:
    """Each step had trained one unbatched sample, and counted 6 (its feature size) as samples:
    6x the samples/s of the same work with batch_size=1."""
    with pytest.raises(WorkloadError) as caught:
        workload_from_parts(
            nn.Linear(6, 3), own_workloads._Samples("tuple"), _classify, optimizer=adam()
        )
    assert caught.value.field == "batch_size"
    said = str(caught.value)
    assert said.startswith("batch_size: None feeds each item of data whole")
    assert "([6], [])" in said and "a scalar beside shaped tensors" in said
    assert "give batch_size=N" in said and "samples_per_batch=N" in said
    # Features and a one-hot label of other sizes: no size is shared.
    one_hot = [(torch.randn(6), torch.eye(3)[i % 3]) for i in range(4)]
    with pytest.raises(WorkloadError, match=r"\(\[6\], \[3\]\) looks like one sample \(its ten"):
        workload_from_parts(nn.Linear(6, 3), one_hot, _classify, optimizer=adam())
    batched = workload_from_parts(
        nn.Linear(6, 3), own_workloads._Samples("tuple"), _classify, optimizer=adam(), batch_size=4
    )
    assert batched.samples_per_batch == 4


class _IntLabels(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """A torchvision dataset's items: a tensor and a Python int."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.randn(6), index % 3


def test_an_int_label_fed_whole_names_the_batch_size_not_the_items_type() -> None:
    """`(tensor, int)` without a batch size: it had been told to give tensors from
    `__getitem__`, and doing so met the one-sample refusal (a probe, 2026-12-07)."""
    with pytest.raises(WorkloadError) as caught:
        workload_from_parts(nn.Linear(6, 3), _IntLabels(), _classify, optimizer=adam())
    assert caught.value.field == "batch_size"
    assert str(caught.value).startswith(
        "batch_size: None feeds each item of data whole, as a batch, and its first item's item 1 "
        "is a Python int (0): one sample's; give batch_size=N"
    )
    batched = workload_from_parts(nn.Linear(6, 3), _IntLabels(), _classify, optimizer=adam(),
                                  batch_size=4)  # fmt: skip
    assert len(Trainer(batched, device="cpu").fit(2).losses) == 2


def test_a_workload_built_by_hand_whose_items_are_samples_is_refused() -> None:
    """`Workload(...)` keeps `batch_size=None` by default: items of one sample each had trained
    one a step and counted samples_per_batch of them, 64x the samples/s (a probe, 2026-12-07).
    Items that are batches of samples_per_batch still build."""
    samples = own_workloads._workload(batch_size=None, samples_per_batch=64)
    with pytest.raises(WorkloadError, match=r"^batch_size: None feeds .*\(\[6\], \[\]\) looks"):
        Trainer(samples, device="cpu")
    batches = SyntheticBatches((torch.randn(4, 8, 6), torch.randint(0, 3, (4, 8))))
    whole = own_workloads._workload(batch_size=None, samples_per_batch=8, dataset=batches)
    assert len(Trainer(whole, device="cpu").fit(2).losses) == 2


def test_samples_per_batch_given_still_refuses_an_item_that_is_one_sample() -> None:
    """`samples_per_batch`, the one-sample refusal's own advice, had switched the check off: each
    step trained one sample of 6 features and counted 32 (a probe, 2026-12-07); built by hand, a
    scalar label beside 6 features passed at samples_per_batch=6."""
    with pytest.raises(WorkloadError) as caught:
        workload_from_parts(
            nn.Linear(6, 3),
            own_workloads._Samples("tuple"),
            _classify,
            optimizer=adam(),
            samples_per_batch=32,
        )
    assert caught.value.field == "batch_size"
    assert "([6], []) looks like one sample (a scalar beside shaped tensors)" in str(caught.value)
    features = SyntheticBatches((torch.randn(3, 6, 4), torch.randn(3, 6, 4)))
    with pytest.raises(WorkloadError) as caught:
        workload_from_parts(
            nn.Linear(4, 4), features, _regress, optimizer=adam(), samples_per_batch=32
        )
    assert caught.value.field == "samples_per_batch"
    assert str(caught.value).startswith(
        "samples_per_batch=32 but no tensor of the first item ([6, 4], [6, 4]) has a size of 32"
    )
    by_hand = own_workloads._workload(batch_size=None, samples_per_batch=6)
    with pytest.raises(WorkloadError, match=r"\(\[6\], \[\]\) looks like one sample \(a scalar"):
        Trainer(by_hand, device="cpu")
    given = workload_from_parts(
        nn.Linear(4, 4), features, _regress, optimizer=adam(), samples_per_batch=6
    )
    assert given.samples_per_batch == 6
    # Whole batches that hold their samples otherwise still build (the review, 2026-12-07): a
    # flat token stream the loss reshapes, and a loss weight beside the batch's tensors.
    stream = SyntheticBatches((torch.randint(0, 11, (3, 32)),))
    flat = workload_from_parts(
        nn.Embedding(11, 11), stream, _stream_loss, optimizer=adam(), samples_per_batch=4
    )
    assert len(Trainer(flat, device="cpu").fit(2).losses) == 2
    weighted = SyntheticBatches(
        (torch.randn(3, 4, 6), torch.randint(0, 3, (3, 4)), torch.full((3,), 0.5))
    )
    scaled = workload_from_parts(
        nn.Linear(6, 3), weighted, _weighted_loss, optimizer=adam(), samples_per_batch=4
    )
    assert len(Trainer(scaled, device="cpu").fit(2).losses) == 2


def _stream_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    ids = batch[0].view(4, 8)
    return nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())


def _weighted_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return batch[2] * nn.functional.cross_entropy(model(batch[0]), batch[1])


def _regress(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch[0]), batch[1])


class _Masked(nn.Module):
    """Token ids of batch x sequence beside one sequence x sequence mask, shared by the batch."""

    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        self.embed, self.out = nn.Embedding(vocab, 8), nn.Linear(8, vocab)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        scores = (h @ h.transpose(1, 2)).masked_fill(~mask, -1e9)
        return self.out(scores.softmax(-1) @ h)


def _masked_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(*batch).flatten(0, 1), batch[0].flatten())


def test_samples_per_batch_counts_a_whole_batch_its_tensors_cannot() -> None:
    batch, length = 4, 16
    ids = torch.randint(0, 11, (3, batch, length))
    mask = torch.tril(torch.ones(length, length, dtype=torch.bool)).expand(3, -1, -1).clone()
    data = SyntheticBatches((ids, mask))
    guessed = workload_from_parts(_Masked(), data, _masked_loss, optimizer=adam())
    assert guessed.samples_per_batch == length  # the size every tensor has: a guess, wrong here
    given = workload_from_parts(
        _Masked(), data, _masked_loss, optimizer=adam(), samples_per_batch=batch
    )
    assert given.samples_per_batch == batch and given.batch_size is None
    result = Trainer(given, device="cpu").fit(3)
    assert result.step == 3
    for bad, allowed in [(0, "an integer >= 1"), ("4", "an integer >= 1"), (8, "None or batch")]:
        with pytest.raises(
            ConfigError, match=rf"^samples_per_batch={bad!r} is invalid: allowed {allowed}"
        ):
            workload_from_parts(
                nn.Linear(6, 3),
                own_workloads._Samples("tuple"),
                _classify,
                optimizer=adam(),
                batch_size=4,
                samples_per_batch=bad,  # type: ignore[arg-type]
            )


def test_micro_batches_refuse_a_tensor_that_does_not_hold_the_samples() -> None:
    """A sequence x sequence mask shared by the batch's ids had been cut in two beside them, and
    each step failed in torch's attention ("The shape of the 2D attn_mask ...")."""
    batch, length = 4, 8
    ids = torch.randint(0, 11, (3, batch, length))
    mask = torch.tril(torch.ones(length, length, dtype=torch.bool)).expand(3, -1, -1).clone()
    given = workload_from_parts(
        _Masked(), SyntheticBatches((ids, mask)), _masked_loss, optimizer=adam(),
        samples_per_batch=batch,
    )  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        Trainer(given, LoopConfig(micro_batches=2), device="cpu").fit(1)
    assert caught.value.field == "micro_batches"
    assert "allowed 1 for batches whose tensors have first dimensions 4 and 8 (every" in str(
        caught.value
    )
    alone = SyntheticBatches((ids[:, :, :1].expand(-1, -1, 6).float(), ids[:, :, 0] % 3))
    split = workload_from_parts(nn.Linear(6, 3), alone, _classify, optimizer=adam())
    assert len(Trainer(split, LoopConfig(micro_batches=2), device="cpu").fit(2).losses) == 2
    # Whole batches of other sizes still split, each by its own first dimension (the review).
    ragged = [(torch.randn(n, 6), torch.randint(0, 3, (n,))) for n in (8, 8, 4)]
    varied = workload_from_parts(nn.Linear(6, 3), ragged, _classify, optimizer=adam())
    assert len(Trainer(varied, LoopConfig(micro_batches=2), device="cpu").fit(4).losses) == 4


def test_a_namedtuple_batch_reaches_the_loss_as_the_namedtuple() -> None:
    """The loop moves a tuple's tensors as a plain tuple: `batch.x` had failed every step, in
    the tuner's default loop and in `Trainer.fit` alike."""

    def by_field(model: nn.Module, batch: own_workloads.Pair) -> torch.Tensor:
        assert isinstance(batch, own_workloads.Pair)
        return nn.functional.cross_entropy(model(batch.x), batch.y)

    def build(data: object, loss: Callable[..., torch.Tensor]) -> Trainer:
        torch.manual_seed(0)
        workload = workload_from_parts(
            nn.Linear(6, 3),
            data,
            loss,
            optimizer=adam(1e-2),
            batch_size=4,  # type: ignore[arg-type]
        )
        held_out = [own_workloads.Pair(torch.randn(4, 6), torch.randint(0, 3, (4,)))]
        return Trainer(workload, LoopConfig(sync_interval=2), device="cpu", eval_data=held_out)

    named = build(own_workloads._Samples("namedtuple"), by_field).fit(4, eval_every=2)
    plain = build(own_workloads._Samples("tuple"), _classify).fit(4, eval_every=2)
    assert named.losses == plain.losses
    assert [step for step, _ in named.evals] == [2, 4]
    assert all(loss == loss for _, loss in named.evals)  # a number, not NaN
    # The same function as an explicit eval_loss is handed the namedtuple too: the evaluation
    # had rebuilt it as a plain tuple, and `Trainer(...)` refused eval_data (a probe, 2026-12-07).
    trainer = build(own_workloads._Samples("namedtuple"), by_field)
    own = Trainer(
        trainer.workload,
        LoopConfig(sync_interval=2),
        device="cpu",
        eval_data=trainer.eval_data,
        eval_loss=by_field,
    )
    assert own.evaluate() == build(own_workloads._Samples("tuple"), _classify).evaluate()


def test_two_losses_made_by_one_function_are_each_checked() -> None:
    def make_loss(reduction: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], torch.Tensor]:
        def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
            return nn.functional.cross_entropy(model(batch[0]), batch[1], reduction=reduction)

        return loss

    def parts(loss: Callable[..., torch.Tensor]) -> object:
        data = TensorDataset(torch.randn(8, 6), torch.randint(0, 3, (8,)))
        return workload_from_parts(nn.Linear(6, 3), data, loss, optimizer=adam(), batch_size=4)

    parts(make_loss("mean"))
    with pytest.raises(WorkloadError, match=r"returned a tensor of shape \[4\]"):
        parts(make_loss("none"))
