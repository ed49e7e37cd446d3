"""Parity in a child process (what the tuner does on a GPU), run here on the CPU."""

from __future__ import annotations

import pytest

from trainers import LoopConfig
from tuner.isolated import ParityProcess


@pytest.mark.slow
def test_parity_in_a_child_process_passes_and_fails_like_in_process() -> None:
    checker = ParityProcess("tests.trainers.helpers:worker_dependent", "x", steps=6, seed=0,
                            device="cpu", matmul_precision="highest")
    try:
        same = checker.check(LoopConfig(num_streams=3, sync_interval=2, sync_mode="query"))
        assert same.passed and same.max_abs_deviation == 0.0
        # This workload's data depends on the DataLoader worker: the child must catch it too.
        broken = checker.check(LoopConfig(num_workers=1))
        assert not broken.passed
        assert broken.first_diverging_step == 0
    finally:
        checker.close()
