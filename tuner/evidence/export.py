"""A recommendation in the formats a user takes away: JSON, environment lines, Python."""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import Any

from trainers import ENV_PREFIX, LoopConfig, config_from_env
from tuner.errors import NoRecommendation, TunerError
from tuner.evidence.recommendation import Recommendation

EXPORT_FORMATS = ("json", "env", "python")
__all__ = ["ENV_PREFIX", "EXPORT_FORMATS", "config_from_env", "export", "python_script"]


def export(rec: Recommendation, fmt: str) -> str:
    """The recommended config as JSON, as environment lines, or as a Python script training the
    study's workload with it (`trainers.Trainer`); `trainers.load_config` reads the first two."""
    if fmt not in EXPORT_FORMATS:
        raise TunerError(f"--format: {fmt!r} is invalid: allowed {', '.join(EXPORT_FORMATS)}")
    if rec.config is None:
        # "(see failures)" pointed at what `best` prints, not this command.
        reason = (rec.reason or "none was decided").removesuffix(" (see failures)")
        raise NoRecommendation(
            f"study {rec.study!r} recommends no config to export: {reason} (`python -m tuner "
            f"best --study {shlex.quote(rec.study)}`, with this --storage, names each failure)"
        )
    config = LoopConfig.from_dict(rec.config)
    # The precision to train in goes beside the config (`trainers.load_precision` reads it
    # back): the chosen one, or the one the study was fixed to; without it a study measured in
    # bf16 was trained in fp32 from its own export. An fp32 study's export stays the bare
    # config (`LoopConfig.from_dict` takes it): a Trainer's default is fp32 arithmetic.
    trained = rec.trained_precision
    named = rec.precisions or trained not in (None, "fp32")
    chosen = {"precision": trained} if named else {}
    if fmt == "json":
        return json.dumps(config.to_dict() | chosen, indent=2)
    if fmt == "env":
        return "\n".join(
            f"{ENV_PREFIX}{k.upper()}={_env_value(v)}"
            for k, v in (config.to_dict() | chosen).items()
        )
    if str(rec.study_fields.get("workload") or "").startswith("program:"):
        # The script builds the workload in this process; a program trains in its own.
        raise TunerError(
            f"--format: 'python' is invalid for study {rec.study!r}, which tuned a registered "
            "program (it trains itself): allowed json, env"
        )
    return python_script(rec, config)


_MAIN = """

def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not an integer >= 1")
    return value


def start_ranks(parser: argparse.ArgumentParser, device: str) -> tuple[int, str]:
    # This process's rank and device: rank 0 on `device` where the config trains in one
    # process; where it trains data-parallel, one of the processes torchrun started, each on its
    # own GPU (gloo on CPUs), in a process group started here (the Trainer wraps the model and
    # feeds each rank its shard of every global batch).
    if config.parallel == "none":
        return 0, device
    if "LOCAL_RANK" not in os.environ:
        parser.exit(
            2,
            f"error: this config trains with {config.parallel} in {PROCESSES} processes, one "
            f"per device: launch it as torchrun --nproc-per-node {PROCESSES} {sys.argv[0]} "
            "[its flags]\\n",
        )
    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    cuda = device != "cpu" and torch.cuda.is_available()
    if cuda:
        device = f"cuda:{local}"
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_rank(), device


def main() -> None:
    parser = argparse.ArgumentParser(description=f"train {WORKLOAD} {PRESET} as tuned")
    parser.add_argument(
        "--steps", type=positive, default=1000, help="steps in all (a resumed run counts its own)"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--log-every", type=positive, default=100, help="print a loss every N steps"
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help=f"checkpoint every {CHECKPOINT_EVERY} steps and at the end; a {{step}} in the "
        "path is replaced by the step, keeping each (run-{step}.pt), else the latest is kept",
    )
    parser.add_argument("--resume", default=None, help="resume from this checkpoint")
    args = parser.parse_args()
    if args.checkpoint is not None:
        try:  # a folder or a template it cannot fill, before a step is trained
            trainers.checkpoint_file(args.checkpoint, 0)
        except trainers.ConfigError as exc:
            parser.exit(2, f"error: --checkpoint: {exc}\\n")
    try:  # named as the flag, as the others are (it read "error: device='gpu' is invalid")
        trainers.resolve_device(args.device)
    except (trainers.ConfigError, trainers.TrainerError) as exc:
        parser.exit(2, f"error: --device: {exc}\\n")
    if args.checkpoint and config.parallel == "fsdp2":
        # Each rank holds a shard of the weights: one file from rank 0 would not resume them.
        parser.exit(2, "error: --checkpoint: not with parallel=fsdp2 in this script\\n")
    rank, args.device = start_ranks(parser, args.device)
    # The workload's module is found from the working folder, as `python -m tuner` found it:
    # `python this_file.py` puts only this file's folder on the path.
    if os.getcwd() not in sys.path:
        sys.path.insert(1, os.getcwd())
    try:
        workload = trainers.load_workload(WORKLOAD, PRESET, seed=SEED, model_args=MODEL_ARGS)
    except trainers.WorkloadError as exc:
        parser.exit(2, f"error: {exc}\\n")
    if ARCHITECTURE and trainers.architecture_digest(workload.model) != ARCHITECTURE:
        # Trained as asked, said once: the config was measured and gated on the model as it was.
        print(
            f"warning: {WORKLOAD} {PRESET} is not the model the study measured (its modules or "
            "parameter shapes changed since): this config was tuned and gated on that one; run "
            "`python -m tuner run` again to tune this one",
            file=sys.stderr,
        )
    try:
        trainer = trainers.Trainer(workload, config, device=args.device, precision=PRECISION)
    except (trainers.ConfigError, trainers.TrainerError) as exc:  # a --device not here, say
        parser.exit(2, f"error: {exc}\\n")
    if args.resume is not None:  # "" too: said, not taken as no --resume
        try:
            trainer.load(args.resume)
        except (trainers.ConfigError, trainers.TrainerError) as exc:
            parser.exit(2, f"error: --resume: {exc}\\n")
        if trainer.step >= args.steps:
            # --steps is the total: a checkpoint that has reached it has nothing left to train.
            parser.exit(
                2,
                f"error: --resume: {args.resume} has trained {trainer.step} steps, --steps "
                f"{args.steps} in all leaves none; give --steps above {trainer.step} (e.g. "
                f"--steps {trainer.step + args.steps} for {args.steps} more)\\n",
            )

    def report(first: int, losses: list[float]) -> None:
        # Called as the tuned sync mode harvests the losses: printing adds no sync. Rank 0's
        # own shard's loss only, where there are ranks.
        for step, loss in enumerate(losses, start=first + 1):
            if rank == 0 and step % args.log_every == 0:
                print(f"step {step}: loss {loss:.4f}", flush=True)

    checkpoint = args.checkpoint if rank == 0 else None  # DDP's replicas: rank 0 writes
    try:
        result = trainer.fit(
            args.steps,
            on_losses=report,
            checkpoint_every=CHECKPOINT_EVERY if checkpoint else None,
            checkpoint_path=checkpoint,
        )
    except trainers.NonFiniteLoss as exc:  # diverged: one line, not a traceback
        parser.exit(1, f"error: {exc}\\n")
    if checkpoint and trainer.step % CHECKPOINT_EVERY:  # the end, unless just written
        trainer.save(trainers.checkpoint_file(checkpoint, trainer.step))
    if rank == 0:
        print(f"trained {result.step - result.start_step} steps in {result.wall_s:.1f} s")
    if config.parallel != "none":
        import torch.distributed as dist

        # Leave together: under gloo a rank that left while its peer still talked to it aborted
        # ("terminate called without an active exception": 3 of 14 CPU runs, none of 14 so).
        dist.barrier()
        dist.destroy_process_group()
        # Everything is written and the group is gone: leave without the interpreter's teardown,
        # in which gloo's threads still aborted so, under load (CI, 2026-12-06; 1 of 72 runs
        # beside five others), as the tuner's own ranks did (`trainers.distributed`).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
"""
"""The exported script's `main`: train, checkpoint and resume as its header says."""


