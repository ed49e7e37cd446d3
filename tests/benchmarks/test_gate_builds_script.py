"""benchmarks/gate_builds.py on the CPU: two gate children measure the same seed envelope, one
with its builds made ahead, and the record says so (on a CPU the kernels are deterministic, so
the two envelopes are the same losses bit for bit)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gate_builds import _largest

ROOT = Path(__file__).resolve().parents[2]


def test_the_largest_difference_is_between_runs_or_around_the_reference() -> None:
    one = {"reference": [1.0, 2.0], "perturbed": [[1.5, 2.0], [1.0, 1.0]]}
    other = {"reference": [1.0, 2.25], "perturbed": [[1.5, 2.0], [1.0, 1.0]]}
    assert _largest(one, other) == 0.25
    assert _largest(one, one) == 0.0
    assert _largest(one, one, against_reference=True) == 1.0


@pytest.mark.slow
def test_the_record_of_two_children_on_the_cpu(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "benchmarks/gate_builds.py",
        *("--workload", "mlp", "--preset", "tiny", "--steps", "6", "--device", "cpu"),
        *("--precision", "fp32", "--config-precision", "bf16-autocast"),
        *("--commit", "test", "--out", str(tmp_path)),
    ]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=300)
    (found,) = tmp_path.glob("gate-builds-*.json")
    row = json.loads(found.read_text())["row"]
    assert row["same_losses"] is True and row["largest_difference"] == 0.0
    assert row["seed_spread"] > 0.0  # other seeds train otherwise
    assert row["built_ahead_s"] > 0.0 and row["with_builds_ahead_s"] > 0.0
    assert (tmp_path / found.name.replace(".json", ".md")).read_text().count("| mlp tiny") == 1
