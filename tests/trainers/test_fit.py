"""`trainers.Trainer` on the CPU: real training of the built-in workloads and of small models built
here, checked against what plain PyTorch computes (resume, accumulation, schedules, clipping,
evaluation, loss callbacks) and against the errors it promises before any step."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import LinearLR, OneCycleLR, ReduceLROnPlateau
from torch.utils.data import DataLoader, TensorDataset

import trainers
from trainers import ConfigError, LoopConfig, Trainer, UnsupportedOnDevice, fit, workload_from_parts

EVENT_EVERY_3 = LoopConfig(num_streams=2, sync_mode="event", sync_interval=3, prefetch_depth=2)


def warmup_cosine(total: int, warmup: int = 2):  # type: ignore[no-untyped-def]
    return fit.warmup_cosine(total, warmup, start_factor=0.1)


def dropout_workload(seed: int = 0, *, samples: int = 96, batch: int = 8) -> trainers.Workload:
    """A small MLP with dropout on seeded samples: its losses depend on the RNG state."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 1))
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 6, generator=generator)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(samples, 1, generator=generator)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        inputs, targets = batch
        return nn.functional.mse_loss(model(inputs), targets)

    return workload_from_parts(
        model,
        TensorDataset(x, y),
        loss_fn,
        optimizer=lambda params, capturable: torch.optim.AdamW(params, lr=3e-3),
        batch_size=batch,
    )


# -- resume ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "config"),
    [
        (lambda: trainers.load_workload("transformer", "tiny", seed=0), EVENT_EVERY_3),
        (lambda: trainers.load_workload("mlp", "tiny", seed=0), LoopConfig(sync_mode="query")),
        (dropout_workload, EVENT_EVERY_3),
    ],
    ids=["transformer-tiny", "mlp-tiny-query", "dropout-mlp"],
)
def test_a_resumed_run_gives_the_uninterrupted_losses_bit_for_bit(
    tmp_path: Path, make, config: LoopConfig
) -> None:
    options = dict(
        config=config,
        device="cpu",
        scheduler=warmup_cosine(10),
        clip_grad_norm=0.5,
        accumulate=2,
    )
    whole = Trainer(make(), **options).fit(10)

    first = Trainer(make(), **options)
    half = first.fit(6, checkpoint_every=3, checkpoint_path=tmp_path / "run.pt")
    assert half.checkpoints == [str(tmp_path / "run.pt")] * 2
    # The run dies after step 6; a new process resumes from the checkpoint written at step 6.
    resumed_trainer = Trainer(make(), **options)
    resumed = resumed_trainer.fit(10, resume_from=tmp_path / "run.pt")

    assert resumed.start_step == 6 and resumed.step == 10
    assert half.losses + resumed.losses == whole.losses
    assert len(set(whole.losses)) == len(whole.losses)  # the losses move: the test can fail
    last = Trainer(make(), **options)
    last.fit(10)
    for ours, theirs in zip(
        resumed_trainer.model.parameters(), last.model.parameters(), strict=True
    ):
        assert torch.equal(ours, theirs)


def test_resuming_without_restoring_the_rng_would_differ(tmp_path: Path) -> None:
    """The dropout workload's losses depend on the RNG: the resume test above can catch a
    checkpoint that forgot it."""
    options = dict(config=EVENT_EVERY_3, device="cpu")
    whole = Trainer(dropout_workload(), **options).fit(6)
    Trainer(dropout_workload(), **options).fit(
        3, checkpoint_every=3, checkpoint_path=tmp_path / "c"
    )
    state = torch.load(tmp_path / "c", weights_only=False)
    state["rng"]["torch"] = torch.manual_seed(99).get_state()
    torch.save(state, tmp_path / "c")
    resumed = Trainer(dropout_workload(), **options).fit(6, resume_from=tmp_path / "c")
    assert resumed.losses != whole.losses[3:]


def test_a_second_fit_goes_on_where_the_first_stopped() -> None:
    whole = Trainer(trainers.load_workload("mlp", "tiny"), EVENT_EVERY_3, device="cpu").fit(8)
    trainer = Trainer(trainers.load_workload("mlp", "tiny"), EVENT_EVERY_3, device="cpu")
    assert trainer.fit(5).losses + trainer.fit(8).losses == whole.losses


# -- accumulation ----------------------------------------------------------------------------


def test_k_micro_batches_train_like_one_k_times_batch() -> None:
    def run(batch: int, accumulate: int) -> tuple[list[float], list[torch.Tensor]]:
        workload = dropout_workload(samples=96, batch=batch)
        for module in workload.model.modules():
            if isinstance(module, nn.Dropout):
                module.p = 0.0
        trainer = Trainer(
            workload, LoopConfig(sync_interval=2), device="cpu", accumulate=accumulate
        )
        result = trainer.fit(6)
        return result.losses, [p.detach().clone() for p in trainer.model.parameters()]

    big_losses, big_params = run(batch=12, accumulate=1)
    micro_losses, micro_params = run(batch=4, accumulate=3)
    # Documented tolerance: float32 sums in another order (micro-batch means, then their mean).
    assert micro_losses == pytest.approx(big_losses, rel=1e-5, abs=1e-6)
    for micro, big in zip(micro_params, big_params, strict=True):
        torch.testing.assert_close(micro, big, rtol=1e-4, atol=1e-6)
    # Not the same as stepping on each micro-batch: the test can fail.
    stepped_losses, _ = run(batch=4, accumulate=1)
    assert stepped_losses[1:6] != pytest.approx(micro_losses[1:6], rel=1e-3)


# -- learning-rate schedules -------------------------------------------------------------------


def linear_probe(lr: float = 0.5) -> trainers.Workload:
    """loss = sum(w): every gradient is 1, so plain SGD moves w by exactly the step's lr (in
    float64, so the subtraction loses nothing a float32 rate has)."""
    model = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.0)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return model.weight.sum() + 0.0 * batch[0].sum()

    return workload_from_parts(
        model,
        TensorDataset(torch.zeros(64, 1, dtype=torch.float64)),
        loss_fn,
        optimizer=lambda params, capturable: torch.optim.SGD(params, lr=lr),
        batch_size=4,
    )


SCHEDULES = pytest.mark.parametrize(
    "schedule",
    [
        warmup_cosine(12, warmup=3),
        lambda opt: OneCycleLR(opt, max_lr=1.0, total_steps=12, cycle_momentum=False),
        lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.3),
    ],
    ids=["warmup-cosine", "one-cycle", "step"],
)


@pytest.mark.parametrize("lr_tensor", [False, True])
@SCHEDULES
def test_the_learning_rates_applied_are_the_schedulers_own(schedule, lr_tensor: bool) -> None:
    check_applied_rates(schedule, LoopConfig(), lr_tensor=lr_tensor)


@pytest.mark.slow
@SCHEDULES
def test_a_compiled_optimizer_step_follows_the_schedule_through_its_tensor_rate(schedule) -> None:
    """optimizer='compiled' (Inductor's C++ backend here): the rate becomes a tensor, so the
    compiled step reads each new value instead of baking the first one in."""
    trainer = check_applied_rates(schedule, LoopConfig(optimizer="compiled"), lr_tensor=None)
    assert isinstance(trainer.optimizer.param_groups[0]["lr"], torch.Tensor)


