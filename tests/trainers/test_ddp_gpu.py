"""Data parallelism on one GPU: world-size-1 NCCL torchrun launches of DDP and FSDP2 train the
single-process model, every lever runs, and the one-GPU proof script writes its record. Skipped
without CUDA (CI has none); `benchmarks/ddp_one_gpu.py` is the full proof."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainers import LoopConfig, RunArgs, parity_losses
from trainers.program import run_distributed

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
ROOT = Path(__file__).resolve().parents[2]
STEPS = 8


def _gate_run(config: LoopConfig) -> list[float]:
    result = run_distributed(
        "transformer",
        "tiny",
        config,
        RunArgs(steps=STEPS - 1, warmup=1, windows=1, device="cuda"),
        nproc=1,
        gate=True,
        timeout_s=300,
    )
    assert result.effective["backend"] == "nccl" and result.effective["world_size"] == 1
    return result.losses


@pytest.mark.parametrize(
    "settings",
    [
        {"parallel": "ddp"},
        {"parallel": "ddp", "bucket_cap_mb": 1, "gradient_as_bucket_view": True},
        {"parallel": "ddp", "static_graph": True, "num_streams": 2, "pin_memory": True},
        {"parallel": "fsdp2"},
        {"parallel": "fsdp2", "reshard_after_forward": False, "fsdp_prefetch": True},
    ],
)
def test_one_rank_under_nccl_trains_the_single_process_model(settings: dict[str, object]) -> None:
    reference = parity_losses(
        "transformer", "tiny", LoopConfig(), RunArgs(steps=STEPS, device="cuda")
    )
    losses = _gate_run(LoopConfig(**settings))  # type: ignore[arg-type]
    # One rank averages over one: the same gradients; FSDP2's flat buffers may sum in another
    # order, hence a rounding tolerance, far below what a wrong step moves.
    assert losses == pytest.approx(reference, rel=1e-4, abs=1e-5)


def test_the_one_gpu_proof_script_writes_its_record(tmp_path: Path) -> None:
    out = tmp_path / "ddp.json"
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/ddp_one_gpu.py",
            "--quick",
            "--preset",
            "tiny",
            "--windows",
            "2",
            "--window-steps",
            "3",
            "--commit",
            "test",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(out.read_text())
    assert record["meta"]["commit"] == "test" and record["meta"]["gpu"]
    assert set(record["levers"]) == {"ddp-bucket-25", "fsdp2-prefetch"}
    assert all(lever["ok"] and lever["backend"] == "nccl" for lever in record["levers"].values())
    assert all(verdict["passed"] for verdict in record["gate"].values())
    assert "verdict" in record["profile"]
