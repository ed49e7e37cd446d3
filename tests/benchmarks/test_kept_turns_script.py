"""benchmarks/kept_turns.py on the CPU: trials, then configs taking turns with the baselines in one
process keep their code, and the gate's run of each compiles nothing; the record says so run by
run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "benchmarks/kept_turns.py",
        "--workload=convnet",  # no dropout: the gate's run is its turn's graphs
        "--preset=tiny",
        "--device=cpu",
        "--precision=fp32",
        "--config=compile=default",
        "--steps=4",
        "--gate-steps=4",
        "--commit=abc",
        f"--out={tmp_path}",
        *extra,
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_no_rounds_is_refused_by_name(tmp_path: Path) -> None:
    done = _run(tmp_path, "--rounds=0")
    assert done.returncode == 2 and "--rounds: 0: allowed 1 or more" in done.stderr


@pytest.mark.slow
def test_turns_of_two_configs_and_their_gate_runs_compile_once_each(tmp_path: Path) -> None:
    done = _run(tmp_path, "--turns=;optimizer=foreach", "--rounds=2")
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = tmp_path.glob("kept-turns-cpu-*.json")
    data = json.loads(path.read_text())
    assert data["meta"]["commit"] == "abc" and data["meta"]["file"] == path.name
    runs = [(r["kind"], r["config"]) for r in data["runs"]]
    baselines = [("turn", "pytorch-default"), ("turn", "seed-baseline")]
    assert runs == [
        ("trial", "config-0"),
        ("trial", "config-1"),
        ("gate", "config-1"),  # the leader, gated after the trials
        *baselines,
        ("turn", "config-0"),
        ("turn", "config-1"),
        ("gate", "config-0"),  # gated after the first round
        *baselines,
        ("turn", "config-0"),
        ("turn", "config-1"),
    ]
    first = data["runs"][0]
    assert first["compile_s"] > 0 and first["cache_misses"] + first["cache_hits"] > 0
    for row in data["runs"][1:]:
        assert "where" not in row, row  # every gate run made here: the code was held
        assert row["compile_s"] == 0.0, row  # kept, beside the kept (the same graphs), or eager
        assert not any(note.startswith("kept code dropped") for note in row["notes"]), row
        assert row["warnings"] == []
    assert data["runs"][5]["kept_s"] == pytest.approx(first["compile_s"], abs=0.01)
    assert "| gate | config-0 |" in path.with_suffix(".md").read_text()