def check_applied_rates(schedule, config: LoopConfig, *, lr_tensor: bool | None) -> Trainer:
    workload = linear_probe()
    weights: list[float] = []
    trainer = Trainer(workload, config, device="cpu", scheduler=schedule, lr_tensor=lr_tensor)
    lr_tensor = isinstance(trainer.optimizer.param_groups[0]["lr"], torch.Tensor)
    weights.append(float(trainer.model.weight.detach()))

    def record(first: int, losses: list[float]) -> None:
        weights.append(float(trainer.model.weight.detach()))

    trainer.fit(12, on_losses=record)
    applied = [before - after for before, after in itertools.pairwise(weights)]

    reference_model = nn.Linear(1, 1, bias=False)
    optimizer = torch.optim.SGD(reference_model.parameters(), lr=0.5)
    scheduler = schedule(optimizer)
    expected = []
    for _ in range(12):
        expected.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    # A tensor rate is float32: equal to the scheduler's float64 value within float32 rounding.
    assert applied == pytest.approx(expected, rel=1e-6 if lr_tensor else 1e-12)
    assert len(set(round(x, 6) for x in expected)) > 2  # the schedule changes the rate
    return trainer


def test_schedulers_that_cannot_drive_the_loop_are_refused_before_any_step() -> None:
    workload = trainers.load_workload("mlp", "tiny")
    with pytest.raises(ConfigError, match=r"^scheduler='ReduceLROnPlateau' is invalid: allowed a "):
        Trainer(workload, device="cpu", scheduler=lambda opt: ReduceLROnPlateau(opt))
    with pytest.raises(ConfigError, match=r"cycle_momentum=True\)' is invalid: allowed cycle_mom"):
        Trainer(
            workload,
            LoopConfig(optimizer="compiled"),
            device="cpu",
            scheduler=lambda opt: OneCycleLR(opt, max_lr=1e-2, total_steps=10),
        )
    other = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    with pytest.raises(ConfigError, match="a scheduler built on the optimizer the factory"):
        Trainer(workload, device="cpu", scheduler=lambda opt: LinearLR(other))
    with pytest.raises(ConfigError, match=r"a factory returning a torch\.optim\.lr_scheduler"):
        Trainer(workload, device="cpu", scheduler=lambda opt: "cosine")
    # Nothing trained: the model is as built.
    fresh = trainers.load_workload("mlp", "tiny")
    for ours, theirs in zip(workload.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)


# -- clipping ----------------------------------------------------------------------------------


def test_clipping_equals_clip_grad_norm() -> None:
    max_norm = 0.05
    trainer = Trainer(
        trainers.load_workload("transformer", "tiny"),
        LoopConfig(sync_interval=4),
        device="cpu",
        clip_grad_norm=max_norm,
    )
    ours = trainer.fit(6).losses

    workload = trainers.load_workload("transformer", "tiny")
    optimizer = workload.make_optimizer(workload.model.parameters(), False)
    theirs, norms = [], []
    for index in range(6):
        batch = workload.dataset[index]
        optimizer.zero_grad(set_to_none=True)
        loss = workload.loss_fn(workload.model, batch)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(workload.model.parameters(), max_norm)))
        optimizer.step()
        theirs.append(float(loss))
    assert ours == theirs
    assert max(norms) > max_norm  # the clip did clip
    for a, b in zip(trainer.model.parameters(), workload.model.parameters(), strict=True):
        assert torch.equal(a, b)


# -- evaluation and callbacks --------------------------------------------------------------------


def test_evaluation_reports_the_held_out_loss_and_leaves_training_alone() -> None:
    held_out = [trainers.load_workload("convnet", "tiny", seed=1).dataset[i] for i in range(2)]
    plain = Trainer(trainers.load_workload("convnet", "tiny"), EVENT_EVERY_3, device="cpu").fit(6)
    seen: list[tuple[int, float]] = []
    trainer = Trainer(
        trainers.load_workload("convnet", "tiny"), EVENT_EVERY_3, device="cpu", eval_data=held_out
    )
    result = trainer.fit(6, eval_every=2, on_eval=lambda step, loss: seen.append((step, loss)))
    # BatchNorm in eval mode neither updates its statistics nor changes the next steps.
    assert result.losses == plain.losses
    assert [step for step, _ in result.evals] == [2, 4, 6] and seen == result.evals

    workload = trainers.load_workload("convnet", "tiny")
    workload.model.load_state_dict(trainer.model.state_dict())
    workload.model.eval()
    with torch.no_grad():
        expected = sum(float(workload.loss_fn(workload.model, b)) for b in held_out) / 2
    assert result.evals[-1][1] == pytest.approx(expected, rel=1e-6)


def test_loss_callbacks_arrive_in_step_order_once_each_at_the_configs_sync_points() -> None:
    calls: list[tuple[int, int]] = []
    trainer = Trainer(trainers.load_workload("mlp", "tiny"), EVENT_EVERY_3, device="cpu")
    result = trainer.fit(10, on_losses=lambda first, values: calls.append((first, len(values))))
    assert calls == [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert result.n_syncs == 4  # one per sync point: the callbacks added none
    again = trainer.fit(12, on_losses=lambda first, values: calls.append((first, len(values))))
    assert calls[4:] == [(10, 2)] and len(again.losses) == 2


@pytest.mark.parametrize("every", [1, 2, 4])
def test_n_syncs_counts_each_step_that_harvested_checkpoints_included(
    tmp_path: Path, every: int
) -> None:
    """Its docstring had said checkpoints were not counted, and they were: a checkpoint every
    step gave 10 for the plain run's 4 (a probe, 2026-12-07). A checkpoint's drain harvests
    the losses before it; a sync point after it with none pending does not block."""
    plain = Trainer(trainers.load_workload("mlp", "tiny"), EVENT_EVERY_3, device="cpu").fit(10)
    saved = Trainer(trainers.load_workload("mlp", "tiny"), EVENT_EVERY_3, device="cpu").fit(
        10, checkpoint_every=every, checkpoint_path=tmp_path / "run.pt"
    )
    harvested_at = {3, 6, 9, 10} | set(range(every, 11, every))
    assert plain.n_syncs == 4 and saved.n_syncs == len(harvested_at)
    assert saved.losses == plain.losses and len(saved.checkpoints) == 10 // every


# -- parts and errors --------------------------------------------------------------------------


def test_a_users_own_model_loader_and_optimizer_train_through_the_loop() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    workload = workload_from_parts(model, loader, loss_fn, optimizer=optimizer)
    assert workload.batch_size == 8 and workload.samples_per_batch == 8
    result = Trainer(workload, LoopConfig(sync_interval=5), device="cpu").fit(40)
    assert result.losses[-1] < 0.6 * result.losses[0]


def test_a_submodule_the_user_froze_in_eval_mode_stays_so_through_fit_and_evaluate() -> None:
    """Fine-tuning with a frozen BatchNorm: `model.train(); model[1].eval()`. The Trainer had
    switched it back to train mode, updating its running statistics and changing the losses."""

    def parts() -> tuple[nn.Module, list[tuple[torch.Tensor, torch.Tensor]]]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 2))
        model[1].running_mean.fill_(0.5)
        model.train()
        model[1].eval()
        g = torch.Generator().manual_seed(1)
        batches = [(torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g))]
        return model, batches * 6

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    model, batches = parts()  # the plain loop the user would write
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    expected = []
    for batch in batches:
        optimizer.zero_grad()
        loss = loss_fn(model, batch)
        loss.backward()
        optimizer.step()
        expected.append(loss.item())

    mine, same = parts()
    workload = workload_from_parts(
        mine, same, loss_fn, optimizer=lambda p: torch.optim.SGD(p, lr=0.1)
    )
    trainer = Trainer(workload, LoopConfig(sync_interval=3), device="cpu", eval_data=same[:1])
    result = trainer.fit(6, eval_every=3)
    assert result.losses == pytest.approx(expected, rel=1e-6)
    assert [m.training for m in mine] == [True, False, True, True]
    assert torch.equal(mine[1].running_mean, torch.full((8,), 0.5))