def python_script(rec: Recommendation, config: LoopConfig) -> str:
    """A short runnable script that trains the study's workload with `config` through
    `trainers.Trainer`; exec'd as a module it only defines `config` (and the workload's names)."""
    # LoopConfig's fields as keywords; a lever module's levers (no keyword of LoopConfig's) off
    # their defaults as `modules`, which is how LoopConfig takes them.
    keywords = {f.name for f in dataclasses.fields(LoopConfig)} - {"modules"}
    values = {k: v for k, v in config.to_dict().items() if k in keywords}
    values |= {"modules": config.modules} if config.modules else {}
    args = ",\n".join(f"    {k}={v!r}" for k, v in values.items())
    fields = rec.study_fields
    workload, preset = fields.get("workload") or "WORKLOAD", fields.get("preset") or "PRESET"
    model_args = dict(fields.get("model_args") or {})
    seed = int(fields.get("seed") or 0)  # the study's weights and data (stored from 2026-12-02)
    # None for a study stored before models were recorded, or a program's: nothing to check.
    architecture = (fields.get("model") or {}).get("architecture")
    # The precision to train in: the one the study chose when it searched several.
    precision = rec.trained_precision
    processes = int(fields.get("nproc_per_node") or 1)
    launch = "python" if config.parallel == "none" else f"torchrun --nproc-per-node {processes}"
    return (
        f"""# streamtune recommendation for study {rec.study!r} on {rec.hardware}
# Trains {workload} {preset} (seed {seed}) with it: {launch} this_file.py --steps 1000
{_checkpoint_lines(config, launch)}from __future__ import annotations

import argparse
import os
import sys

import trainers
from trainers import LoopConfig

config = LoopConfig(
{args},
)
WORKLOAD = {workload!r}
PRESET = {preset!r}
MODEL_ARGS = {model_args!r}
SEED = {seed!r}
ARCHITECTURE = {architecture!r}  # trainers.architecture_digest of the model measured
PRECISION = {precision!r}
PROCESSES = {processes!r}  # the processes per node the study measured
CHECKPOINT_EVERY = 500
"""
        + _MAIN
    )


def _checkpoint_lines(config: LoopConfig, launch: str) -> str:
    """The header's checkpoint and resume lines; under FSDP2, that this script takes neither
    (its `--checkpoint` refuses: each rank holds a shard), where it had shown how to use them."""
    if config.parallel == "fsdp2":
        return "# No --checkpoint or --resume here: under parallel=fsdp2 each rank holds a shard.\n"
    run = f"#   {launch} this_file.py --steps"
    return "".join(
        line + "\n"
        for line in (
            "# Checkpoints and resuming: --steps is the total to reach, so a resumed run goes on "
            "to it:",
            f"{run} 1000 --checkpoint 'run-{{step}}.pt'  # run-500.pt, run-1000.pt",
            f"{run} 1000 --resume run-500.pt   # steps 501-1000 again, the same losses",
            f"{run} 2000 --resume run-1000.pt  # 1000 steps more",
        )
    )


def _env_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
