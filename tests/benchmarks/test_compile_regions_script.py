"""benchmarks/compile_regions.py on the CPU: both variants, each in a new process from its own
empty cache, then taking turns in one process; the record holds each variant's compile and step
and the turns, and the marked variant traced fewer calls (its figures are for a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_both_variants_run_and_the_record_says_what_each_took(tmp_path: Path) -> None:
    flags = ["--workload", "transformer", "--preset", "tiny", "--precision", "fp32"]
    flags += ["--config", "compile=default,num_workers=0", "--device", "cpu", "--steps", "3"]
    flags += ["--warmup", "2", "--windows", "1", "--rounds", "1", "--commit", "abc"]
    flags += ["--out", str(tmp_path), "--tag", "t"]
    done = subprocess.run(
        [sys.executable, "benchmarks/compile_regions.py", *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [path] = tmp_path.glob("compile-regions-cpu-*-t.json")
    data = json.loads(path.read_text())
    assert data["meta"]["commit"] == "abc"
    variants = data["variants"]
    assert set(variants) == {"model", "regions"}
    for name, found in variants.items():
        assert "error" not in found, (name, found)
        assert found["blocks"] >= 2 and found["compile_s"] > 0 and found["step_ms"] > 0
        assert found["losses"] and all(loss == loss for loss in found["losses"])  # not NaN
    assert variants["regions"]["traced_calls"] < variants["model"]["traced_calls"]
    turns = [(t["round"], t["variant"]) for t in data["turns"]]
    assert turns == [(1, "model"), (1, "regions")]
    text = (tmp_path / path.name.replace(".json", ".md")).read_text()
    assert [line for line in text.splitlines() if line.startswith("| regions |")]