def test_data_a_step_cannot_index_and_held_out_samples_are_named() -> None:
    model = nn.Linear(4, 2)
    x, y = torch.randn(16, 4), torch.randint(0, 2, (16,))

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = ((x[i : i + 4], y[i : i + 4]) for i in range(0, 16, 4))
    with pytest.raises(ConfigError, match=r"^data='generator' is invalid: allowed a Dataset wi"):
        workload_from_parts(model, batches, loss_fn, optimizer=sgd)  # type: ignore[arg-type]
    samples = TensorDataset(x, y)
    workload = workload_from_parts(model, samples, loss_fn, optimizer=sgd, batch_size=4)
    with pytest.raises(ConfigError, match=r"^eval_data='TensorDataset' is invalid: allowed batc"):
        Trainer(workload, device="cpu", eval_data=samples)
    held_out = DataLoader(samples, batch_size=4)
    assert Trainer(workload, device="cpu", eval_data=held_out).evaluate() > 0


def test_bad_options_are_refused_before_any_step(tmp_path: Path) -> None:
    workload = trainers.load_workload("mlp", "tiny")
    cases = [
        (dict(accumulate=0), r"^accumulate=0 is invalid: allowed an integer >= 1$"),
        (dict(clip_grad_norm=-1.0), r"^clip_grad_norm=-1.0 is invalid: allowed None or a number"),
        (dict(clip_grad_norm=True), r"^clip_grad_norm=True is invalid"),
        (dict(config={"num_streams": 2}), r"^config='dict' is invalid: allowed a trainers.LoopC"),
    ]
    for options, message in cases:
        with pytest.raises(ConfigError, match=message):
            Trainer(workload, device="cpu", **options)
    # Not a string: the device pattern's TypeError had come out bare.
    for device in (0, None):
        with pytest.raises(ConfigError, match=rf"^device={device} is invalid: .*or a torch.device"):
            Trainer(workload, device=device)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^device='gpu' is invalid: allowed auto, .*INDEX$"):
        Trainer(workload, device="gpu")
    with pytest.raises(UnsupportedOnDevice, match="cuda_graph"):
        Trainer(workload, LoopConfig(cuda_graph=True), device="cpu")
    if not torch.cuda.is_available():
        # Said as the argument is: it had said "use --device cpu", a flag Python has not.
        with pytest.raises(UnsupportedOnDevice, match=r"^device='cuda:0': CUDA is not ") as info:
            Trainer(workload, device="cuda:0")
        assert str(info.value).endswith("; allowed cpu or auto")
    trainer = Trainer(workload, device="cpu")
    with pytest.raises(ConfigError, match=r"^steps=0 is invalid: allowed an integer > 0"):
        trainer.fit(0)
    with pytest.raises(ConfigError, match=r"^eval_every=2 is invalid: allowed None when"):
        trainer.fit(4, eval_every=2)
    with pytest.raises(ConfigError, match=r"^checkpoint_path=None is invalid: allowed a file"):
        trainer.fit(4, checkpoint_every=2)
    with pytest.raises(ConfigError, match=r"^resume_from='.*missing.pt' is invalid: allowed an"):
        trainer.fit(4, resume_from=tmp_path / "missing.pt")
    assert trainer.step == 0
    trainer.fit(4, checkpoint_every=4, checkpoint_path=tmp_path / "c.pt")
    with pytest.raises(ConfigError, match=r"^steps=3 is invalid: allowed an integer > 4"):
        trainer.fit(3)
    other = Trainer(trainers.load_workload("mlp", "tiny"), device="cpu", accumulate=2)
    with pytest.raises(ConfigError, match=r"^accumulate=2 is invalid: allowed 1, as in the check"):
        other.fit(8, resume_from=tmp_path / "c.pt")
    assert other.step == 0
    assert math.isfinite(trainer.fit(5).losses[0])


def test_more_bad_options_are_refused_before_any_step(tmp_path: Path) -> None:
    workload = trainers.load_workload("mlp", "tiny")
    batch = workload.dataset[0]
    cases = [
        (dict(scheduler="cosine"), r"^scheduler='str' is invalid: allowed None or a factory"),
        (dict(lr_tensor="no"), r"^lr_tensor='no' is invalid: allowed None \(decided by the con"),
        (dict(eval_loss=3), r"^eval_loss='int' is invalid: allowed None or loss_fn\(model, batch"),
        (dict(eval_data=batch), r"^eval_data='one batch' is invalid: allowed a collection of ba"),
        (dict(eval_data=iter([batch])), r"^eval_data='list_iterator' is invalid: allowed a coll"),
        (dict(eval_data=3), r"^eval_data='int' is invalid: allowed an iterable of batches"),
        # These had trained eval_every steps, then failed at the first evaluation (a user's
        # probe, 2026-12-06): a Hugging Face batch as a dict had been iterated as its keys.
        (dict(eval_data=[]), r"^eval_data='empty' is invalid: allowed at least one batch$"),
        (
            dict(eval_data={"x": batch[0], "y": batch[1]}),
            r"^eval_data='one batch as a dict \(iterated, its keys\)' is invalid: .*\[batch\]",
        ),
        (dict(eval_data="abc"), r"^eval_data='str' is invalid: allowed an iterable of batches"),
        (dict(eval_data=[1, 2]), r"^eval_data='batches of int' is invalid: allowed batches of t"),
        (
            dict(eval_data=[(batch[0], "label")]),
            r"^eval_data='batches of tuple \(Tensor, str\)' is invalid: allowed batches of tensors",
        ),
        (
            dict(config=LoopConfig(compile="reduce-overhead"), accumulate=2),
            r"^accumulate=2 is invalid: allowed 1 with compile='reduce-overhead'",
        ),
    ]
    for options, message in cases:
        with pytest.raises(ConfigError, match=message):
            Trainer(workload, device="cpu", **options)
    trainer = Trainer(workload, device="cpu")
    with pytest.raises(ConfigError, match=r"^checkpoint_every=None is invalid: allowed an integ"):
        trainer.fit(4, checkpoint_path=tmp_path / "c.pt")
    assert trainer.step == 0 and not (tmp_path / "c.pt").exists()


