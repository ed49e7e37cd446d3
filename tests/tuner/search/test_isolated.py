"""Parity checks and profiles in child processes (what the tuner does on a GPU), run here on the
CPU."""

from __future__ import annotations

import pytest

from trainers import Envelope, LoopConfig
from tuner.evidence.trace import CPU_NOTE
from tuner.search.isolated import ParityProcess, ProfileProcess


@pytest.mark.slow
def test_parity_in_a_child_process_passes_and_fails_like_in_process() -> None:
    checker = ParityProcess(
        "tests.trainers.helpers:worker_dependent",
        "x",
        steps=6,
        seed=0,
        device="cpu",
        matmul_precision="highest",
    )
    try:
        first = checker.check(LoopConfig(num_streams=3, sync_interval=2, sync_mode="query"))
        same, envelope = first.verdict, first.envelope
        assert same.passed and same.max_abs_deviation == 0.0 and same.test == "exact"
        # The envelope measured the first time comes back whole, to be stored and passed again.
        assert Envelope.from_dict(envelope).to_dict() == envelope
        # The reference and envelope ran this time (timed), no twin: the test is exact.
        assert set(first.time) == {"gate_reference", "gate_envelope", "gate_config"}
        assert all(seconds > 0.0 for seconds in first.time.values())
        # This workload's data depends on the DataLoader worker: the child must catch it too.
        second = checker.check(LoopConfig(num_workers=1), envelope)
        assert second.envelope == envelope
        assert set(second.time) == {"gate_config"}  # given the envelope, nothing else ran
        assert not second.verdict.passed
        assert second.verdict.first_diverging_step == 0
    finally:
        checker.close()


@pytest.mark.slow
def test_profiles_in_a_child_process_come_back_whole() -> None:
    profiler = ProfileProcess(
        "mlp", "tiny", steps=3, warmup=1, seed=0, device="cpu", matmul_precision="highest"
    )
    try:
        first = profiler.profile(LoopConfig())
        second = profiler.profile(LoopConfig(num_streams=2, sync_interval=3))
    finally:
        profiler.close()
    assert first.config == LoopConfig().to_dict()
    assert second.config["sync_interval"] == 3
    for prof in (first, second):
        assert not prof.cuda_activity and prof.note == CPU_NOTE
        assert prof.steps == 3 and prof.step_ms > 0.0
        # The trace travels back with the figures, compressed.
        assert any(e.get("ph") == "X" for e in prof.trace()["traceEvents"])
