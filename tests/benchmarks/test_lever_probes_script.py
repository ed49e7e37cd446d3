"""benchmarks/lever_probes.py's logic on the CPU: the record it writes for a model with attention
and one without, and what a stage would do with the figures (the CUDA kernels are refused on a
CPU; the figures mean nothing here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_probes_script_records_each_levers_figures_and_the_stages_verdicts(
    tmp_path: Path,
) -> None:
    flags = ["--presets", "transformer:tiny,mlp:tiny", "--device", "cpu", "--precision", "fp32"]
    flags += ["--step-ms", "50", "--commit", "abc", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "benchmarks/lever_probes.py", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (path,) = tmp_path.glob("lever-probes-*.json")
    data = json.loads(path.read_text())
    assert data["meta"]["commit"] == "abc"
    attention, plain = data["presets"]
    figures = attention["ms_per_step"]["attention"]
    assert figures["default"] > 0 and "is a CUDA kernel" in figures["cudnn"]
    # Neither model has a loss function of its own: the loss probe finds none of its work.
    assert attention["ms_per_step"]["loss"] == {} == plain["ms_per_step"]["loss"]
    assert plain["ms_per_step"]["attention"] == {}
    stage = attention["stage"]["attention"]
    assert set(stage) == {"cudnn", "flash"} and "is a CUDA kernel" in stage["cudnn"]
    assert "does none of the work" in plain["stage"]["attention"]["cudnn"]
    table = path.with_suffix(".md").read_text()
    assert "| transformer:tiny | attention |" in table and "none of its work" in table


def test_the_probes_script_passes_its_model_args_to_the_workload(tmp_path: Path) -> None:
    # A built-in workload takes no model arguments: refused in the workload's own words, which
    # shows they reached it (a library model, absent from CI, is shaped by them).
    flags = ["--presets", "transformer:tiny", "--device", "cpu", "--model-arg", "vocab=151936"]
    done = subprocess.run(
        [sys.executable, "benchmarks/lever_probes.py", *flags, "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0
    assert "vocab" in done.stderr and "transformer" in done.stderr, done.stderr[-2000:]
    assert not list(tmp_path.glob("lever-probes-*.json"))
