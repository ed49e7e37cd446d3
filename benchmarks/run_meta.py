"""Where a benchmark ran, as every result file records it, and the file name that says so."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

import trainers


def run_meta(
    device: torch.device, script: str, argv: Sequence[str], commit: str
) -> tuple[dict[str, Any], str]:
    """The `meta` block (GPU, driver, CUDA, torch, commit, date, command) and the
    `<gpu>-<date>` part of the result's file name, such as `h100-2026-11-23`."""
    fp = trainers.fingerprint(device)
    date = dt.date.today().isoformat()
    meta = {
        "gpu": fp["gpu"] or "CPU",
        "driver": fp["driver"],
        "cuda": fp["cuda"],
        "torch": fp["torch"],
        # The host: compiles are CPU-bound (every compile of one job took 1.5x on one H200 host
        # against another, whose CPUs were not recorded: docs/benchmarks/README.md, 2026-12-05).
        "cpu": fp["cpu"],
        "cpus": os.cpu_count(),
        "load_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "commit": commit,
        "date": date,
        "command": f"python benchmarks/{script} " + " ".join(argv),
    }
    gpu = (fp["gpu"] or "cpu").lower().replace("nvidia ", "").split()[0]
    return meta, f"{gpu}-{date}"


def write_record(
    out: Path, name: str, data: dict[str, Any], markdown: Callable[[dict[str, Any]], str]
) -> None:
    """The record `name` in `out`: `name.json` (`data`, whose `meta` is told its file's name)
    and its Markdown twin `name.md`, which is also printed."""
    data["meta"]["file"] = f"{name}.json"
    text = markdown(data)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    (out / f"{name}.md").write_text(text)
    print(text)


def provenance(meta: Mapping[str, Any], *, also: str = "") -> str:
    """The Markdown twin's sentence of where and from what it was measured (`also`: more of the
    stack, such as "NCCL 2.28.9", after the torch version)."""
    stack = f"Driver {meta['driver']}, CUDA {meta['cuda']}, torch {meta['torch']}"
    if meta.get("cpu"):  # records before 2026-12-05 lack the host
        stack += f", host {meta['cpu']} x {meta.get('cpus')}"
    return (
        f"{stack}{f', {also}' if also else ''}, commit `{meta['commit']}`, {meta['date']}. "
        f"Generated from `{meta['file']}`; command: `{meta['command']}`."
    )


def job_parser(doc: str, *, presets: str, rounds: int) -> argparse.ArgumentParser:
    """The arguments of a script that runs default jobs and compares their picks interleaved
    (`node.py`, `time_to_answer.py`): the presets, the jobs' precisions and extra arguments, the
    interleaved rounds' protocol, and where the record goes. `--commit` defaults to
    $STREAMTUNE_COMMIT: on a lent machine give the literal commit, for git there names the last
    commit that landed, not the tree that was copied."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--presets", default=presets, help="WORKLOAD:PRESET,...")
    parser.add_argument("--precisions", default=None, help="the jobs' --precisions")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--protocol", default="4,4,10", help="WARMUP,WINDOWS,WINDOW_STEPS")
    parser.add_argument("--job-arg", action="append", default=[], help="passed to both jobs")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per job")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    return parser


def model_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments of a script that runs one model's configs itself (`compile_reuse.py`,
    `kept_turns.py`): the workload, preset and model arguments, the precision, the config
    (`key=value,...` over the defaults), and where the record goes (`--commit` as in
    `job_parser`)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--workload", default="hf:causal-lm")
    parser.add_argument("--preset", default="llama-1b")
    parser.add_argument("--model-arg", action="append", default=[])
    parser.add_argument("--precision", default="float8")
    parser.add_argument("--config", default="compile=default,optimizer=fused")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    return parser


def write_model_record(
    args: argparse.Namespace,
    script: str,
    kind: str,
    measured: Mapping[str, Any],
    markdown: Callable[[dict[str, Any]], str],
) -> None:
    """`measured` with its `meta` written as `<kind>-<gpu>-<date>[-tag]` (JSON and Markdown) for
    a script of `model_parser`'s arguments."""
    meta, stem = run_meta(trainers.resolve_device(args.device), script, sys.argv[1:], args.commit)
    name = f"{kind}-{stem}{f'-{args.tag}' if args.tag else ''}"
    write_record(args.out, name, {"meta": meta, **measured}, markdown)
