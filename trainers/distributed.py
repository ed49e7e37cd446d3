"""One process of a data-parallel run: what torchrun starts on every rank.

    python -m torch.distributed.run --standalone --nproc-per-node N \\
        -m trainers.distributed --workload transformer --preset tiny [--model-arg k=v] [--gate]

`trainers.program.run_distributed` builds that command; the settings and the run's shape come
in the program protocol's variables (`STREAMTUNE_*`, `trainers.program.protocol`), the same on
every rank. Each rank:
1. writes its stderr to its own file and its pid beside it (`STREAMTUNE_RANK_DIR`), so that a
   failed rank's own tail can be quoted and a rank left behind can be found and killed;
2. starts the process group: NCCL on GPUs (rank r on `cuda:K+LOCAL_RANK` for a launch from
   `cuda:K`), gloo on a CPU, with
   the collective timeout `STREAMTUNE_DIST_TIMEOUT` (a rank that hangs fails the others there);
3. builds the workload from the seed (every rank the same weights and the same global batches)
   and trains it with `trainers.run` under the config: the loop core wraps the model in DDP or
   FSDP2 and feeds each rank its shard of every global batch (`trainers.parallel`);
4. gathers every rank's losses and a digest of its parameters. The ranks agree when they
   trained the same number of steps and, under DDP, ended with identical replicas; otherwise
   rank 0 fails the run, naming the rank that differs. The loss reported for a step is the mean
   of the ranks' losses: with equal shards, the loss of the global batch.

Rank 0 alone reports: the start line (the global batch), each timed window as it ends (timed on
rank 0 with a device sync at both ends; every step's collectives keep the ranks in step), the
losses, and the end line with `world_size`, `rank_losses` and `replicas` ("identical" for DDP,
"sharded" for FSDP2). `--gate` runs as the correctness gate's trajectories do: dropout off,
deterministic kernels (warn-only: an op without a deterministic kernel must not fail one rank).

`STREAMTUNE_DIST_FAULT=kill:RANK:WINDOW` (or `hang:`) plants a fault: that rank kills itself
with SIGKILL (or sleeps forever) after that timed window. The tests use it to prove that a lost
rank fails the trial cleanly; it is never set otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainers.config import LoopConfig
from trainers.core import min_warmup
from trainers.errors import ConfigError, TrainerError
from trainers.gate.trajectories import deterministic
from trainers.loop import run
from trainers.measure import RunResult, Window
from trainers.parallel import parameter_digest
from trainers.precision import set_matmul_precision
from trainers.program.reporting import Reporter
from trainers.program.torchrun import (
    DEFAULT_TIMEOUT_S,
    FAULT_VARIABLE,
    MATMUL_VARIABLE,
    NCCL_ENV,
    RANK_DIR_VARIABLE,
    TIMEOUT_VARIABLE,
)
from trainers.runargs import RunArgs
from trainers.workloads import Workload, disable_dropout, load_workload


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainers.distributed")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--preset", required=True)
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--gate", action="store_true", help="dropout off, deterministic kernels")
    parser.add_argument(
        "--trace",
        metavar="PATH",
        help="rank 0 records its third of three timed windows with torch.profiler into PATH "
        "(a Chrome trace: the tuner's profile of a data-parallel config)",
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="CONFIG_JSON",
        help="with --gate: another config's trajectory, trained after the first in this launch",
    )
    return parser.parse_args(argv)


def _own_stderr(folder: Path, rank: int) -> None:
    """Send this rank's stderr (fd 2: Python's and C++'s) to `folder/rank<r>.stderr`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank{rank}.pid").write_text(str(os.getpid()), encoding="utf-8")
    handle = os.open(folder / f"rank{rank}.stderr", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(handle, 2)
    os.close(handle)


def _device(asked: str, local_rank: int) -> torch.device:
    """Rank r's device: with `cuda:K` asked, `cuda:(K + LOCAL_RANK)` (a launch from GPU 2 of 4
    processes uses GPUs 2-5 of those visible); else the CPU."""
    first = torch.device(asked)
    if first.type == "cuda":
        device = torch.device("cuda", (first.index or 0) + local_rank)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _start_group(device: torch.device) -> None:
    for name, value in NCCL_ENV.items():
        os.environ.setdefault(name, value)
    timeout = float(os.environ.get(TIMEOUT_VARIABLE) or DEFAULT_TIMEOUT_S)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        timeout=datetime.timedelta(seconds=timeout),
        device_id=device if device.type == "cuda" else None,
    )


