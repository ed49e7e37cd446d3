"""benchmarks/data_parallel.py's logic on the CPU (`--device cpu`: 2 processes over gloo), so the
script for a machine of several GPUs is known to run: the tuning job of N processes, the peers
and the recommendation interleaved, and the record written (its figures mean nothing here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import trainers
from benchmarks import data_parallel

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_data_parallel_script_tunes_and_compares_over_two_processes(tmp_path: Path) -> None:
    flags = ["--device", "cpu", "--presets", "mlp:tiny", "--nproc", "2", "--trials", "1"]
    flags += ["--search-timeout", "600", "--rounds", "1", "--windows", "2", "--window-steps", "2"]
    flags += ["--warmup", "1", "--commit", "abc", "--out", str(tmp_path), "--tag", "t"]
    done = subprocess.run(
        [sys.executable, "benchmarks/data_parallel.py", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [path] = tmp_path.glob("data-parallel-cpu-*-t.json")
    data = json.loads(path.read_text())
    assert data["meta"]["commit"] == "abc"
    [item] = data["presets"]
    assert item["nproc"] == 2 and item["tuning"]["n_trials"]["complete"] == 1
    # The job's baselines are DDP's defaults: its speedups are over runs on as many processes.
    assert set(item["tuning"]["speedup"]) == {"pytorch-default", "seed-baseline"}
    assert item["tuning"]["config"]["parallel"] in ("ddp", "fsdp2")
    assert set(item["measured"]) == {"recommended", "ddp-defaults", "ddp-compile"}
    for entry in item["measured"].values():
        assert (entry["world_size"], entry["backend"]) == (2, "gloo")
        low, high = entry["ci95"]
        assert low <= entry["median_ms"] <= high and len(entry["windows_ms"]) == 2
    assert item["measured"]["ddp-compile"]["config"]["compile"] == "default"
    best = item["speedup_over_fastest_peer"]
    peers = {n: item["measured"][n]["median_ms"] for n in ("ddp-defaults", "ddp-compile")}
    assert best["best_peer"] == min(peers, key=peers.__getitem__)
    assert "skipped" in item["comm"]  # gloo: no kernels to overlap
    markdown = path.with_suffix(".md").read_text()
    assert "| mlp:tiny | 2 | ddp-compile |" in markdown and "recommended / " in markdown


def test_the_speedup_is_over_the_fastest_peer_that_ran() -> None:
    measured = {
        "recommended": {"median_ms": 8.0, "windows_ms": [8.0, 8.0, 8.0]},
        "slow": {"median_ms": 12.0, "windows_ms": [12.0, 12.0, 12.0]},
        "fast": {"median_ms": 10.0, "windows_ms": [10.0, 10.0, 10.0]},
        "broken": {"error": "ran out of memory"},
    }
    best = data_parallel.speedup_over_fastest_peer(measured)
    assert best == {"best_peer": "fast", "ratio": pytest.approx(1.25), "ci95": [1.25, 1.25]}
    assert data_parallel.speedup_over_fastest_peer({"recommended": {"error": "x"}}) is None


def test_more_processes_than_gpus_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    more = torch.cuda.device_count() + 1
    code = data_parallel.main(["--device", "cuda", "--nproc", str(more), "--out", str(tmp_path)])
    assert code == 2 and not list(tmp_path.iterdir())
    err = capsys.readouterr().err
    assert (
        err.startswith(f"data_parallel.py: --nproc {more} needs as many GPUs")
        and err.count("\n") == 1
    )


def test_every_peer_is_a_valid_data_parallel_config_on_a_gpu() -> None:
    assert set(data_parallel.PEERS["torchrun"]) == {
        "ddp-defaults",
        "ddp-compile-fused",
        "fsdp2-blocks-compiled",
    }
    for group in data_parallel.PEERS.values():
        for name, config in group.items():
            reason = trainers.invalid_reason(config.to_dict(), device_type="cuda")
            assert reason is None, (name, reason)
            assert config.parallel in ("ddp", "fsdp2"), name
