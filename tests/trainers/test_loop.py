"""Loop logic on the CPU: sync points, harvesting order, windows, DataLoader settings, errors."""

from __future__ import annotations

import json
import re

import pytest

from tests.trainers.helpers import per_sample
from trainers import (
    ConfigError,
    LoopConfig,
    RunArgs,
    UnsupportedOnDevice,
    Window,
    load_workload,
    run,
)
from trainers.measure import window_sizes


def tiny_run(
    config: LoopConfig, *, steps: int = 12, warmup: int = 3, windows: int = 3, **kwargs: object
):
    workload = load_workload("transformer", "tiny")
    args = RunArgs(steps=steps, warmup=warmup, windows=windows, device="cpu")
    return run(workload, config, args, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("interval", [1, 4, 5, 15, 100])
@pytest.mark.parametrize("mode", ["synchronize", "event"])
def test_deferred_modes_sync_every_interval(mode: str, interval: int) -> None:
    result = tiny_run(LoopConfig(sync_interval=interval, sync_mode=mode))  # type: ignore[arg-type]
    total = 15
    # One sync per full interval, plus the final drain when the last interval is partial.
    expected = total // interval + (1 if total % interval else 0)
    assert result.n_syncs == expected
    assert result.loss_check == {
        "n_extracted": total,
        "expected": total,
        "in_order": True,
        "each_once": True,
        "complete": True,
        "extractions": expected,
    }
    assert len(result.losses) == total


def test_query_mode_harvests_without_blocking_on_cpu() -> None:
    result = tiny_run(LoopConfig(sync_interval=4, sync_mode="query"))
    assert result.n_syncs == 0  # nothing to wait for on a CPU
    assert result.n_polls >= 15
    assert result.loss_check["complete"] and result.loss_check["in_order"]


def test_every_setting_gives_the_same_losses_on_cpu() -> None:
    reference = tiny_run(LoopConfig()).losses
    for config in [
        LoopConfig(num_streams=2, sync_interval=10, sync_mode="event"),
        LoopConfig(num_streams=3, sync_interval=3, sync_mode="query", prefetch_depth=3),
        LoopConfig(
            num_streams=4,
            sync_interval=7,
            pin_memory=True,
            non_blocking=True,
            prefetch_depth=4,
            num_workers=2,
        ),
    ]:
        assert tiny_run(config).losses == reference, config


def test_losses_are_training_not_constant() -> None:
    losses = tiny_run(LoopConfig(), steps=30, warmup=0).losses
    assert len(set(losses)) > 20
    assert sum(losses[-5:]) < sum(losses[:5])


def test_windows_and_summary() -> None:
    result = tiny_run(LoopConfig(), steps=10, warmup=2, windows=3)
    assert [w.steps for w in result.windows] == [4, 3, 3]
    assert result.steps == 10 and result.warmup_steps == 2
    times = sorted(w.step_ms for w in result.windows)
    assert result.step_time_ms["median"] == pytest.approx(times[1])
    assert result.step_time_ms["p10"] <= result.step_time_ms["median"] <= result.step_time_ms["p90"]
    assert result.samples_per_s == pytest.approx(8 / (times[1] / 1e3))
    assert result.tokens_per_s == pytest.approx(result.samples_per_s * 16)


def test_window_sizes() -> None:
    assert window_sizes(10, 3) == [4, 3, 3]
    assert window_sizes(5, 5) == [1] * 5
    assert sum(window_sizes(1001, 7)) == 1001


def test_result_is_json_with_the_documented_keys() -> None:
    data = json.loads(json.dumps(tiny_run(LoopConfig(num_streams=2)).to_dict()))
    for key in [
        "config",
        "workload",
        "preset",
        "device",
        "warmup_steps",
        "steps",
        "losses",
        "n_syncs",
        "sync_wait_ms",
        "windows",
        "step_time_ms",
        "samples_per_s",
        "tokens_per_s",
        "peak_memory_bytes",
        "fingerprint",
    ]:
        assert key in data, key
    assert data["config"] == LoopConfig(num_streams=2).to_dict()
    assert data["effective"]["streams"] is False and "no effect" in data["effective"]["note"]
    assert data["fingerprint"]["torch"] and data["fingerprint"]["python"]
    assert "hostname" not in json.dumps(data["fingerprint"]).lower()
    assert set(data["windows"][0]) >= {"steps", "wall_ms", "gpu_ms"}


def test_on_window_can_stop_the_run() -> None:
    seen: list[int] = []

    def stop_after_two(index: int, window: Window) -> bool:
        seen.append(index)
        assert window.wall_ms > 0
        return index < 1

    result = tiny_run(LoopConfig(sync_interval=5), steps=12, windows=4, on_window=stop_after_two)
    assert seen == [0, 1]
    assert result.stopped_early
    assert result.steps == 6
    assert len(result.losses) == 3 + 6  # warm-up and the steps run, all extracted
    assert result.loss_check["complete"]


def test_per_sample_dataset_is_batched_by_the_loader() -> None:
    result = run(
        per_sample("any", seed=0),
        LoopConfig(num_workers=1),
        RunArgs(steps=6, warmup=0, windows=2, device="cpu"),
    )
    assert len(result.losses) == 6
    assert result.samples_per_batch == 8


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"steps": 0}, "steps"),
        ({"warmup": -1}, "warmup"),
        ({"windows": 0}, "windows"),
        ({"windows": 13}, "windows"),
    ],
)
def test_bad_run_arguments(kwargs: dict[str, int], field: str) -> None:
    args = {"steps": 12, "warmup": 3, "windows": 3} | kwargs
    with pytest.raises(ConfigError) as info:
        run(load_workload("mlp", "tiny"), LoopConfig(), RunArgs(device="cpu", **args))
    assert info.value.field == field


def test_cuda_graph_on_cpu_is_a_clear_error() -> None:
    with pytest.raises(UnsupportedOnDevice, match="cuda_graph=True needs a CUDA device"):
        run(load_workload("mlp", "tiny"), LoopConfig(cuda_graph=True), RunArgs(device="cpu"))


@pytest.mark.parametrize("device", ["tpu", "cpu\n", "auto\n", "cuda:0\n", " cpu"])
def test_bad_device(device: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"device={device!r}")):
        run(load_workload("mlp", "tiny"), LoopConfig(), RunArgs(device=device))
