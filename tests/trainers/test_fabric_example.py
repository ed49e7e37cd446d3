"""examples/fabric_tuned_step.py on the CPU: Lightning Fabric launches, logs and checkpoints while
the tuned Trainer trains; a run resumed through Fabric's checkpoint logs the losses of the
uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from examples.fabric_tuned_step import read_metrics, train
from trainers import LoopConfig

CONFIG = LoopConfig(num_streams=2, sync_mode="event", sync_interval=3, prefetch_depth=2)


def losses(rows: list[dict[str, str]]) -> dict[int, float]:
    return {int(r["step"]): float(r["train_loss"]) for r in rows if r.get("train_loss")}


def test_fabric_logs_every_loss_and_the_evaluations(tmp_path: Path) -> None:
    done = train(steps=8, root=tmp_path / "whole", config=CONFIG, accelerator="cpu")
    rows = read_metrics(done["log_dir"])
    logged = losses(rows)
    assert sorted(logged) == list(range(1, 9))
    assert [logged[s] for s in range(1, 9)] == pytest.approx(done["result"].losses, rel=1e-6)
    assert [int(r["step"]) for r in rows if r.get("eval_loss")] == [2, 4, 6, 8]
    assert done["checkpoint"].exists()


def test_a_run_resumed_from_fabrics_checkpoint_logs_the_uninterrupted_losses(
    tmp_path: Path,
) -> None:
    whole = train(steps=8, root=tmp_path / "whole", config=CONFIG, accelerator="cpu")
    root = tmp_path / "split"
    # The same schedule length in both halves: the schedule is part of the run, not of a call.
    first = train(steps=4, schedule_steps=8, root=root, config=CONFIG, accelerator="cpu")
    assert first["result"].step == 4
    second = train(steps=8, root=root, config=CONFIG, accelerator="cpu", resume=True)
    assert second["result"].start_step == 4
    assert first["result"].losses + second["result"].losses == whole["result"].losses
    logged = losses(read_metrics(second["log_dir"]))
    assert sorted(logged) == [5, 6, 7, 8]
