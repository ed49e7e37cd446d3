from __future__ import annotations

import math

import pytest

from tests.trainers.helpers import worker_dependent
from trainers import LoopConfig, RunArgs, check_parity, load_workload, parity_losses, run
from trainers.gate.parity import compare
from trainers.workloads import disable_dropout


def test_eager_configs_match_the_reference_bit_for_bit_on_cpu() -> None:
    config = LoopConfig(
        num_streams=4, sync_interval=6, sync_mode="query", prefetch_depth=2, num_workers=2
    )
    verdict = check_parity("transformer", config, RunArgs(steps=12, device="cpu"), preset="tiny")
    assert verdict.passed, verdict
    assert verdict.max_abs_deviation == 0.0
    assert verdict.exact_required
    assert verdict.steps == 12


def test_parity_catches_a_pipeline_that_changes_the_data() -> None:
    verdict = check_parity(
        worker_dependent, LoopConfig(num_workers=2), RunArgs(steps=8, device="cpu"), preset="x"
    )
    assert not verdict.passed
    assert verdict.first_diverging_step == 0
    assert verdict.max_abs_deviation > 0
    assert "bit for bit" in verdict.reason


def test_parity_runs_with_dropout_off() -> None:
    def losses(dropout: bool) -> list[float]:
        workload = load_workload("transformer", "tiny", seed=0)
        if not dropout:
            disable_dropout(workload.model)
        return run(
            workload, LoopConfig(), RunArgs(steps=6, warmup=0, windows=1, device="cpu")
        ).losses

    parity = parity_losses("transformer", "tiny", LoopConfig(), RunArgs(steps=6, device="cpu"))
    assert parity == losses(dropout=False)
    assert parity != losses(dropout=True)


def test_reference_can_be_reused() -> None:
    reference = parity_losses("mlp", "tiny", LoopConfig(), RunArgs(steps=8, device="cpu"))
    verdict = check_parity(
        "mlp",
        LoopConfig(sync_interval=3),
        RunArgs(steps=8, device="cpu"),
        preset="tiny",
        reference=reference,
    )
    assert verdict.passed
    shifted = [x + 1e-3 for x in reference]
    assert not check_parity(
        "mlp", LoopConfig(), RunArgs(steps=8, device="cpu"), preset="tiny", reference=shifted
    ).passed


def test_compare_tolerance_rules() -> None:
    ref = [2.0, 1.5, 1.0]
    assert compare(ref, ref, exact=True, tolerance=0).passed
    close = [2.0, 1.5, 1.0005]
    assert not compare(close, ref, exact=True, tolerance=0).passed
    verdict = compare(close, ref, exact=False, tolerance=1e-3)
    assert verdict.passed and verdict.first_diverging_step == 2
    assert verdict.max_rel_deviation == pytest.approx(5e-4)
    assert not compare([2.0, 1.5, 1.01], ref, exact=False, tolerance=1e-3).passed
    nan = compare([2.0, math.nan, 1.0], ref, exact=False, tolerance=1.0)
    assert not nan.passed and nan.first_diverging_step == 1
    assert not compare([2.0], ref, exact=True, tolerance=0).passed
