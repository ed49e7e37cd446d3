"""benchmarks/node.py's logic on the CPU: two CPU worker processes stand in for GPUs
(`TUNER_CPU_STANDINS`), so the script for a node of several GPUs is known to run: the job on one
device, the same job on two, both recommendations measured interleaved on one device, and the
record written with the keys the several-GPU evidence asks for (its figures mean nothing here)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests.tuner.tiny import RUN_FLAGS
from tuner.store import keys

ROOT = Path(__file__).resolve().parents[2]
# The job's own flags, less what the script sets itself (workload, preset, device).
JOB_FLAGS = RUN_FLAGS[6:]


@pytest.mark.slow
def test_the_node_script_times_both_jobs_and_compares_their_picks(tmp_path: Path) -> None:
    flags = ["--presets", "mlp:tiny", "--device", "cpu", "--gpus", "2", "--rounds", "1"]
    flags += ["--protocol", "1,3,2", "--commit", "abc", "--out", str(tmp_path), "--tag", "t"]
    flags += [f"--job-arg={arg}" for arg in (*JOB_FLAGS, "--trials", "4")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    env |= {"TUNER_CPU_STANDINS": "2", "TUNER_POLL_S": "0.3", "TUNER_TORCH_THREADS": "1"}
    env |= {"TUNER_GATE_MEMO": "off"}
    done = subprocess.run(
        [sys.executable, "benchmarks/node.py", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [path] = tmp_path.glob("node-cpu-*-t.json")
    data = json.loads(path.read_text())
    assert data["meta"]["commit"] == "abc"
    [item] = data["presets"]
    assert {"preset", "wall_s_one_gpu", "wall_s_gpus", "gpus", "ratio_vs_one_gpu"} <= set(item)
    assert item["preset"] == "mlp:tiny" and item["gpus"] == 2
    assert item["wall_s_one_gpu"] > 0 and item["wall_s_gpus"] > 0
    assert sum(item["trials_by_device"].values()) == 4
    ratio = item["ratio_vs_one_gpu"]
    assert ratio["ci95"][0] <= ratio["ratio"] <= ratio["ci95"][1]
    assert item["recommended"]["one_gpu"]["config"] is not None
    assert "| mlp:tiny | 2 |" in path.with_suffix(".md").read_text()
    # Each job's time by phase and its search, and its progress lines beside the record.
    for name in ("one_gpu", "gpus"):
        assert isinstance(item["jobs"][name]["time"]["phases"], dict)
        assert item["jobs"][name]["trial_counts"]["complete"] >= 1
    assert "trial 0" in (tmp_path / "node-tiny-gpus2.log").read_text()
    assert (tmp_path / "node-tiny-gpus1.log").read_text().strip()
    # The workers' own logs and every process's phase times are kept beside the record.
    logs = [p.read_text() for p in (tmp_path / "node-tiny-gpus2-workers").glob("worker-*.log")]
    assert len(logs) == 2
    # Each part a worker took, timed in its log: the final round on the one that ran it.
    assert any(re.search(r"\d\d:\d\d:\d\d\S* tuner.worker job \w+: final round", t) for t in logs)
    sessions = json.loads((tmp_path / "node-tiny-gpus2-sessions.json").read_text())
    assert len(sessions) >= 2 and all("phases" in s for s in sessions.values())
    # And each job's answer and study, written as the job ended.
    for gpus in ("1", "2"):
        answer = json.loads((tmp_path / f"node-tiny-gpus{gpus}-recommendation.json").read_text())
        stored = optuna.load_study(
            study_name=answer["study"],
            storage=f"sqlite:///{tmp_path}/node-tiny-gpus{gpus}-study.db",
        )
        assert keys.RECOMMENDATION in stored.user_attrs