def _sgd_workload(width: int = 16, optimizer: Any = torch.optim.SGD) -> trainers.Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Linear(width, 1))
    data = TensorDataset(torch.randn(64, 6), torch.randn(64, 1))
    return workload_from_parts(
        model,
        data,
        lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
        optimizer=lambda params, capturable: optimizer(params, lr=0.1),
        batch_size=8,
    )


class _Other:
    """An object torch.load(weights_only=True) refuses."""


def test_a_checkpoint_of_another_model_optimizer_or_no_checkpoint_is_refused_whole(
    tmp_path: Path,
) -> None:
    """A user's probe (2026-12-05): a junk or truncated file raised torch's KeyError or
    RuntimeError, another model's checkpoint torch's "Error(s) in loading state_dict", and an
    SGD checkpoint loaded into an Adam Trainer raised `KeyError: 'betas'` at its first step with
    the weights already replaced."""
    path = tmp_path / "c.pt"
    Trainer(_sgd_workload(), device="cpu").fit(4, checkpoint_every=4, checkpoint_path=path)
    (tmp_path / "junk.pt").write_text("junk\n")
    (tmp_path / "cut.pt").write_bytes(path.read_bytes()[:3000])
    for bad in ("junk.pt", "cut.pt"):
        with pytest.raises(ConfigError, match=r"allowed a checkpoint written by Trainer.save \("):
            Trainer(_sgd_workload(), device="cpu").load(tmp_path / bad)
    with pytest.raises(ConfigError, match=r"not a folder"):
        Trainer(_sgd_workload(), device="cpu").load(tmp_path)
    # A file of other objects: what it holds, not torch's page of advice to load it with
    # weights_only=False, colour codes and all (a probe, 2026-12-06).
    torch.save({"model": _Other()}, tmp_path / "objects.pt")
    with pytest.raises(ConfigError) as info:
        Trainer(_sgd_workload(), device="cpu").load(tmp_path / "objects.pt")
    assert str(info.value).endswith(
        f"could not read this one: it holds Python objects such as {__name__}._Other, where a "
        "Trainer checkpoint holds tensors and plain values)"
    ), info.value
    wider = Trainer(_sgd_workload(width=32), device="cpu")
    # The file is named, and what in it differs (it had said only "resume_from='3 tensors").
    refused = (
        rf"^path='{re.escape(str(path))}' is invalid: allowed a checkpoint of this model: "
        r".*; the file and this model differ in 3 tensors \(0.bias, 0.weight, 2.weight\)$"
    )
    with pytest.raises(ConfigError, match=refused):
        wider.load(path)
    # A state given as it is, read from no file: what it holds goes in the value's place.
    state = torch.load(path, weights_only=True)
    refused = r"^state='3 tensors \(0.bias, 0.weight, 2.weight\)' is invalid"
    with pytest.raises(ConfigError, match=refused):
        wider.load_state_dict(state)
    trainer = Trainer(_sgd_workload(optimizer=torch.optim.Adam), device="cpu")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(ConfigError, match=r"a checkpoint of this optimizer \(Adam, settings"):
        trainer.load(path)
    after = list(trainer.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))  # untouched
    assert trainer.step == 0 and math.isfinite(trainer.fit(2).losses[0])
    resumed = Trainer(_sgd_workload(), device="cpu")
    resumed.load(path)  # its own checkpoint still resumes
    assert resumed.step == 4
    # save() to a folder: refused before anything is written (it had left `folder.partial`
    # beside the folder, then raised IsADirectoryError; a probe, 2026-12-06).
    folder = tmp_path / "runs"
    folder.mkdir()
    with pytest.raises(ConfigError, match=r"^path='.*runs' is invalid: allowed a file path"):
        resumed.save(folder)
    assert sorted(p.name for p in tmp_path.iterdir() if "runs" in p.name) == ["runs"]


def test_a_checkpoint_resumes_only_under_its_own_config(tmp_path: Path) -> None:
    Trainer(trainers.load_workload("mlp", "tiny"), EVENT_EVERY_3, device="cpu").fit(
        3, checkpoint_every=3, checkpoint_path=tmp_path / "c.pt"
    )
    other = Trainer(
        trainers.load_workload("mlp", "tiny"),
        EVENT_EVERY_3.replace(optimizer="foreach", sync_interval=5),
        device="cpu",
    )
    with pytest.raises(ConfigError) as info:
        other.fit(6, resume_from=tmp_path / "c.pt")
    message = str(info.value)
    # The optimizer's kind refuses it; the sync interval, which orders work only, is not named.
    assert message.startswith("""config="optimizer='foreach'" is invalid: allowed"""), message
    assert "optimizer='as-built')" in message and "sync_interval" not in message, message
    assert other.step == 0
    # A config that differs in such settings only resumes, on the same losses as the run that
    # went on (a run trained with the defaults, then tuned, had been refused its tuned config).
    whole = Trainer(trainers.load_workload("mlp", "tiny"), EVENT_EVERY_3, device="cpu").fit(6)
    tuned = EVENT_EVERY_3.replace(sync_interval=2, num_streams=2, prefetch_depth=2)
    resumed = Trainer(trainers.load_workload("mlp", "tiny"), tuned, device="cpu")
    done = resumed.fit(6, resume_from=tmp_path / "c.pt")
    assert done.start_step == 3 and done.losses == whole.losses[3:]


