"""The graph floor is never shown slower than the step it is compared with (issue 28): it bounds
only eager steps, is measured in the study's precision, and a floor above the step is dropped."""

from __future__ import annotations

import pytest
import torch

from trainers import LoopConfig, UnsupportedOnDevice, graph_floor, load_workload
from trainers.gate import comparable_floor, floor_applies


def test_the_eager_floor_bounds_only_eager_steps() -> None:
    assert floor_applies(LoopConfig()) is None
    assert floor_applies(LoopConfig(cuda_graph=True, optimizer="fused", num_streams=2)) is None
    for compiled in (LoopConfig(compile="default"), LoopConfig(optimizer="compiled")):
        reason = floor_applies(compiled)
        assert reason is not None and "compiled" in reason


@pytest.mark.parametrize(
    ("floor_ms", "step_ms", "shown"),
    [
        (2.9, 16.5, 2.9),
        (14.0, 14.0, 14.0),  # a host-free step can reach its floor
        (163.59, 20.853, None),  # the bf16 study's fp32 floor: slower than the step, dropped
        (None, 20.0, None),
        (3.0, None, None),
        (0.0, 10.0, None),
        (float("nan"), 10.0, None),
    ],
)
def test_a_floor_slower_than_the_step_is_not_shown(
    floor_ms: float | None, step_ms: float | None, shown: float | None
) -> None:
    assert comparable_floor(floor_ms, step_ms) == shown


def test_the_floor_needs_a_gpu_and_refuses_what_cannot_be_captured() -> None:
    workload = load_workload("mlp", "tiny", seed=0)
    with pytest.raises(UnsupportedOnDevice, match="needs a CUDA device"):
        graph_floor(workload, device="cpu", precision="bf16-autocast")
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="precision"):
            graph_floor(workload, device="cuda", precision="fp16-autocast")
