"""benchmarks/ddp_one_gpu.py's logic on the CPU (`--device cpu --nproc 2`: gloo), so the
script the lead runs on a GPU is known to run: each setting measured, the gate's one launch for
all, the profile, and the record written (its figures mean nothing on a CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.evidence.verdicts import CPU_EXPLANATION

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_one_gpu_script_runs_its_parts_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "ddp.json"
    flags = ["--device", "cpu", "--quick", "--preset", "tiny", "--windows", "2", "--nproc", "2"]
    flags += ["--window-steps", "2", "--warmup", "1", "--parity-steps", "4"]
    done = subprocess.run(
        [sys.executable, "benchmarks/ddp_one_gpu.py", *flags, "--commit", "abc", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads(out.read_text())
    assert record["meta"]["commit"] == "abc" and record["meta"]["gpu"] == "CPU"
    assert record["meta"]["cpus"] >= 1 and record["meta"]["cpu"]
    assert record["all_ok"] is True
    assert set(record["levers"]) == {"ddp-bucket-25", "fsdp2-prefetch"}
    for lever in record["levers"].values():
        assert lever["ok"] and lever["world_size"] == 2 and lever["backend"] == "gloo"
        assert lever["losses_finite"] and lever["ms_per_step_median"] > 0
    assert set(record["gate"]) == set(record["levers"])
    assert all(verdict["passed"] for verdict in record["gate"].values())
    assert record["profile"]["verdict"] == CPU_EXPLANATION  # no CUDA: no kernels