class CountingBatches(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Whole batches, counting what is loaded: a resume must not load what it skips."""

    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 4, 6, generator=generator)
        self.y = self.x.sum(dim=2, keepdim=True)
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.loaded.append(index)
        return self.x[index], self.y[index]


def counting_workload() -> trainers.Workload:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
    return workload_from_parts(
        model,
        CountingBatches(5),
        lambda model, batch: nn.functional.mse_loss(model(batch[0]), batch[1]),
        optimizer=lambda params, capturable: torch.optim.Adam(params, lr=0.01),
    )


def test_a_resume_enters_the_data_at_its_position_without_loading_what_came_before(
    tmp_path: Path,
) -> None:
    whole = Trainer(counting_workload(), LoopConfig(sync_interval=2), device="cpu").fit(11)
    Trainer(counting_workload(), LoopConfig(sync_interval=2), device="cpu").fit(
        7, checkpoint_every=7, checkpoint_path=tmp_path / "c.pt"
    )
    workload = counting_workload()
    # Built from parts, it read its first batch once to check it (trainers.workloads.checks).
    assert workload.dataset.loaded == [0]
    workload.dataset.loaded.clear()
    resumed = Trainer(workload, LoopConfig(sync_interval=2), device="cpu").fit(
        11, resume_from=tmp_path / "c.pt"
    )
    # Step 7 is batch 2 of the second epoch (5 batches an epoch): 2, 3, 4, then the third
    # epoch's 0; nothing before batch 2 was loaded.
    assert resumed.losses == whole.losses[7:]
    assert workload.dataset.loaded == [2, 3, 4, 0]


def test_a_shuffling_loader_is_refused_and_a_built_adamw_is_made_capturable() -> None:
    model = nn.Linear(3, 1)
    data = TensorDataset(torch.zeros(8, 3), torch.zeros(8, 1))
    with pytest.raises(ConfigError, match=r"^data='DataLoader\(sampler=RandomSampler\)' is inv"):
        workload_from_parts(
            model,
            DataLoader(data, batch_size=4, shuffle=True),
            lambda m, b: m(b[0]).sum(),
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        )
    # The loop's own loader would drop these: refused, not run without them.
    for option, value in (("worker_init_fn", print), ("multiprocessing_context", "spawn")):
        with pytest.raises(ConfigError, match=rf"^data='DataLoader\({option}=\.\.\.\)' is inv"):
            workload_from_parts(
                model,
                DataLoader(data, batch_size=4, num_workers=1, **{option: value}),
                lambda m, b: m(b[0]).sum(),
                optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            )
    built = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.05)
    workload = workload_from_parts(
        model, DataLoader(data, batch_size=4), lambda m, b: m(b[0]).sum(), optimizer=built
    )
    capturable = workload.make_optimizer(model.parameters(), True)
    assert type(capturable) is torch.optim.AdamW
    assert capturable.param_groups[0]["capturable"] is True
    assert capturable.param_groups[0]["weight_decay"] == 0.05
    assert workload.make_optimizer(model.parameters(), False) is built


def test_fp16_clipping_sees_the_unscaled_gradients() -> None:
    """fp16 autocast with a loss scaler: the clip runs after unscale_, as the PyTorch AMP recipe
    says, so the Trainer equals that recipe written by hand."""
    try:
        trainer = Trainer(
            trainers.load_workload("mlp", "tiny"),
            LoopConfig(sync_interval=3),
            device="cpu",
            precision="fp16-autocast",
            clip_grad_norm=0.05,
        )
    except UnsupportedOnDevice as exc:
        pytest.skip(str(exc))
    ours = trainer.fit(6).losses
    workload = trainers.load_workload("mlp", "tiny")
    optimizer = workload.make_optimizer(workload.model.parameters(), False)
    scaler = torch.amp.GradScaler("cpu")
    theirs = []
    for index in range(6):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16, cache_enabled=False):
            loss = workload.loss_fn(workload.model, workload.dataset[index])
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(workload.model.parameters(), 0.05)
        scaler.step(optimizer)
        scaler.update()
        theirs.append(float(loss))
    assert ours == theirs


def test_warmup_cosine_refuses_a_schedule_it_cannot_make_and_holds_its_end() -> None:
    """A user's probe (2026-12-05): `warmup_cosine(10, 20)` flipped the rate between 0 and the
    full rate every step after the warm-up, and past `total_steps` the periodic cosine climbed
    back to the full rate (a run resumed past its plan)."""
    for args, said in [
        ((10, 20), r"^warmup_steps=20 is invalid: allowed 0 to 9 \(< total_steps\)"),
        ((10, 10), r"^warmup_steps=10 is invalid"),
        ((0, 0), r"^total_steps=0 is invalid: allowed an integer >= 1"),
        ((-5, 2), r"^total_steps=-5 is invalid"),
        ((10, -1), r"^warmup_steps=-1 is invalid"),
        ((10, 2.5), r"^warmup_steps=2.5 is invalid: allowed an integer"),
    ]:
        with pytest.raises(ConfigError, match=said):
            fit.warmup_cosine(*args)
    with pytest.raises(ConfigError, match=r"^start_factor=0 is invalid: allowed a number in"):
        fit.warmup_cosine(10, 2, start_factor=0)
    optimizer = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    scheduler = fit.warmup_cosine(10, 2, start_factor=0.1)(optimizer)
    rates = []
    for _ in range(25):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[0] == pytest.approx(0.1) and rates[2] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(rates[2:]))  # decays, never climbs back
    assert rates[10:] == [0.0] * 15
    optimizer = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    scheduler = fit.warmup_cosine(4, 0)(optimizer)  # no warm-up: the full rate first
    rates = []
    for _ in range(6):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert rates[0] == 1.0 and rates[2] == pytest.approx(0.5) and rates[4:] == [0.0, 0.0]


def test_a_dataloader_of_a_batch_sampler_trains_in_its_batches_or_is_refused() -> None:
    """`DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 16, False))` has
    batch_size None: the loop had fed the model single samples (a user's probe, 2026-12-05)."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    seen: list[int] = []

    def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        seen.append(batch[0].shape[0])
        return nn.functional.mse_loss(model(batch[0]), batch[1])

    sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(data), 16, False)
    loader = DataLoader(data, batch_sampler=sampler)
    workload = workload_from_parts(nn.Linear(4, 1), loader, loss, optimizer=torch.optim.SGD)
    assert workload.batch_size == 16 and workload.samples_per_batch == 16
    seen.clear()
    Trainer(workload, device="cpu").fit(2)
    assert seen == [16, 16]
    shuffled = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(data), 16, False)
    with pytest.raises(ConfigError, match=r"^data='DataLoader\(batch_sampler=BatchSampler\)'"):
        workload_from_parts(
            nn.Linear(4, 1),
            DataLoader(data, batch_sampler=shuffled),
            loss,
            optimizer=torch.optim.SGD,
        )


@pytest.mark.parametrize("config", [LoopConfig(), EVENT_EVERY_3], ids=["every-step", "event-3"])
def test_a_loss_callback_that_raises_leaves_the_count_right_and_the_run_resumable(
    config: LoopConfig,
) -> None:
    """The callback raised inside the loop's harvest, after its step's optimizer step: the count
    stayed one behind and the next `fit` trained a batch twice (a user's probe, 2026-12-05)."""

    def build() -> Trainer:
        return Trainer(_sgd_workload(), config, device="cpu", scheduler=warmup_cosine(8))

    def fails(first: int, losses: list[float]) -> None:
        if first + len(losses) >= 3:
            raise RuntimeError("planted: the callback failed")

    trainer = build()
    with pytest.raises(RuntimeError, match="planted"):
        trainer.fit(6, on_losses=fails)
    assert 3 <= trainer.step < 6
    trainer.fit(6)
    plain = build()
    plain.fit(6)
    for ours, theirs in zip(trainer.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)
    assert trainer.optimizer.param_groups[0]["lr"] == plain.optimizer.param_groups[0]["lr"]


