"""Rebuilding the workload's optimizer foreach or fused: same hyper-parameters, same training."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import pytest
import torch
from torch import nn

from trainers import ConfigError, LoopConfig, RunArgs, Workload, load_workload, run
from trainers.optim import prepare_optimizer
from trainers.workloads import SyntheticBatches
from trainers.workloads.mlp import classification_loss


def two_groups(**kwargs: object) -> torch.optim.Optimizer:
    """Adam over two parameter groups with their own learning rates and weight decay."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    groups = [
        {"params": model[0].parameters(), "lr": 1e-2, "weight_decay": 0.1},
        {"params": model[1].parameters()},
    ]
    return torch.optim.Adam(groups, lr=3e-4, betas=(0.8, 0.95), eps=1e-6, **kwargs)  # type: ignore[arg-type]


HYPER = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "capturable")


@pytest.mark.parametrize(
    ("choice", "foreach", "fused"), [("foreach", True, False), ("fused", False, True)]
)
def test_rebuild_keeps_class_groups_and_hyper_parameters(
    choice: str, foreach: bool, fused: bool
) -> None:
    built = two_groups()
    rebuilt = prepare_optimizer(built, choice, capturable=False)  # type: ignore[arg-type]
    assert type(rebuilt) is torch.optim.Adam and rebuilt is not built
    assert len(rebuilt.param_groups) == 2
    for old, new in zip(built.param_groups, rebuilt.param_groups, strict=True):
        assert all(a is b for a, b in zip(old["params"], new["params"], strict=True))
        assert {k: new[k] for k in HYPER} == {k: old[k] for k in HYPER}
        assert new["foreach"] is foreach and new["fused"] is fused
    assert rebuilt.param_groups[0]["lr"] == 1e-2 and rebuilt.param_groups[1]["lr"] == 3e-4
    assert rebuilt.param_groups[0]["weight_decay"] == 0.1
    assert rebuilt.defaults["betas"] == (0.8, 0.95)


def test_as_built_is_the_same_object_and_capturable_stays_as_asked() -> None:
    built = two_groups()
    assert prepare_optimizer(built, "as-built", capturable=False) is built
    # The loop asks for capturable=True under a CUDA graph; the rebuild keeps it.
    rebuilt = prepare_optimizer(two_groups(capturable=True), "foreach", capturable=True)
    assert all(group["capturable"] for group in rebuilt.param_groups)
    rebuilt = prepare_optimizer(two_groups(), "fused", capturable=False)
    assert not any(group["capturable"] for group in rebuilt.param_groups)


def test_sgd_has_no_capturable_argument_and_still_rebuilds() -> None:
    model = nn.Linear(3, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    rebuilt = prepare_optimizer(sgd, "fused", capturable=False)
    assert isinstance(rebuilt, torch.optim.SGD)
    group = rebuilt.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["fused"]) == (
        0.05,
        0.9,
        True,
        True,
    )


@pytest.mark.parametrize(
    ("factory", "choice", "allowed"),
    [
        (lambda p: torch.optim.RMSprop(p, lr=1e-3), "fused", "as-built, foreach, compiled"),
        (lambda p: torch.optim.Adadelta(p), "fused", "as-built, foreach, compiled"),
        (lambda p: torch.optim.LBFGS(p), "foreach", "as-built, compiled"),
        (lambda p: torch.optim.LBFGS(p), "fused", "as-built, compiled"),
    ],
)
def test_an_optimizer_without_the_flag_is_a_clear_error(
    factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer], choice: str, allowed: str
) -> None:
    optimizer = factory(nn.Linear(2, 2).parameters())
    with pytest.raises(ConfigError) as info:
        prepare_optimizer(optimizer, choice, capturable=False)  # type: ignore[arg-type]
    assert info.value.field == "optimizer"
    message = str(info.value)
    assert type(optimizer).__qualname__ in message
    assert f"allowed {allowed} for" in message
    assert f"takes no {choice!r} argument" in message


def test_an_optimizer_that_has_stepped_is_not_rebuilt() -> None:
    optimizer = two_groups()
    for group in optimizer.param_groups:
        for p in group["params"]:
            p.grad = torch.ones_like(p)
    optimizer.step()
    with pytest.raises(ConfigError, match="already stepped"):
        prepare_optimizer(optimizer, "foreach", capturable=False)


def rmsprop_workload(preset: str, *, seed: int) -> Workload:
    torch.manual_seed(seed)
    x = torch.randn(4, 4, 8, generator=torch.Generator().manual_seed(seed))
    y = torch.randint(0, 3, (4, 4), generator=torch.Generator().manual_seed(seed))

    def rmsprop(params: Iterable[nn.Parameter], capturable: bool) -> torch.optim.Optimizer:
        return torch.optim.RMSprop(params, lr=1e-2, capturable=capturable)

    return Workload(
        name="rmsprop",
        preset=preset,
        model=nn.Linear(8, 3),
        dataset=SyntheticBatches((x, y)),
        loss_fn=classification_loss,
        samples_per_batch=4,
        make_optimizer=rmsprop,
    )


def test_run_refuses_fused_rmsprop_before_any_step() -> None:
    workload = rmsprop_workload("x", seed=0)
    before = [p.detach().clone() for p in workload.model.parameters()]
    with pytest.raises(ConfigError, match=r"optimizer='fused'.*RMSprop"):
        run(
            workload,
            LoopConfig(optimizer="fused"),
            RunArgs(steps=4, warmup=1, windows=1, device="cpu"),
        )
    after = list(workload.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    # foreach exists for RMSprop: the same workload trains.
    result = run(
        workload,
        LoopConfig(optimizer="foreach"),
        RunArgs(steps=4, warmup=1, windows=1, device="cpu"),
    )
    assert all(math.isfinite(x) for x in result.losses)


@pytest.mark.parametrize("name", ["mlp", "transformer", "convnet"])
def test_foreach_and_fused_train_like_the_optimizer_as_built(name: str) -> None:
    def losses(choice: str) -> list[float]:
        workload = load_workload(name, "tiny", seed=0)
        config = LoopConfig(optimizer=choice)  # type: ignore[arg-type]
        return run(workload, config, RunArgs(steps=8, warmup=0, windows=1, device="cpu")).losses

    reference = losses("as-built")
    assert len(set(reference)) > 4  # training, not a constant
    for choice in ("foreach", "fused"):
        # Another order of floating-point operations, the same update: equal within rounding.
        assert losses(choice) == pytest.approx(reference, rel=1e-5, abs=1e-6), choice
