"""The `python -m tuner` commands. Thin: parse flags, call the library, print."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

import trainers
from tuner import render

app = typer.Typer(
    help="streamtune: measure and tune the concurrency settings of PyTorch training loops.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# LoopConfig fields and run arguments -> the flag a user typed.
FLAGS = {
    "num_streams": "--streams",
    "sync_interval": "--sync-interval",
    "sync_mode": "--sync-mode",
    "prefetch_depth": "--prefetch-depth",
    "pin_memory": "--pin-memory",
    "non_blocking": "--non-blocking",
    "num_workers": "--num-workers",
    "cuda_graph": "--cuda-graph",
    "steps": "--steps",
    "warmup": "--warmup",
    "windows": "--windows",
    "device": "--device",
    "workload": "--workload",
    "preset": "--preset",
}


@app.callback()
def _root() -> None:
    """streamtune: measure and tune the concurrency settings of PyTorch training loops."""


def flag_error(exc: Exception) -> str | None:
    """A one-line message for a known input error, naming the flag; None for anything else."""
    if isinstance(exc, trainers.ConfigError):
        return f"{FLAGS.get(exc.field, exc.field)}: {exc}"
    if isinstance(exc, trainers.WorkloadError):
        flag = FLAGS.get(exc.field or "", "--workload")
        return f"{flag}: {exc}"
    if isinstance(exc, trainers.UnsupportedOnDevice | trainers.CaptureError):
        return str(exc)
    return None


Workload = Annotated[str, typer.Option(
    help="A built-in workload (transformer, mlp, convnet) or package.module:factory.")]
Preset = Annotated[str, typer.Option(help="Workload size: tiny, small, medium, large.")]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:INDEX.")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a summary.")]


@app.command()
def train(
    workload: Workload = "transformer",
    preset: Preset = "tiny",
    streams: Annotated[int, typer.Option(help="1-4 CUDA streams (see LoopConfig).")] = 1,
    sync_interval: Annotated[int, typer.Option(help="Host syncs every N steps.")] = 1,
    sync_mode: Annotated[str, typer.Option(help="synchronize, event or query.")] = "synchronize",
    prefetch_depth: Annotated[int, typer.Option(help="Batches copied ahead, 0-4.")] = 0,
    pin_memory: Annotated[bool, typer.Option(help="Page-locked batches.")] = False,
    non_blocking: Annotated[bool, typer.Option(help="Asynchronous H2D copies.")] = False,
    num_workers: Annotated[int, typer.Option(help="DataLoader workers.")] = 0,
    cuda_graph: Annotated[bool, typer.Option(help="Capture the step in a CUDA graph.")] = False,
    steps: Annotated[int, typer.Option(help="Measured steps.")] = 50,
    warmup: Annotated[int, typer.Option(help="Untimed steps first.")] = 10,
    windows: Annotated[int, typer.Option(help="Timed windows the steps are split into.")] = 5,
    device: Device = "auto",
    seed: Annotated[int, typer.Option(help="Seed of the weights and the data.")] = 0,
    as_json: AsJson = False,
) -> None:
    """Run one measured training run and print its RunResult."""
    config = trainers.LoopConfig(
        num_streams=streams,
        sync_interval=sync_interval,
        sync_mode=sync_mode,  # type: ignore[arg-type]  # validated by LoopConfig
        prefetch_depth=prefetch_depth,
        pin_memory=pin_memory,
        non_blocking=non_blocking,
        num_workers=num_workers,
        cuda_graph=cuda_graph,
    )
    dev = trainers.resolve_device(device)
    built = trainers.load_workload(workload, preset, seed=seed)
    result = trainers.run(built, config, steps=steps, warmup=warmup, windows=windows, device=dev)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        render.run_summary(Console(), result)