def test_a_checkpoint_resumes_only_on_its_own_batch_size_and_data(tmp_path: Path) -> None:
    """A resume with batch_size 8 after 16 counted its position in the new batches (a user's
    probe, 2026-12-05)."""
    path = tmp_path / "c.pt"
    Trainer(_sgd_workload(), device="cpu").fit(2, checkpoint_every=2, checkpoint_path=path)

    def with_data(samples: int, batch: int) -> trainers.Workload:
        torch.manual_seed(0)
        return workload_from_parts(
            nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)),
            TensorDataset(torch.randn(samples, 6), torch.randn(samples, 1)),
            lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
            optimizer=lambda params, capturable: torch.optim.SGD(params, lr=0.1),
            batch_size=batch,
        )

    for samples, batch in ((64, 16), (48, 8)):
        trainer = Trainer(with_data(samples, batch), device="cpu")
        refused = (
            rf"^resume_from='{re.escape(str(path))}' is invalid: allowed a checkpoint of this "
            rf"data \(batch_size={batch} on {samples} samples\); the file has a run of "
            r"batch_size=8 on 64 samples$"
        )
        with pytest.raises(ConfigError, match=refused):
            trainer.fit(4, resume_from=path)
        assert trainer.step == 0
    resumed = Trainer(with_data(64, 8), device="cpu")
    resumed.fit(4, resume_from=path)
    assert resumed.step == 4


def test_a_model_given_for_a_workload_is_named() -> None:
    """`Trainer(model)` raised AttributeError: 'Sequential' object has no attribute 'name'."""
    with pytest.raises(ConfigError, match=r"^workload='Sequential' is invalid: allowed a Workload"):
        Trainer(nn.Sequential(nn.Linear(2, 1)), device="cpu")  # type: ignore[arg-type]


def _nan_at_step_5() -> trainers.Workload:
    """A regression whose fifth batch of 8 holds a NaN feature: the loss of step 5 (from 1)."""
    torch.manual_seed(0)
    features = torch.randn(64, 6)
    features[35, 2] = float("nan")
    return workload_from_parts(
        nn.Linear(6, 1),
        TensorDataset(features, torch.randn(64, 1)),
        lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
        optimizer=lambda params, capturable: torch.optim.SGD(params, lr=0.1),
        batch_size=8,
    )


@pytest.mark.parametrize("config", [LoopConfig(), EVENT_EVERY_3], ids=["every-step", "event-3"])
def test_a_nan_loss_stops_fit_at_its_harvest_unless_allowed(config: LoopConfig) -> None:
    """A batch with a NaN feature: fit had trained on from it without a word, the weights NaN
    from then on, where the CLI stops (a user's probe, 2026-12-06)."""

    def build() -> Trainer:
        return Trainer(_nan_at_step_5(), config, device="cpu")

    seen: list[float] = []
    trainer = build()
    with pytest.raises(trainers.NonFiniteLoss, match=r"the loss of step 5 is nan") as caught:
        trainer.fit(8, on_losses=lambda first, losses: seen.extend(losses))
    assert caught.value.step == 5 and math.isnan(caught.value.value)
    assert f"stopped after step {trainer.step}" in str(caught.value)
    # Found where the sync mode harvested it: no later than its harvest, never before step 5.
    assert 5 <= trainer.step <= 5 + config.sync_interval - 1
    assert len(seen) >= 5 and math.isnan(seen[4])  # the callback saw it first
    assert all(math.isfinite(loss) for loss in seen[:4])

    allowed = build().fit(8, allow_nonfinite=True)
    assert allowed.step == 8 and math.isnan(allowed.losses[4])


@pytest.mark.parametrize("every", [1, 2, 5])
@pytest.mark.parametrize("config", [LoopConfig(), EVENT_EVERY_3], ids=["every-step", "event-3"])
def test_no_checkpoint_is_written_after_a_nan_loss(
    config: LoopConfig, every: int, tmp_path: Path
) -> None:
    """A NaN loss at step 5 and a checkpoint due at or after it before the error: the weights the
    NaN updated had been written, over `run.pt`'s last good ones that the error says to resume
    from (a user's probe, 2026-12-06). Every checkpoint written holds finite weights of a step
    before the NaN."""
    trainer = Trainer(_nan_at_step_5(), config, device="cpu")
    with pytest.raises(trainers.NonFiniteLoss, match=r"the loss of step 5 is nan"):
        trainer.fit(8, checkpoint_every=every, checkpoint_path=tmp_path / "run-{step}.pt")
    written = sorted(tmp_path.glob("run-*.pt"))
    assert len(written) == 4 // every
    for path in written:
        state = torch.load(path, weights_only=True)
        assert state["step"] < 5, path.name
        assert all(torch.isfinite(value).all() for value in state["model"].values()), path.name


