"""`ReusedBuilds`: the gate's runs from copies of one build give the losses of fresh builds."""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
import torch
from torch import nn

import trainers
from trainers import REFERENCE, LoopConfig, RunArgs, Workload
from trainers.gate import PERTURBATIONS, Envelope, Perturbation, envelope_seeds, trajectory
from trainers.workloads import SyntheticBatches, adam, reuse
from trainers.workloads.mlp import classification_loss
from trainers.workloads.reuse import ReusedBuilds
from tuner.search.gating.gate import run_parts


class Noise(nn.Module):
    """Draws from the global generator in every forward (not a dropout: the gate keeps it on)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.05 * torch.randn_like(x)


def _batches() -> SyntheticBatches:
    generator = torch.Generator().manual_seed(7)
    return SyntheticBatches(
        (
            torch.randn(6, 4, 8, generator=generator),
            torch.randint(0, 3, (6, 4), generator=generator),
        )
    )


def noisy(preset: str, *, seed: int) -> Workload:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    return Workload(
        name="noisy",
        preset=preset,
        model=nn.Sequential(nn.Linear(8, 16), Noise(), nn.ReLU(), nn.Linear(16, 3)),
        dataset=_batches(),
        loss_fn=classification_loss,
        samples_per_batch=4,
        make_optimizer=adam(1e-2),
    )


def closing_over_the_model(preset: str, *, seed: int) -> Workload:
    torch.manual_seed(seed)
    model = nn.Linear(8, 3)

    def loss_fn(_: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])  # the build's model

    return Workload(
        name="closure",
        preset=preset,
        model=model,
        dataset=_batches(),
        loss_fn=loss_fn,
        samples_per_batch=4,
    )


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_trajectories_from_copies_match_fresh_builds_bit_for_bit(name: str) -> None:
    factory = trainers.resolve_factory(name)
    reused = ReusedBuilds(factory)
    runs = [
        {},
        {"perturbation": Perturbation(seed=1, eps=2.0**-7)},
        {"config": LoopConfig(num_streams=2, sync_interval=3, prefetch_depth=2)},
        {},
    ]
    for kwargs in runs:
        config = kwargs.pop("config", REFERENCE)
        args = trainers.RunArgs(steps=6, seed=3, device="cpu")
        fresh = trajectory(factory, "tiny", config, args, **kwargs).losses
        copied = trajectory(reused, "tiny", config, args, **kwargs).losses
        assert copied == fresh
    assert (reused.builds, reused.copies, reused.reason) == (1, 3, None)


def test_the_global_random_states_are_those_a_build_leaves() -> None:
    reused = ReusedBuilds(noisy)
    fresh = [
        trajectory(noisy, "x", REFERENCE, RunArgs(steps=5, device="cpu")).losses for _ in range(2)
    ]
    assert fresh[0] == fresh[1]  # the factory's seeding makes each build's run the same
    copied = [
        trajectory(reused, "x", REFERENCE, RunArgs(steps=5, device="cpu")).losses for _ in range(3)
    ]
    assert copied == [fresh[0]] * 3
    assert reused.copies == 2
    for _ in range(2):
        reused("x", seed=0)
        drawn = (torch.rand(2).tolist(), random.random(), float(np.random.rand()))
        noisy("x", seed=0)
        assert drawn == (torch.rand(2).tolist(), random.random(), float(np.random.rand()))


def test_copies_are_independent_and_another_seed_is_built() -> None:
    reused = ReusedBuilds(trainers.resolve_factory("mlp"))
    first = reused("tiny", seed=0)
    with torch.no_grad():
        for param in first.model.parameters():
            param.add_(1.0)
    second = reused("tiny", seed=0)
    fresh = trainers.load_workload("mlp", "tiny", seed=0)
    for mine, theirs in zip(second.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    other = reused("tiny", seed=1)
    assert reused.builds == 2
    assert not torch.equal(next(other.model.parameters()), next(second.model.parameters()))


def test_a_closure_over_the_build_is_built_every_time() -> None:
    calls = []

    def factory(preset: str, *, seed: int) -> Workload:
        calls.append(seed)
        return closing_over_the_model(preset, seed=seed)

    reused = ReusedBuilds(factory)
    losses = [
        trajectory(reused, "x", REFERENCE, RunArgs(steps=4, device="cpu")).losses for _ in range(2)
    ]
    assert losses[0] == losses[1]
    assert len(calls) == 2 and reused.copies == 0
    assert reused.reason is not None and "loss_fn" in reused.reason


def test_the_gate_judges_the_same_from_copies() -> None:
    config = LoopConfig(num_streams=2, sync_interval=2)
    args = trainers.RunArgs(steps=8, seed=0, device=torch.device("cpu"))

    def parts(factory: trainers.WorkloadFactory) -> tuple[dict[str, object], dict[str, object]]:
        found = run_parts(factory, "tiny", config, args, envelope=None)
        return found.verdict.to_dict(), found.envelope

    fresh = parts(trainers.resolve_factory("mlp"))
    reused = ReusedBuilds(trainers.resolve_factory("mlp"))
    assert parts(reused) == fresh
    assert reused.builds == 1 and reused.copies >= 5  # reference, 4 perturbed, the config
    assert Envelope.from_dict(fresh[1]).perturbed  # the envelope was measured, not given


def test_several_seeds_are_kept_the_least_recently_used_going_first() -> None:
    factory = trainers.resolve_factory("mlp")
    reused = ReusedBuilds(factory, keep=2)
    reused("tiny", seed=0)
    reused("tiny", seed=1)
    again = reused("tiny", seed=0)  # a copy: seed 0 becomes the most recently used
    assert (reused.builds, reused.copies) == (2, 1)
    assert reused.kept == [("tiny", 1), ("tiny", 0)]
    reused("tiny", seed=2)  # pushes seed 1 out, not seed 0
    assert reused.kept == [("tiny", 0), ("tiny", 2)]
    reused("tiny", seed=0)
    assert reused.builds == 3
    reused("tiny", seed=1)
    assert reused.builds == 4
    fresh = factory("tiny", seed=0)
    for mine, theirs in zip(again.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(mine, theirs)


def test_a_host_without_room_keeps_only_the_newest_build(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (reuse.host_available_bytes() or 0) > 0  # Linux: MemAvailable is read
    reused = ReusedBuilds(trainers.resolve_factory("mlp"), keep=3)
    assert not reused.room_for_another()  # nothing kept yet: nothing to size another by
    monkeypatch.setattr(reuse, "HOST_ROOM", 2**62)  # no host holds that many copies
    reused("tiny", seed=0)
    assert not reused.room_for_another()
    reused("tiny", seed=1)
    assert reused.kept == [("tiny", 1)]
    monkeypatch.setattr(reuse, "HOST_ROOM", 1)
    assert reused.room_for_another()
    reused("tiny", seed=2)
    reused("tiny", seed=1)
    assert reused.kept == [("tiny", 2), ("tiny", 1)] and reused.builds == 3
    reused("tiny", seed=3)
    assert not reused.room_for_another()  # three kept: as many as it may keep
    monkeypatch.setattr(reuse, "HOST_ROOM", 2**62)
    reused("tiny", seed=3)  # memory tightened: a copy handed out lets the older ones go
    assert reused.kept == [("tiny", 3)]


def test_keep_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="keep=0 is invalid: allowed 1 or more"):
        ReusedBuilds(trainers.resolve_factory("mlp"), keep=0)


def test_a_seed_envelope_and_the_runs_after_it_build_each_seed_once() -> None:
    """A config in another precision is judged against the reference trained from four other
    seeds; kept side by side, those builds and the reference's are each built once, and the
    check judges what fresh builds give. With one kept, the reference's seed is built again
    for the runs after the envelope."""
    config = LoopConfig(num_streams=2)  # its twin runs after the envelope
    args = RunArgs(steps=6, seed=0, device="cpu", precision="fp32")

    def check(factory: trainers.WorkloadFactory) -> tuple[dict[str, object], dict[str, object]]:
        found = run_parts(
            factory, "tiny", config, args, envelope=None, config_precision="bf16-autocast"
        )
        assert found.verdict is not None
        return found.verdict.to_dict(), found.envelope

    fresh = check(trainers.resolve_factory("mlp"))
    assert Envelope.from_dict(fresh[1]).spread == "seeds"
    kept = ReusedBuilds(trainers.resolve_factory("mlp"), keep=1 + PERTURBATIONS)
    assert check(kept) == fresh
    assert kept.builds == 1 + PERTURBATIONS
    assert sorted(seed for _, seed in kept.kept) == [0, *envelope_seeds(0)]
    one = ReusedBuilds(trainers.resolve_factory("mlp"))
    assert check(one) == fresh
    assert one.builds == 2 + PERTURBATIONS


class _Locked(nn.Module):
    """A model that holds a lock, as one holding an open file or a database handle: no deep copy
    of it can be made, and a plain loop trains it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.lock = nn.Linear(8, 3), threading.Lock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.lock:
            return self.linear(x)


def test_a_model_that_cannot_be_copied_is_built_checked_and_trained() -> None:
    """Its build had failed in the checks' meta copy, `TypeError: cannot pickle '_thread.lock'
    object`, said under the CLI as the factory's fault (a probe, 2026-12-07)."""
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 3, (32,)))
    built = trainers.workload_from_parts(
        _Locked(), data, classification_loss, optimizer=adam(), batch_size=8
    )
    held_out = [(torch.randn(8, 8), torch.randint(0, 3, (8,)))]
    trainer = trainers.Trainer(built, device="cpu", eval_data=held_out)
    result = trainer.fit(2, eval_every=1)
    assert len(result.losses) == 2 and len(result.evals) == 2

    def factory(preset: str, *, seed: int) -> Workload:
        torch.manual_seed(seed)
        return trainers.workload_from_parts(
            _Locked(), data, classification_loss, optimizer=adam(), batch_size=8
        )

    reused = ReusedBuilds(factory)
    losses = [
        trajectory(reused, "x", REFERENCE, RunArgs(steps=3, device="cpu")).losses for _ in range(2)
    ]
    assert losses[0] == losses[1] and reused.builds == 2 and reused.copies == 0
    assert reused.reason is not None and "cannot be copied (TypeError" in reused.reason
