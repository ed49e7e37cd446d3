"""benchmarks/attention.py's logic on the CPU: the record it writes for a model with attention
and one without (the forced kernels are refused on a CPU; the figures mean nothing here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_attention_script_records_each_models_calls_and_each_values_time(
    tmp_path: Path,
) -> None:
    flags = ["--presets", "transformer:tiny,mlp:tiny", "--device", "cpu", "--precision", "fp32"]
    flags += ["--iters", "2", "--commit", "abc", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "benchmarks/attention.py", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("attention-*.json")
    data = json.loads(path.read_text())
    assert data["meta"]["commit"] == "abc"
    attention, plain = data["presets"]
    assert attention["preset"] == "transformer:tiny" and attention["calls"]
    per_step = attention["attention_ms_per_step"]
    assert per_step["default"] > 0 and per_step["cudnn"] is None and per_step["flash"] is None
    assert all("is a CUDA kernel" in c["ms"]["cudnn"] for c in attention["calls"])
    assert plain["calls"] == [] and plain["attention_ms_per_step"]["default"] is None
    assert "| transformer:tiny |" in path.with_suffix(".md").read_text()
