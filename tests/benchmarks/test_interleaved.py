"""benchmarks/interleaved.py on the CPU: the runner `suite.py` and `peers.py` share measures a
setting, keeps and logs a failure, and ranks a recommendation against the fastest peer."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.interleaved import measure_in_round, ratio_vs_fastest, windows_ms
from trainers import LoopConfig
from tuner.search.measuring.measure import Measurer, Protocol


def test_a_setting_is_measured_or_its_failure_kept_and_logged() -> None:
    measurer = Measurer(
        "mlp", "tiny", device="cpu", protocol=Protocol(warmup=1, windows=2, window_steps=3)
    )
    errors: dict[str, str] = {}
    log: list[str] = []
    # A CPU has no CUDA graphs: the run fails, and the comparison goes on without it.
    graph = measure_in_round(
        measurer, "graph", LoopConfig(cuda_graph=True), round_index=1, log=log.append, errors=errors
    )
    assert graph is None and "needs a CUDA device" in errors["graph"]
    assert log == [f"round 2 graph: {errors['graph']}"]
    plain = measure_in_round(
        measurer, "plain", LoopConfig(), round_index=1, log=log.append, errors=errors
    )
    assert plain is not None and "plain" not in errors
    assert log[-1] == f"round 2 plain {plain.step_ms:.3f} ms"
    # The windows' ms/step are the throughputs turned back into step times.
    ms = windows_ms(measurer, plain)
    assert len(ms) == 2 and statistics.median(ms) == pytest.approx(plain.step_ms, rel=1e-9)


def test_the_ratio_is_against_the_fastest_peer() -> None:
    peers = {
        "slow": {"median_ms": 20.0, "windows_ms": [19.0, 20.0, 21.0]},
        "fast": {"median_ms": 10.0, "windows_ms": [9.9, 10.0, 10.1]},
    }
    rec = {"windows_ms": [4.9, 5.0, 5.1]}
    found = ratio_vs_fastest(peers, rec)
    assert found["best_peer"] == "fast" and found["ratio"] == pytest.approx(2.0, rel=0.01)
    low, high = found["ci95"]
    assert low <= found["ratio"] <= high


@pytest.mark.models
def test_the_picks_are_measured_on_the_model_their_jobs_measured() -> None:
    """`benchmarks/node.py`'s `interleaved` (time_to_answer.py's too) builds the model with the
    answers' `--model-arg` options: here a 1-layer decoder, which the preset alone is not."""
    pytest.importorskip("transformers")
    import argparse

    from benchmarks.node import interleaved

    args = argparse.Namespace(protocol="1,2,2", device="cpu", rounds=1)
    pick = {"config": LoopConfig().to_dict(), "precision": None, "model_args": {"layers": "1"}}
    samples, ratios = interleaved(args, "hf:causal-lm", "tiny", {"a": pick, "b": pick}, over="a")
    assert set(samples) == {"a", "b"} and set(ratios) == {"b"}
    bad = {**pick, "model_args": {"layers": "x"}}
    with pytest.raises(Exception, match="layers"):
        interleaved(args, "hf:causal-lm", "tiny", {"a": bad}, over="a")
