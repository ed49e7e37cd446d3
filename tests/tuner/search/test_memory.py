"""Memory is a result, not a crash: an out-of-memory trial is a failed trial whose reason says
what it asked for and what the device had, the job goes on, and the recommendation carries its
peak, the device's headroom and its model FLOP utilisation. Real Optuna, SQLite and CPU runs; the
workload raises the error CUDA raises (`torch.cuda.OutOfMemoryError`, present in a CPU build)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.tuner import workloads_for_tests as broken
from tests.tuner.tiny import WORKLOADS, load, options, run_json, sqlite_url
from trainers import LoopConfig, load_workload
from tuner.evidence.recommendation import Recommendation, memory_text, utilisation_text
from tuner.search.measuring.measure import oom_reason

# PyTorch's caching allocator words its error this way (c10/cuda/CUDACachingAllocator.cpp).
ALLOCATOR_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.19 GiB "
    "of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.11 GiB memory "
    "in use. Of the allocated memory 76.50 GiB is allocated by PyTorch, and 1.02 GiB is reserved "
    "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)


def test_an_out_of_memory_reason_is_one_line_of_what_was_asked_and_what_was_free() -> None:
    assert oom_reason(ALLOCATOR_MESSAGE) == (
        "out of memory: asked for 2.50 GiB with 1.06 GiB free of 79.19 GiB; the run held 76.50 GiB"
    )
    # Another wording is kept, on one line, rather than lost.
    assert oom_reason("out of memory\n  while capturing") == "out of memory while capturing"


def test_a_job_whose_plain_step_does_not_fit_goes_on_and_recommends_a_split(
    tmp_path: Path,
) -> None:
    storage = sqlite_url(tmp_path)
    workload = f"{WORKLOADS}:needs_micro_batches"
    rec = run_json(options(storage, "oom", trials=4, workload=workload, space="scale"))
    asked = "oom: out of memory: asked for 2.00 GiB with 0.50 GiB free of 1.00 GiB"
    # The baselines (one micro-batch) do not fit: failed with the reason, the job went on.
    assert rec["failures"] == {"pytorch-default": asked, "seed-baseline": asked}
    failed = [t for t in load(storage, "oom").trials if t.params.get("micro_batches") == 1]
    assert failed and all(t.user_attrs["failure_reason"] == asked for t in failed)
    # The gate's reference did not fit either; it ran split, so split configs could pass.
    config = LoopConfig.from_dict(rec["config"])
    assert config.micro_batches * broken.OOM_SAMPLES >= 4
    assert rec["trial_counts"]["complete"] >= 1
    use = rec["utilisation"]
    assert use["tflops"] > 0 and use["mfu"] is None and "CPU" in use["note"]
    assert rec["headroom_bytes"] is None  # a CPU has no device total


def test_the_recommendation_keeps_utilisation_and_headroom_through_its_json() -> None:
    gib = 2**30
    data = {
        "study": "s",
        "config": LoopConfig().to_dict(),
        "trial_counts": {},
        "peak_memory_bytes": 50 * gib,
        "device_memory_bytes": 80 * gib,
        "utilisation": {"tflops": 412.0, "mfu": 0.4166, "peak_tflops": 989.0, "note": "n"},
    }
    rec = Recommendation.from_dict(data)
    assert rec.headroom_bytes == 30 * gib
    again = Recommendation.from_dict(rec.to_dict()).to_dict()
    assert again["headroom_bytes"] == 30 * gib and again["utilisation"] == data["utilisation"]
    assert memory_text(50 * gib, 80 * gib) == "50.0 GiB of 80.0 GiB (30.0 GiB headroom)"
    assert utilisation_text(data["utilisation"]) == "412.0 TFLOP/s, 41.7 % MFU (n)"
    no_peak = {"tflops": 1.0, "mfu": None, "note": "CPU run"}
    assert utilisation_text(no_peak) == "1.0 TFLOP/s; no MFU: CPU run"
    assert utilisation_text(None) is None


def test_between_runs_the_measuring_process_keeps_no_gradients() -> None:
    """The gate and the profiles run next in their own processes on the same GPU: the measured
    model keeps no gradients (at 1.1B, 4.4 GB), after a run and after a failed one, and the
    next run runs all the same."""
    from tuner.search.measuring.measure import Measured, Measurer, Protocol

    measurer = Measurer(
        "mlp", "tiny", device="cpu", protocol=Protocol(warmup=1, windows=2, window_steps=3)
    )
    first = measurer.measure(LoopConfig())
    assert isinstance(first, Measured)
    assert all(p.grad is None for p in measurer.workload.model.parameters())
    failed = measurer.measure(LoopConfig(compile_scope="blocks", compile="default"))
    assert not isinstance(failed, Measured)  # mlp has no blocks: refused, recorded
    assert all(p.grad is None for p in measurer.workload.model.parameters())
    again = measurer.measure(LoopConfig())
    assert isinstance(again, Measured) and len(again.throughputs) == len(first.throughputs)


def test_a_checkpointing_config_shows_what_its_step_computes_again() -> None:
    """MFU counts the model's FLOPs; a config that checkpoints its blocks computes their forward
    again in the backward. Its utilisation (the recommendation's) says how much more, counted on
    the real step."""
    from trainers.flops import count_recompute_flops, count_step_flops
    from tuner.search.measuring.measure import Measured, Measurer, Protocol

    cpu = torch.device("cpu")
    protocol = Protocol(warmup=1, windows=2, window_steps=2)
    measurer = Measurer("transformer", "tiny", device="cpu", protocol=protocol)
    config = LoopConfig(activation_checkpointing="blocks")
    measured = measurer.measure(config)
    assert isinstance(measured, Measured)
    use = measurer.utilisation(measured.step_ms, config=config)
    workload = load_workload("transformer", "tiny")
    expected = count_recompute_flops(workload, config, cpu) / count_step_flops(workload, cpu)
    assert use is not None and 0.0 < use.recompute_share == pytest.approx(expected)  # type: ignore[operator]
    text = utilisation_text(dataclasses.asdict(use)) or ""
    assert f"; recomputes {100 * expected:.1f} % more FLOPs" in text
    plain = measurer.utilisation(measured.step_ms, config=LoopConfig())
    assert plain is not None and plain.recompute_share == 0.0
    assert "recomputes" not in (utilisation_text(dataclasses.asdict(plain)) or "")
    # Selective checkpointing keeps the matmuls' outputs: nothing counted is computed again.
    assert (
        count_recompute_flops(workload, LoopConfig(activation_checkpointing="selective"), cpu) == 0
    )
    half = count_recompute_flops(workload, config.replace(checkpoint_share=0.5), cpu)
    assert 0 < half < count_recompute_flops(workload, config, cpu)


def test_a_baseline_that_failed_in_the_final_round_is_not_profiled_again(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    workload = f"{WORKLOADS}:needs_micro_batches"
    rec = run_json(
        options(storage, "oom", trials=4, workload=workload, space="scale", profile="baselines")
    )
    assert set(rec["failures"]) == {"pytorch-default", "seed-baseline"}
    for name in rec["failures"]:
        assert rec["profile_errors"][name].startswith("not profiled: it failed in the final round")
    # The recommended config ran, so it is profiled.
    assert "recommended" in rec["verdicts"]
