"""benchmarks/multi_gpu.py's logic on the CPU: two CPU workers share a tiny job, one runs it
alone, and the agreement table is written (the figures mean nothing on a CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.helpers import clean_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_multi_gpu_script_runs_its_three_parts_on_the_cpu(tmp_path: Path) -> None:
    flags = [
        "--device",
        "cpu",
        "--workers",
        "2",
        "--workload",
        "mlp",
        "--preset",
        "tiny",
        "--trials",
        "4",
        "--warmup",
        "1",
        "--windows",
        "3",
        "--window-steps",
        "2",
        "--parity-steps",
        "4",
        "--final-rounds",
        "1",
        "--rounds",
        "1",
        "--timeout",
        "150",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(
        [sys.executable, "benchmarks/multi_gpu.py", *flags],
        cwd=ROOT,
        env=clean_env() | {"STREAMTUNE_COMMIT": "abc1234"},
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [written] = tmp_path.glob("multi-gpu-cpu-*.json")
    result = json.loads(written.read_text())
    assert written.with_suffix(".md").read_text().startswith("# 2 workers on one job")
    assert result["commit"] == "abc1234" and result["hardware"]["device_type"] == "cpu"
    for name, workers in (("shared", 2), ("single", 1)):
        run = result[name]
        assert run["status"] == "succeeded" and not run["timed_out"], run
        counted = (
            run["n_trials"]["complete"] + run["n_trials"]["failed"] + run["n_trials"]["pruned"]
        )
        assert (
            counted == 4 and sum(run["trials_per_worker"].values()) == run["n_trials"]["in_study"]
        )
        assert len(run["trials_per_worker"]) <= workers and run["wall_s"] > 0
        phases = run["phases"]
        assert set(phases["trial_s_per_worker"]) == set(run["trials_per_worker"])
        spans = ("until_claimed_s", "until_first_trial_s", "search_s", "after_search_s")
        assert all(phases[key] >= 0 for key in spans), phases
        # The phases follow each other inside the measured wall time.
        assert sum(phases[key] for key in spans) <= run["wall_s"] + 1.0, phases
        assert 0 < phases["search_busy_fraction"] <= 1.0 + 1e-6, phases
    rows = result["agreement"]
    assert [(r["config"], r["device"]) for r in rows] == [
        ("seed-baseline", "cpu"),
        ("seed-baseline", "cpu"),
        ("pytorch-default", "cpu"),
        ("pytorch-default", "cpu"),
    ]
    assert rows[0]["ratio_to_first"] == 1.0
