"""The loop core (`trainers.core`) on the CPU: `trainers.run` (measurement) and `Trainer.fit`
(training) are both built and stepped by it, so for the same config and seed they train the same
model and give the same losses, sync at the same steps, and a part swapped in the core (a planted
fault) reaches both."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import trainers
from trainers import LoopConfig, RunArgs, Trainer, core, run, workload_from_parts
from trainers.gate import planted


def dropout_workload(seed: int = 0) -> trainers.Workload:
    """A small MLP with dropout: its losses depend on every random number the loop draws."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(40, 6, generator=generator)
    y = x.sum(dim=1, keepdim=True)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        inputs, targets = batch
        return nn.functional.mse_loss(model(inputs), targets)

    return workload_from_parts(
        model,
        TensorDataset(x, y),
        loss_fn,
        optimizer=lambda params, capturable: torch.optim.AdamW(params, lr=3e-3),
        batch_size=8,  # 5 batches an epoch: 14 steps cross two epoch boundaries
    )


def mlp() -> trainers.Workload:
    return trainers.load_workload("mlp", "tiny", seed=3)


def transformer() -> trainers.Workload:
    return trainers.load_workload("transformer", "tiny", seed=3)


CASES: list[tuple[Callable[[], trainers.Workload], LoopConfig]] = [
    (mlp, LoopConfig()),
    (mlp, LoopConfig(sync_interval=4, sync_mode="synchronize")),
    (mlp, LoopConfig(num_streams=2, sync_interval=3, sync_mode="event", prefetch_depth=2)),
    (mlp, LoopConfig(sync_interval=5, sync_mode="query", prefetch_depth=1, optimizer="foreach")),
    (dropout_workload, LoopConfig(sync_interval=3, prefetch_depth=2, num_workers=2)),
    (transformer, LoopConfig(num_streams=3, sync_interval=2, prefetch_depth=3)),
]


@pytest.mark.parametrize(
    ("make", "config"),
    CASES,
    ids=["mlp-idiom", "mlp-sync4", "mlp-event3-prefetch", "mlp-query5", "dropout-workers", "tf"],
)
def test_run_and_fit_give_the_same_losses_for_the_same_config_and_seed(
    make: Callable[[], trainers.Workload], config: LoopConfig
) -> None:
    torch.manual_seed(0)
    measured = run(make(), config, RunArgs(steps=10, warmup=4, windows=2, device="cpu"))
    torch.manual_seed(0)
    trained = Trainer(make(), config, device="cpu").fit(14)
    assert len(measured.losses) == 14
    assert trained.losses == measured.losses
    # The same sync rule: the loss harvest blocked at the same steps, as often.
    assert trained.n_syncs == measured.n_syncs
    assert measured.losses[-1] != measured.losses[0]


def test_both_sync_after_every_intervalth_step_counted_from_the_start_of_training() -> None:
    config = LoopConfig(sync_interval=4, sync_mode="event")
    seen: list[tuple[int, int]] = []
    trainer = Trainer(mlp(), config, device="cpu")
    trainer.fit(6, on_losses=lambda first, values: seen.append((first, len(values))))
    # A second call resumes at step 6: its first sync is after step 8, as in one call of 10.
    trainer.fit(10, on_losses=lambda first, values: seen.append((first, len(values))))
    assert seen == [(0, 4), (4, 2), (6, 2), (8, 2)]
    result = run(mlp(), config, RunArgs(steps=10, warmup=0, windows=1, device="cpu"))
    assert result.loss_check["extractions"] == 3  # after steps 4 and 8, and the final drain


def test_a_part_swapped_in_the_core_reaches_both_users() -> None:
    config = LoopConfig(sync_interval=2)
    plain = run(mlp(), config, RunArgs(steps=6, warmup=0, windows=1, device="cpu")).losses
    with planted("wrong-op"):
        assert core.EagerStep.__name__ == "WrongOpEagerStep"
        measured = run(mlp(), config, RunArgs(steps=6, warmup=0, windows=1, device="cpu")).losses
        trained = Trainer(mlp(), config, device="cpu").fit(6).losses
    assert measured == trained
    assert measured[0] == plain[0]  # the first loss comes before the first (wrong) update
    assert measured[1:] != plain[1:]


def test_the_engine_starts_a_model_without_its_old_gradients() -> None:
    workload = mlp()
    for param in workload.model.parameters():
        param.grad = torch.ones_like(param)
    engine = core.Engine(workload, LoopConfig(), device="cpu")
    assert all(p.grad is None for p in engine.model.parameters())
    assert engine.step_model is engine.model  # compile="none": nothing wraps it
    assert engine.peak_memory_bytes() is None  # CPU: no allocator statistics


def test_the_session_restores_the_matmul_precision_and_closes_its_workers() -> None:
    before = torch.get_float32_matmul_precision()
    engine = core.Engine(mlp(), LoopConfig(num_workers=1), device="cpu", precision="tf32")
    session = engine.session(capacity=2)
    with session:
        assert torch.get_float32_matmul_precision() == "high"
        session.step(0)
        session.step(1)
        session.drain()
        workers = session.loaders[0]._iterator
        assert workers is not None and workers._workers_status[0]  # type: ignore[attr-defined]
    assert torch.get_float32_matmul_precision() == before
    assert session.matmul_precision == "high"
    assert not any(workers._workers_status)  # type: ignore[attr-defined]
    assert len(session.losses) == 2


def test_micro_batches_are_checked_where_they_are_drawn() -> None:
    engine = core.Engine(mlp(), LoopConfig(), device="cpu")
    with pytest.raises(trainers.ConfigError, match="micro_batches"):
        engine.session(capacity=1, micro_batches=0)
