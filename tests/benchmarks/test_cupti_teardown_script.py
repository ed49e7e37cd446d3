"""benchmarks/cupti_teardown.py on the CPU: each row a fresh process, with TEARDOWN_CUPTI unset
and set, a config's median before any profile and after each of two profiles, and the record it
writes (a CPU has no CUPTI: the figures mean nothing here, the rows' shape does)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_script_measures_before_and_after_two_profiles_in_a_process_each(
    tmp_path: Path,
) -> None:
    flags = ["--workload", "mlp", "--preset", "tiny", "--precision", "fp32", "--steps", "3"]
    flags += ["--device", "cpu", "--configs", "eager", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "benchmarks/cupti_teardown.py", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "cupti-teardown.json").read_text())
    assert (record["workload"], record["preset"]) == ("mlp", "tiny")
    rows = record["rows"]
    assert [(r["config"], r["teardown"]) for r in rows] == [("eager", "unset"), ("eager", "1")]
    for row in rows:
        assert "error" not in row, row
        assert row["before_ms"] > 0 and row["profile_1_s"] > 0 and row["profile_2_s"] > 0
        worst = max(row["after_1_ms"], row["after_2_ms"]) / row["before_ms"]
        assert row["after_ratio"] == round(worst, 3)


def test_an_unknown_config_is_refused_naming_the_flag() -> None:
    done = subprocess.run(
        [sys.executable, "benchmarks/cupti_teardown.py", "--configs", "eager,graphed"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "--configs: graphed unknown; allowed eager, compiled-graph" in done.stderr
