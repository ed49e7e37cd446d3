"""Precision on the CPU: what the matmuls really run in, the matmul setting and its restoring."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import trainers
from trainers import (
    PRECISIONS,
    ConfigError,
    LoopConfig,
    RunArgs,
    UnsupportedOnDevice,
    Workload,
    load_workload,
    run,
)
from trainers.precision import make_plan
from trainers.workloads import SyntheticBatches
from trainers.workloads.mlp import classification_loss


@pytest.fixture(autouse=True)
def keep_matmul_precision() -> Iterator[None]:
    previous = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(previous)


def observed_run(
    precision: str | None, config: LoopConfig | None = None, steps: int = 6
) -> tuple[list[float], set[torch.dtype], set[str]]:
    """Losses of the tiny mlp, and the dtypes its first Linear produced and the matmul
    precisions in force while it ran (a forward hook inside the loss)."""
    workload = load_workload("mlp", "tiny", seed=0)
    dtypes: set[torch.dtype] = set()
    matmul: set[str] = set()

    def hook(module: nn.Module, args: object, output: torch.Tensor) -> None:
        dtypes.add(output.dtype)
        matmul.add(torch.get_float32_matmul_precision())

    first_linear = next(m for m in workload.model.modules() if isinstance(m, nn.Linear))
    first_linear.register_forward_hook(hook)
    result = run(
        workload,
        config or LoopConfig(),
        RunArgs(steps=steps, warmup=0, windows=1, device="cpu", precision=precision),
    )  # type: ignore[arg-type]
    assert result.precision == precision
    return result.losses, dtypes, matmul


def test_bf16_autocast_runs_the_matmuls_in_bf16_on_cpu() -> None:
    fp32, fp32_dtypes, _ = observed_run("fp32")
    bf16, bf16_dtypes, _ = observed_run("bf16-autocast")
    assert fp32_dtypes == {torch.float32}
    assert bf16_dtypes == {torch.bfloat16}
    assert all(math.isfinite(x) for x in bf16)
    assert bf16 != fp32  # another arithmetic, other losses ...
    assert bf16 == pytest.approx(fp32, rel=0.05)  # ... of the same training


def test_fp16_autocast_with_its_grad_scaler_on_cpu() -> None:
    reason = None
    try:
        make_plan("fp16-autocast", torch.device("cpu"))
    except UnsupportedOnDevice as exc:
        reason = str(exc)
    if reason is not None:  # an older torch without float16 CPU autocast: a clear error
        assert "precision='fp16-autocast'" in reason
        with pytest.raises(UnsupportedOnDevice):
            observed_run("fp16-autocast")
        return
    plan = make_plan("fp16-autocast", torch.device("cpu"))
    assert plan.scaler is not None and plan.autocast_dtype == torch.float16
    for optimizer in ("as-built", "fused"):
        losses, dtypes, _ = observed_run("fp16-autocast", LoopConfig(optimizer=optimizer))  # type: ignore[arg-type]
        assert dtypes == {torch.float16}
        assert all(math.isfinite(x) for x in losses)
        assert len(set(losses)) > 3


@pytest.mark.parametrize(
    ("precision", "matmul"), [("fp32", "highest"), ("tf32", "high"), ("bf16-autocast", "highest")]
)
def test_matmul_precision_is_set_for_the_run_and_restored(precision: str, matmul: str) -> None:
    torch.set_float32_matmul_precision("medium")
    _, _, seen = observed_run(precision)
    assert seen == {matmul}
    assert torch.get_float32_matmul_precision() == "medium"
    result = run(
        load_workload("mlp", "tiny"),
        LoopConfig(),
        RunArgs(steps=2, warmup=0, windows=1, device="cpu", precision=precision),
    )  # type: ignore[arg-type]
    assert result.matmul_precision == matmul
    assert result.to_dict()["precision"] == precision


def test_no_precision_leaves_the_process_setting_alone() -> None:
    torch.set_float32_matmul_precision("high")  # e.g. the tuner's --matmul-precision
    _, dtypes, seen = observed_run(None)
    assert dtypes == {torch.float32} and seen == {"high"}
    assert torch.get_float32_matmul_precision() == "high"


def failing_after(calls: int) -> Workload:
    """A workload whose loss raises on its `calls`-th call."""
    torch.manual_seed(0)
    count = [0]

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        count[0] += 1
        if count[0] == calls:
            raise RuntimeError("loss exploded")
        return classification_loss(model, batch)

    x = torch.randn(4, 4, 8, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 3, (4, 4), generator=torch.Generator().manual_seed(0))
    return Workload(
        name="failing",
        preset="x",
        model=nn.Linear(8, 3),
        dataset=SyntheticBatches((x, y)),
        loss_fn=loss_fn,
        samples_per_batch=4,
    )


def test_matmul_precision_comes_back_when_the_run_fails() -> None:
    torch.set_float32_matmul_precision("medium")
    with pytest.raises(RuntimeError, match="loss exploded"):
        run(
            failing_after(3),
            LoopConfig(),
            RunArgs(steps=4, warmup=1, windows=1, device="cpu", precision="tf32"),
        )
    assert torch.get_float32_matmul_precision() == "medium"


@pytest.mark.parametrize("value", ["fp64", "bf16", "FP32", "", 16])
def test_an_unknown_precision_names_the_field_and_the_choices(value: object) -> None:
    with pytest.raises(ConfigError) as info:
        run(
            load_workload("mlp", "tiny"),
            LoopConfig(),
            RunArgs(steps=2, warmup=0, windows=1, device="cpu", precision=value),
        )  # type: ignore[arg-type]
    assert info.value.field == "precision"
    assert ", ".join(PRECISIONS) in str(info.value)


def test_fp16_autocast_with_a_cuda_graph_is_refused_with_the_alternative() -> None:
    # Refused before the device is looked at: the combination is wrong everywhere.
    with pytest.raises(ConfigError) as info:
        run(
            load_workload("mlp", "tiny"),
            LoopConfig(cuda_graph=True),
            RunArgs(steps=2, warmup=4, windows=1, device="cpu", precision="fp16-autocast"),
        )
    assert info.value.field == "precision"
    assert "use bf16-autocast" in str(info.value)


def test_the_matmul_precision_has_one_setter_and_one_rule_against_precision() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        trainers.set_matmul_precision("high")
        assert torch.get_float32_matmul_precision() == "high"
        with pytest.raises(trainers.ConfigError, match=r"^matmul_precision='low' is invalid"):
            trainers.set_matmul_precision("low")
        assert torch.get_float32_matmul_precision() == "high"  # a refused value sets nothing
    finally:
        torch.set_float32_matmul_precision(before)
    trainers.check_precisions(None, "medium")
    trainers.check_precisions("tf32", "highest")
    with pytest.raises(trainers.ConfigError, match=r"^precision='tf32' is invalid: allowed either"):
        trainers.check_precisions("tf32", "high")
    with pytest.raises(trainers.ConfigError, match=r"^precision='fp64' is invalid"):
        trainers.check_precisions("fp64", "highest")
    with pytest.raises(trainers.ConfigError, match=r"^matmul_precision='low'"):
        trainers.check_precisions("bf16-autocast", "low")


def test_a_precision_spec_is_the_request_checked_once() -> None:
    spec = trainers.PrecisionSpec.of("bf16-autocast")
    assert (spec.precision, spec.allowed, spec.searched) == (
        "bf16-autocast",
        ("bf16-autocast",),
        False,
    )
    none = trainers.PrecisionSpec.of(matmul_precision="high")
    assert (none.precision, none.allowed, none.matmul) == (None, (), "high")
    searched = trainers.PrecisionSpec.of(precisions=["bf16-autocast", "float8"])
    # The first allowed is the reference where none is named; float8 is not checked against
    # the device here (that is `check_precision_here`, where the device is known).
    assert searched.precision == "bf16-autocast" and searched.searched
    assert searched.allowed == ("bf16-autocast", "float8")


@pytest.mark.parametrize(
    ("arguments", "field", "allowed"),
    [
        ({"precision": "fp64"}, "precision", "one of fp32"),
        ({"precision": ["fp32"]}, "precision", "one of fp32"),
        ({"precisions": ("fp32", "fp64")}, "precisions", "one of fp32"),
        ({"precisions": ()}, "precisions", "one or more of fp32"),
        ({"precisions": (None, "fp32")}, "precisions", "each one of fp32"),
        ({"precisions": ("tf32", "tf32")}, "precisions", "each precision once (tf32 twice)"),
        ({"precision": "fp32", "precisions": ("tf32",)}, "precision", "one of precisions (tf32)"),
        ({"precision": "tf32", "matmul_precision": "high"}, "precision", "either precision"),
        ({"precisions": ("tf32",), "matmul_precision": "medium"}, "precision", "either"),
        ({"matmul_precision": "low"}, "matmul_precision", "highest"),
        ({"precisions": ("fp32", "tf32"), "nproc_per_node": 2}, "precisions", "nproc_per_node"),
        ({"precisions": ("fp32", "tf32"), "program": "program:x"}, "precisions", "program:x"),
    ],
)
def test_a_precision_spec_refuses_naming_the_field(
    arguments: dict[str, Any], field: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as info:
        trainers.PrecisionSpec.of(**arguments)
    assert info.value.field == field
    assert allowed in str(info.value).split("allowed", 1)[1]


def test_one_precision_may_go_with_several_processes_or_a_program() -> None:
    one = trainers.PrecisionSpec.of(precisions=("tf32",), nproc_per_node=4, program="program:x")
    assert one.allowed == ("tf32",) and not one.searched
