"""The tuned step inside Lightning Fabric.

Fabric does what it is liked for: it launches, picks the device, logs (here to CSV) and writes and
reads checkpoints. streamtune's `Trainer` runs the steps with the tuned settings: its feed, its
(compiled, captured) step and its loss harvest. The model and optimizer are not passed through
`fabric.setup()`: Fabric's wrappers would hide them from the compiler and the CUDA graph, and
the tuned loop already does the device placement and precision that `setup()` adds on one device.

    python examples/fabric_tuned_step.py --steps 2000 --root runs/ \\
        --config tuned.json          # from `python -m tuner export --format json`
    python examples/fabric_tuned_step.py --steps 4000 --root runs/ --resume  # --schedule-steps

The losses reach Fabric's logger as the tuned sync mode harvests them: logging adds no sync.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

from lightning_fabric import Fabric
from lightning_fabric.loggers import CSVLogger

import trainers
from trainers import warmup_cosine


def train(
    *,
    steps: int,
    root: Path,
    schedule_steps: int | None = None,
    config: trainers.LoopConfig,
    workload: str = "transformer",
    preset: str = "tiny",
    accelerator: str = "auto",
    resume: bool = False,
    log_every: int = 1,
) -> dict[str, Any]:
    """Train `workload` until `steps` steps in all; returns what was logged and where.

    schedule_steps: the length of the warm-up + cosine schedule (default `steps`): a run cut in
    two keeps the schedule of the whole run.
    """
    total = schedule_steps or steps
    fabric = Fabric(accelerator=accelerator, devices=1, loggers=CSVLogger(root, name="tuned"))
    fabric.launch()
    trainer = trainers.Trainer(
        trainers.load_workload(workload, preset),
        config,
        device=fabric.device,
        scheduler=warmup_cosine(total, max(1, total // 20)),
        clip_grad_norm=1.0,
        eval_data=[trainers.load_workload(workload, preset, seed=1).dataset[i] for i in range(2)],
    )
    checkpoint = root / "checkpoint.ckpt"
    if resume:
        # Fabric reads the file; the Trainer restores the state in it (model, optimizer,
        # scheduler, step, RNG states, data position).
        trainer.load_state_dict(fabric.load(checkpoint)["trainer"])

    def log_losses(first: int, losses: list[float]) -> None:
        for step, loss in enumerate(losses, start=first + 1):
            if step % log_every == 0:
                fabric.log("train_loss", loss, step=step)

    result = trainer.fit(
        steps,
        on_losses=log_losses,
        eval_every=max(1, total // 4),
        on_eval=lambda step, loss: fabric.log("eval_loss", loss, step=step),
    )
    fabric.save(checkpoint, {"trainer": trainer.state_dict()})
    for logger in fabric.loggers:
        logger.finalize("success")
    return {"result": result, "log_dir": Path(fabric.loggers[0].log_dir), "checkpoint": checkpoint}


def read_metrics(log_dir: Path) -> list[dict[str, str]]:
    with (log_dir / "metrics.csv").open() as handle:
        return list(csv.DictReader(handle))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--schedule-steps", type=int, default=None, help="default: --steps")
    parser.add_argument("--root", type=Path, default=Path("runs"))
    parser.add_argument("--config", default=None, help="a JSON export (default: STREAMTUNE_*)")
    parser.add_argument("--workload", default="transformer")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    config = trainers.load_config(args.config) if args.config else trainers.load_config()
    done = train(
        steps=args.steps,
        root=args.root,
        schedule_steps=args.schedule_steps,
        config=config,
        workload=args.workload,
        preset=args.preset,
        resume=args.resume,
        log_every=10,
    )
    result = done["result"]
    print(f"steps {result.start_step}..{result.step} in {result.wall_s:.1f} s")
    print(f"logs in {done['log_dir']}, checkpoint {done['checkpoint']}")


if __name__ == "__main__":
    main()
