"""benchmarks/train_run.py on the CPU: the idiom and the Trainer cut by a checkpoint train the
same workload to the same losses (as-built optimizer, fp32), and the report says so."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import train_run


def test_the_trainer_cut_in_two_trains_like_the_idiom(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_streams": 2, "sync_interval": 5, "sync_mode": "event"}))
    train_run.main(
        [
            "--workload", "transformer", "--preset", "tiny", "--config", str(config),
            "--steps", "20", "--window", "5", "--precision", "none", "--perturbed", "2",
            "--device", "cpu", "--tag", "t", "--out", str(tmp_path), "--warm",
        ]
    )  # fmt: skip
    (path,) = tmp_path.glob("train-run-cpu-*-t.json")
    data = json.loads(path.read_text())
    idiom, rec = data["runs"]["idiom"], data["runs"]["recommended"]
    assert len(idiom["losses"]) == len(rec["losses"]) == 20
    # Same optimizer, same order of operations, same batches: the same losses, through a resume.
    assert rec["losses"] == idiom["losses"]
    assert rec["checkpoint_step"] == 10
    assert data["runs"]["recommended_warm"]["losses"] == rec["losses"]
    assert data["speedup_warm"] > 0
    assert data["equivalence"]["passed"] and data["speedup"] > 0
    assert [len(run["losses"]) for run in data["runs"]["perturbed"]] == [20, 20]
    assert "inside" in path.with_suffix(".md").read_text()