@pytest.mark.parametrize(
    ("features", "labels", "said"),
    [
        (torch.float64, torch.int64, r"Double and Float: .*\(NumPy arrays and torch.from_numpy"),
        (torch.float16, torch.int64, r"Half and Float: the batch's dtypes do not fit the model"),
        # torch 2.11 says "expected scalar type Long but found Float" (an H100, 2026-12-07).
        (
            torch.float32,
            torch.float32,
            r"(target dtype .*|scalar type Long but found Float): .*\(parameters float32\) or",
        ),
    ],
    ids=["numpy-float64", "half", "float-labels"],
)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_batch_of_dtypes_the_model_cannot_take_is_one_line_naming_data(
    features: torch.dtype, labels: torch.dtype, said: str, compiled: bool
) -> None:
    """The build's meta run takes any dtypes (a meta matmul of float64 and float32 passes), so
    a NumPy batch reached the user as torch's traceback at the first step (a user's probe,
    2026-12-06); compiled, as Dynamo's wrapping of it."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 6).to(features), torch.randint(0, 3, (32,)).to(labels))
    workload = workload_from_parts(
        nn.Linear(6, 3),
        data,
        _unpacking_loss,
        optimizer=lambda params, capturable: torch.optim.SGD(params, lr=0.1),
        batch_size=8,
    )
    trainer = Trainer(workload, LoopConfig(compile="default" if compiled else "none"), device="cpu")
    with pytest.raises(
        trainers.WorkloadError, match=rf"^data: step 1 raised \w+ at .*test_fit.py:\d+: .*{said}"
    ):
        trainer.fit(2)
    assert trainer.step == 0


def _unpacking_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    features, labels = batch
    return nn.functional.cross_entropy(model(features), labels)


def _classifier() -> trainers.Workload:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 6), torch.randint(0, 3, (64,)))
    return workload_from_parts(
        nn.Linear(6, 3),
        data,
        _unpacking_loss,
        optimizer=lambda params, capturable: torch.optim.SGD(params, lr=0.1),
        batch_size=8,
    )


def test_an_evaluation_that_raises_is_one_line_after_its_steps_checkpoint(tmp_path: Path) -> None:
    """A label past the classes: a meta tensor has no values to check, so the Trainer builds,
    and the first evaluation raised torch's traceback and lost the checkpoint due at its step
    (a user's probe, 2026-12-06)."""
    held_out = [(torch.randn(4, 6), torch.tensor([0, 1, 2, 7]))]
    trainer = Trainer(_classifier(), device="cpu", eval_data=held_out)
    path = tmp_path / "c-{step}.pt"
    with pytest.raises(trainers.WorkloadError) as caught:
        trainer.fit(6, eval_every=4, checkpoint_every=2, checkpoint_path=path)
    said = str(caught.value)
    assert caught.value.field == "eval_data" and "\n" not in said
    assert said.startswith("eval_data: the evaluation after step 4 raised IndexError")
    assert said.endswith(f"this step's checkpoint was written: {tmp_path / 'c-4.pt'}")
    resumed = Trainer(_classifier(), device="cpu")
    assert resumed.fit(6, resume_from=tmp_path / "c-4.pt").start_step == 4


def test_eval_data_the_first_batch_shows_wrong_and_eval_data_too_long_are_refused() -> None:
    """A bare tensor for a loss that unpacks a tuple (ValueError) and a model's own assertion
    had passed the check and failed at the first evaluation; a training stream of 2**30
    batches given as held-out data hung it."""
    with pytest.raises(ConfigError, match=r"^eval_data='its first batch' is invalid: .*ValueError"):
        Trainer(_classifier(), device="cpu", eval_data=[torch.randn(4, 6)])

    class Endless:
        def __len__(self) -> int:
            return 2**30

        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter([(torch.randn(4, 6), torch.tensor([0, 1, 2, 0]))])

    with pytest.raises(ConfigError, match=r"^eval_data='Endless of 1,073,741,824 batches' is inv"):
        Trainer(_classifier(), device="cpu", eval_data=Endless())


def test_a_scheduler_class_that_needs_settings_is_refused_naming_a_factory() -> None:
    with pytest.raises(ConfigError) as caught:
        Trainer(_classifier(), device="cpu", scheduler=torch.optim.lr_scheduler.StepLR)
    assert str(caught.value) == (
        "scheduler='StepLR' is invalid: allowed a factory of the optimizer with the scheduler's "
        "settings: lambda optimizer: StepLR(optimizer, ...)"
    )
    # A class the optimizer alone builds is a factory as it is.
    trainer = Trainer(_classifier(), device="cpu", scheduler=torch.optim.lr_scheduler.ConstantLR)
    assert trainer.fit(2).step == 2


def test_an_evaluation_weights_each_batch_by_its_samples() -> None:
    """33 held-out samples in batches of 32: the short last batch of one had counted as much
    as the 32 (79.45 against the set's own 5.88 in a user's probe, 2026-12-06)."""
    generator = torch.Generator().manual_seed(0)
    features, labels = torch.randn(33, 6, generator=generator), torch.randint(0, 3, (33,))
    features[32] *= 100
    held_out = DataLoader(TensorDataset(features, labels), batch_size=32)
    trainer = Trainer(_classifier(), device="cpu", eval_data=held_out)
    with torch.no_grad():
        whole = nn.functional.cross_entropy(trainer.model(features), labels).item()
    assert trainer.evaluate() == pytest.approx(whole, rel=1e-5)


def test_the_eval_check_runs_the_model_as_the_evaluation_does_in_eval_mode() -> None:
    """The check had run the loss in train mode: a BatchNorm refused a held-out batch of one
    sample that the evaluation takes, and a model that returns its loss only while training
    passed, then failed after eval_every steps with "a Tensor with 24 elements cannot be
    converted to Scalar" (a probe, 2026-12-07)."""
    generator = torch.Generator().manual_seed(0)
    features, labels = torch.randn(64, 8, generator=generator), torch.randint(0, 3, (64,))
    norm = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    def parts(model: nn.Module) -> trainers.Workload:
        data = TensorDataset(features, labels)
        return workload_from_parts(model, data, loss, optimizer=torch.optim.SGD, batch_size=8)

    one = DataLoader(TensorDataset(features[:3], labels[:3]), batch_size=1)
    trainer = Trainer(parts(norm), device="cpu", eval_data=one)
    assert trainer.model.training  # the check left the model's modes as they were
    assert math.isfinite(trainer.evaluate())

    class LossWhileTraining(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(8, 3)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            logits = self.linear(x)
            return nn.functional.cross_entropy(logits, y) if self.training else logits

    def own(model: nn.Module, batch: Any) -> torch.Tensor:
        return model(*batch)

    made = workload_from_parts(
        LossWhileTraining(), TensorDataset(features, labels), own, optimizer=torch.optim.SGD,
        batch_size=8,
    )  # fmt: skip
    held_out = [(features[:8], labels[:8])]
    with pytest.raises(ConfigError, match=r"^eval_data='its first batch' is invalid: .* eval mode"):
        Trainer(made, device="cpu", eval_data=held_out)
    with pytest.raises(ConfigError, match=r"^eval_loss='.*own' is invalid: .*shape \[8, 3\]"):
        Trainer(made, device="cpu", eval_data=held_out, eval_loss=own)
    held = Trainer(made, device="cpu", eval_data=held_out, eval_loss=lambda m, b: m(*b).sum() * 0)
    assert held.evaluate() == 0.0


def test_fp16_autocast_over_float16_parameters_is_refused_naming_the_precision() -> None:
    """It had raised torch's "Attempting to unscale FP16 gradients." at the first step."""
    data = TensorDataset(torch.randn(32, 8).half(), torch.randint(0, 3, (32,)))

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]).float(), batch[1])

    def parts(model: nn.Module) -> trainers.Workload:
        return workload_from_parts(model, data, loss, optimizer=torch.optim.SGD, batch_size=8)

    half = nn.Linear(8, 3).half()
    with pytest.raises(ConfigError, match=r"^precision='fp16-autocast' is invalid: .*its weight"):
        Trainer(parts(half), device="cpu", precision="fp16-autocast")
    half.weight.requires_grad_(False)  # frozen: no gradient to unscale
    half.bias.data = half.bias.data.float()
    assert len(Trainer(parts(half), device="cpu", precision="fp16-autocast").fit(1).losses) == 1


def test_an_autocast_over_a_float64_model_is_refused_naming_the_precision() -> None:
    """Autocast casts float32 ops only: a float64 model under bf16-autocast had trained in
    float64, its losses bit for bit fp32's, under the bf16 label (a user's probe, 2026-12-07)."""
    data = TensorDataset(torch.randn(32, 8).double(), torch.randint(0, 3, (32,)))

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    def parts(model: nn.Module) -> trainers.Workload:
        return workload_from_parts(model, data, loss, optimizer=torch.optim.SGD, batch_size=8)

    for precision in ("bf16-autocast", "fp16-autocast"):
        with pytest.raises(ConfigError, match=rf"^precision='{precision}' is invalid: .*float64"):
            Trainer(parts(nn.Linear(8, 3).double()), device="cpu", precision=precision)
    # In fp32 (no autocast) it trains, as it did.
    assert len(Trainer(parts(nn.Linear(8, 3).double()), device="cpu").fit(1).losses) == 1


