"""`python -m tuner train` as a user runs it: a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def tuner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args], capture_output=True, text=True, timeout=120
    )


def test_help_lists_train() -> None:
    out = tuner("--help")
    assert out.returncode == 0
    assert "train" in out.stdout


def test_train_json_is_a_run_result() -> None:
    out = tuner(
        "train",
        "--workload",
        "transformer",
        "--preset",
        "tiny",
        "--streams",
        "2",
        "--sync-interval",
        "10",
        "--sync-mode",
        "event",
        "--steps",
        "20",
        "--warmup",
        "2",
        "--device",
        "cpu",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["config"]["num_streams"] == 2
    assert result["config"]["sync_mode"] == "event"
    assert len(result["losses"]) == 22
    assert result["n_syncs"] == 3  # steps 10 and 20, then the drain of steps 21-22
    assert result["effective"]["streams"] is False


def test_train_summary_is_readable() -> None:
    out = tuner("train", "--preset", "tiny", "--steps", "5", "--warmup", "1", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert "samples/s" in out.stdout
    assert "no effect" in out.stdout


def test_user_workload_from_module_path() -> None:
    out = tuner(
        "train",
        "--workload",
        "examples.my_workload:build",
        "--steps",
        "4",
        "--warmup",
        "0",
        "--windows",
        "2",
        "--device",
        "cpu",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["workload"] == "my_workload"


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--streams", "7"], "--streams"),
        (["--streams", "x"], "--streams"),
        (["--sync-interval", "0"], "--sync-interval"),
        (["--sync-mode", "often"], "--sync-mode"),
        (["--prefetch-depth", "9"], "--prefetch-depth"),
        (["--preset", "huge"], "--preset"),
        (["--workload", "resnet"], "--workload"),
        (["--device", "tpu"], "--device"),
        (["--steps", "0"], "--steps"),
        (["--bogus", "1"], "--bogus"),
        # A seed past 64 bits raised a traceback; a negative one ran (run refuses both).
        (["--seed", str(2**64)], "--seed"),
        (["--seed", "-3"], "--seed"),
    ],
)
def test_bad_flag_is_one_line_naming_the_flag(args: list[str], flag: str) -> None:
    out = tuner("train", "--device", "cpu", *args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert flag in lines[0]
    assert "Traceback" not in out.stderr


def test_cuda_graph_on_cpu_is_one_clear_line() -> None:
    out = tuner("train", "--device", "cpu", "--cuda-graph")
    assert out.returncode == 2
    expected = "error: --cuda-graph: cuda_graph=True needs a CUDA device, and this run is on cpu"
    assert out.stderr.strip() == expected


def test_train_fits_its_windows_to_a_few_steps_when_not_given() -> None:
    """`--steps 2` alone had been refused naming --windows, a flag the user never gave."""
    out = tuner("train", "--steps", "2", "--warmup", "1", "--device", "cpu", "--json")
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)["windows"]) == 2
    given = tuner("train", "--steps", "2", "--windows", "3", "--device", "cpu")
    assert given.returncode == 2 and "windows=3 is invalid" in given.stderr


def test_train_names_a_float64_batch_with_its_fix() -> None:
    """`tuner run` said it; `tuner train` had printed torch's "mat1 and mat2 must have the same
    dtype" alone (a user's probe, 2026-12-07)."""
    out = tuner(
        "train",
        "--workload",
        "tests.trainers.own_workloads:float64_features",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--device",
        "cpu",
    )
    assert out.returncode == 1, out.stderr
    assert "error: the run failed: RuntimeError" in out.stderr
    assert "torch.from_numpy give float64; .float() the batch's floating tensors" in out.stderr