def _fault(rank: int) -> tuple[str, int] | None:
    """The planted fault for this rank: (kind, after which window), or None."""
    raw = os.environ.get(FAULT_VARIABLE)
    if not raw:
        return None
    kind, target, window = raw.split(":")
    if kind not in ("kill", "hang"):
        raise ConfigError(FAULT_VARIABLE, raw, "kill:RANK:WINDOW or hang:RANK:WINDOW")
    return (kind, int(window)) if int(target) == rank else None


def _strike(fault: tuple[str, int] | None, index: int) -> None:
    if fault is None or fault[1] != index:
        return
    if fault[0] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # hang: the other ranks wait for this one in their next collective
        time.sleep(60)


def agreement(
    gathered: Sequence[dict[str, Any]], config: LoopConfig
) -> tuple[list[float], str | None]:
    """The global losses (each step's mean over the ranks) and why the ranks disagree (None:
    they agree). `gathered[r]` holds rank r's `losses` and parameter `digest`."""
    first = gathered[0]
    for rank, other in enumerate(gathered[1:], start=1):
        if len(other["losses"]) != len(first["losses"]):
            return [], (
                f"rank {rank} trained {len(other['losses'])} steps, rank 0 {len(first['losses'])}"
            )
        # DDP's replicas apply the same averaged gradients: they stay identical, bit for bit.
        if config.parallel == "ddp" and other["digest"] != first["digest"]:
            pairs = zip(other["digest"], first["digest"], strict=True)
            index = next(i for i, (a, b) in enumerate(pairs) if a != b)
            return [], (
                f"rank {rank}'s parameters differ from rank 0's after training (parameter "
                f"{index}: sum {other['digest'][index]!r} against {first['digest'][index]!r})"
            )
    columns = zip(*(g["losses"] for g in gathered), strict=True)
    return [math.fsum(step) / len(gathered) for step in columns], None


@contextlib.contextmanager
def _profiled(path: str | None, device: torch.device) -> Iterator[Callable[[], None]]:
    """With a `path`, torch.profiler over the run, stepped after each timed window: it waits
    over the first, warms up over the second, records the third (as `tuner.evidence.trace`
    profiles one process) and writes the Chrome trace to `path`. Yields the step function."""
    if path is None:
        yield lambda: None
        return
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(
        activities=activities,
        on_trace_ready=lambda prof: prof.export_chrome_trace(path),
        schedule=schedule(wait=1, warmup=1, active=1, repeat=1),
    ) as prof:
        yield prof.step