def test_a_float64_model_fed_float32_is_told_to_cast_the_data_up_not_down() -> None:
    """The float64 side is the model: ".float() them" (the NumPy batch's advice) had been said."""
    data = TensorDataset(torch.randn(32, 6), torch.randint(0, 3, (32,)))
    workload = workload_from_parts(
        nn.Linear(6, 3).double(),
        data,
        _unpacking_loss,
        optimizer=lambda params, capturable: torch.optim.SGD(params, lr=0.1),
        batch_size=8,
    )
    with pytest.raises(trainers.WorkloadError) as caught:
        Trainer(workload, device="cpu").fit(1)
    said = str(caught.value)
    assert "(the model's parameters are float64: .double() the data, or .float() both)" in said
    assert "NumPy" not in said


def test_a_checkpoint_of_the_model_compiled_names_the_prefix(tmp_path: Path) -> None:
    """A model given compiled saves `_orig_mod.NAME`: resumed into the plain model it had been
    "differ in 3 tensors", with nothing of why (a probe, 2026-12-07)."""
    plain = _sgd_workload()
    compiled = dataclasses.replace(plain, model=torch.compile(plain.model))
    path = Trainer(compiled, device="cpu").save(tmp_path / "compiled.pt")
    with pytest.raises(ConfigError, match=r"only by the file's '_orig_mod\.' prefix, torch"):
        Trainer(_sgd_workload(), device="cpu").load(path)
    with pytest.raises(ConfigError) as caught:
        Trainer(_sgd_workload(width=32), device="cpu").load(path)
    assert "_orig_mod" not in str(caught.value).split("; the file")[0]


def test_fit_past_a_one_cycle_schedule_is_refused_before_a_step(tmp_path: Path) -> None:
    """OneCycleLR raises "Tried to step 6 times" past its total_steps, after the sixth step had
    trained (a probe, 2026-12-07): refused naming steps, and a resumed fit counts what is left."""
    scheduler = functools.partial(torch.optim.lr_scheduler.OneCycleLR, max_lr=0.1, total_steps=5)
    trainer = Trainer(_sgd_workload(), device="cpu", scheduler=scheduler)
    with pytest.raises(ConfigError, match=r"^steps=10 is invalid: allowed at most 5: the sch"):
        trainer.fit(10)
    assert trainer.step == 0
    trainer.fit(3)
    with pytest.raises(ConfigError, match=r"allowed at most 5: .* build it with total_steps=7,"):
        trainer.fit(7)
    path = trainer.save(tmp_path / "three.pt")
    assert trainer.fit(5).step == 5
    # Resumed, the room is the checkpoint's schedule's, and a refusal leaves the Trainer as it was.
    other = Trainer(_sgd_workload(), device="cpu", scheduler=scheduler)
    other.fit(1)
    weights = [p.detach().clone() for p in other.model.parameters()]
    with pytest.raises(ConfigError, match=r"^steps=6 is invalid: allowed at most 5"):
        other.fit(6, resume_from=path)
    assert other.step == 1 and other.scheduler is not None and other.scheduler.last_epoch == 1
    assert all(torch.equal(a, b) for a, b in zip(weights, other.model.parameters(), strict=True))
    assert other.fit(5, resume_from=path).step == 5


def test_an_evaluation_counts_the_samples_where_a_shared_mask_rides_beside_them() -> None:
    """Whole batches of ids [B, S] beside a mask [S, S] that the batch shares: a held-out batch
    had been counted S samples, not B, so a batch of 1 weighed as much as one of 4 (a probe,
    2026-12-07). The samples sit where the training batches keep `samples_per_batch`."""
    seq, vocab = 6, 11
    model = nn.Sequential(nn.Embedding(vocab, 8), nn.Linear(8, vocab))

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        ids, mask = batch
        logits = model(ids) + mask.sum() * 0  # the mask rides along, as attention's would
        return nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())

    def batch(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, vocab, (samples, seq), generator=torch.Generator().manual_seed(seed))
        return ids, torch.ones(seq, seq)

    data = [batch(4, seed) for seed in range(3)]
    workload = workload_from_parts(
        model, data, loss, optimizer=torch.optim.SGD, samples_per_batch=4
    )
    held_out = [batch(4, 10), batch(1, 11)]
    trainer = Trainer(workload, device="cpu", eval_data=held_out)
    with torch.no_grad():
        each = [loss(trainer.model, b).item() for b in held_out]
    assert trainer.evaluate() == pytest.approx((4 * each[0] + each[1]) / 5, rel=1e-5)


class _SizedStream(torch.utils.data.IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """A stream that knows its length, as many do: 20 samples, 5 batches of 4 an epoch."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(20, 6, generator=generator)
        self.y = torch.randint(0, 3, (20,), generator=generator)

    def __len__(self) -> int:
        return 20

    def __iter__(self) -> Any:
        return iter(zip(self.x, self.y, strict=True))


def test_a_stream_with_a_length_resumes_mid_epoch_as_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    """Resumed at step 7 (batch 2 of the second epoch), the stream had been entered by index
    and failed: "Subclasses of Dataset should implement __getitem__" (a user's probe,
    2026-12-07). It is skipped by loading, as a stream without a length is."""

    def trainer() -> Trainer:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))

        def loss(model: nn.Module, batch: Any) -> torch.Tensor:
            return nn.functional.cross_entropy(model(batch[0]), batch[1])

        parts = workload_from_parts(
            model, _SizedStream(), loss, optimizer=torch.optim.Adam, batch_size=4
        )
        return Trainer(parts, device="cpu")

    whole = trainer().fit(11)
    trainer().fit(7, checkpoint_every=7, checkpoint_path=tmp_path / "s.pt")
    resumed = trainer().fit(11, resume_from=tmp_path / "s.pt")
    assert resumed.losses == whole.losses[7:]


def test_an_evaluation_counts_sequence_first_samples_and_reads_no_stream_by_index() -> None:
    """The review of the shared-mask fix (2026-12-07): a sequence-first input [T, B, F] beside
    its labels [B] at T == B had been counted T samples a batch (its first dimension leads with
    B's size too), and a whole-batch stream with a `__len__` had been indexed and failed."""
    steps, width = 8, 4
    model = nn.Linear(width, 3)

    def loss(model: nn.Module, batch: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]).mean(0), batch[1])

    def batch(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(steps, samples, width, generator=generator) * (1 + seed)
        return x, torch.randint(0, 3, (samples,), generator=generator)

    data = [batch(steps, seed) for seed in range(3)]  # T == B == 8
    workload = workload_from_parts(model, data, loss, optimizer=torch.optim.SGD)
    held_out = [batch(8, 10), batch(1, 11)]
    trainer = Trainer(workload, device="cpu", eval_data=held_out)
    with torch.no_grad():
        each = [loss(trainer.model, b).item() for b in held_out]
    assert trainer.evaluate() == pytest.approx((8 * each[0] + each[1]) / 9, rel=1e-5)

    class Stream(torch.utils.data.IterableDataset[Any]):
        def __len__(self) -> int:
            return 3

        def __iter__(self) -> Any:
            return iter(data)

    streamed = workload_from_parts(nn.Linear(width, 3), Stream(), loss, optimizer=torch.optim.SGD)
    assert math.isfinite(Trainer(streamed, device="cpu", eval_data=held_out).evaluate())