def _check_world(config: LoopConfig) -> None:
    world = dist.get_world_size()
    if world > 1 and config.parallel == "none":
        raise ConfigError(
            "parallel",
            "none",
            f"'ddp' or 'fsdp2' with {world} processes (alone, each would "
            "train its own model on its shard)",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Shape:
    """The steps of one training run of this launch."""

    warmup: int
    steps: int
    windows: int


def _train(
    args: argparse.Namespace,
    reporter: Reporter,
    config: LoopConfig,
    shape: _Shape,
    device: torch.device,
    on_window: Callable[[int, Window], bool] | None = None,
    on_built: Callable[[Workload], None] | None = None,
) -> tuple[RunResult, torch.nn.Module]:
    """Build the workload afresh (every rank the same weights) and train it under `config`;
    `on_built(workload)` is called before the first step."""
    _check_world(config)
    model_args = dict(item.split("=", 1) for item in args.model_arg)
    workload = load_workload(
        args.workload, reporter.preset, seed=reporter.seed, model_args=model_args
    )
    if args.gate:
        disable_dropout(workload.model)
    reporter.perturb(workload.model)
    if on_built is not None:
        on_built(workload)
    with deterministic(strict=False) if args.gate else contextlib.nullcontext():
        run_args = RunArgs(
            steps=shape.steps,
            warmup=shape.warmup,
            windows=shape.windows,
            device=device,
            precision=reporter.precision,  # type: ignore[arg-type]  # run() checks it
        )
        result = run(workload, config, run_args, on_window=on_window)
    return result, workload.model


def _gathered(
    result: RunResult, model: torch.nn.Module, config: LoopConfig, rank: int
) -> tuple[list[float], list[list[float]]]:
    """Every rank's losses and digest gathered (a collective); on rank 0 the global losses and
    the ranks' own (TrainerError naming the rank that disagrees), elsewhere empty lists."""
    world = dist.get_world_size()
    mine = {"rank": rank, "losses": list(result.losses), "digest": parameter_digest(model)}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    if rank != 0:
        return [], []
    losses, disagreement = agreement(gathered, config)
    if disagreement is not None:
        raise TrainerError(f"the {world} ranks disagree: {disagreement}")
    return losses, [g["losses"] for g in gathered]


def _also(
    args: argparse.Namespace, reporter: Reporter, rank: int, device: torch.device
) -> list[dict[str, Any]]:
    """The gate's trajectories of the `--also` configs, each as long as the first run's (its
    own untimed steps included), in this same launch: their losses, on rank 0."""
    total = reporter.warmup + reporter.steps
    found = []
    for raw in args.also:
        config = LoopConfig.from_dict(json.loads(raw))
        warmup = min_warmup(config)
        shape = _Shape(warmup=warmup, steps=max(1, total - warmup), windows=1)
        result, model = _train(args, reporter, config, shape, device)
        losses, _ = _gathered(result, model, config, rank)
        found.append({"config": config.to_dict(), "losses": losses})
    return found


def _run_rank(
    args: argparse.Namespace, reporter: Reporter, rank: int, device: torch.device
) -> None:
    """The launch's run under the reported config (rank 0 reports its windows as they end),
    the `--also` trajectories, then rank 0's losses and end line."""
    config = reporter.config
    fault = _fault(rank)

    def started(workload: Workload) -> None:
        if rank == 0:
            reporter.start(
                samples_per_batch=workload.samples_per_batch,
                tokens_per_sample=workload.tokens_per_sample,
            )

    def on_window(index: int, window: Window) -> bool:
        if rank == 0:
            reporter.window_seconds(index, window.steps, window.wall_ms / 1e3)
        _strike(fault, index)
        return True

    shape = _Shape(warmup=reporter.warmup, steps=reporter.steps, windows=reporter.windows)
    with _profiled(args.trace if rank == 0 else None, device) as next_window:

        def window_then_profile(index: int, window: Window) -> bool:
            on_window(index, window)
            next_window()
            return True

        result, model = _train(args, reporter, config, shape, device, window_then_profile, started)
    losses, rank_losses = _gathered(result, model, config, rank)
    also = _also(args, reporter, rank, device)
    if rank != 0:
        return
    reporter.losses(0, losses)
    reporter.end(
        n_syncs=result.n_syncs,
        n_polls=result.n_polls,
        sync_wait_ms=result.sync_wait_ms,
        peak_memory_bytes=result.peak_memory_bytes,
        # The model FLOPs of one rank's step: the count is of the global batch, of which each
        # rank trains an equal shard, so a rank's MFU is its share over one GPU's peak.
        flops_per_step=None
        if result.flops_per_step is None
        else result.flops_per_step // dist.get_world_size(),
        world_size=dist.get_world_size(),
        rank_losses=rank_losses,
        replicas="identical" if config.parallel == "ddp" else "sharded",
        backend=dist.get_backend(),
        also=also,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    folder = os.environ.get(RANK_DIR_VARIABLE)
    if folder:
        _own_stderr(Path(folder), rank)
    reporter = Reporter.from_env()
    if os.environ.get(MATMUL_VARIABLE):
        set_matmul_precision(os.environ[MATMUL_VARIABLE])  # the launching process's
    device = _device(reporter.device, local_rank)
    _start_group(device)
    try:
        _run_rank(args, reporter, rank, device)
    finally:
        # Every rank leaves the group, a failed one too: NCCL's communicators are freed.
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything is reported and the group is destroyed: leave without the interpreter's
    # teardown, in which FSDP2 over gloo aborted ("terminate called without an active
    # exception", SIGABRT) in 1 of 6 runs of transformer tiny on a CPU (torch 2.13).
    os._exit(code)
