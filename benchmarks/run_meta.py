"""Where a benchmark ran, as every result file records it, and the file name that says so."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
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
        "commit": commit,
        "date": date,
        "command": f"python benchmarks/{script} " + " ".join(argv),
    }
    gpu = (fp["gpu"] or "cpu").lower().replace("nvidia ", "").split()[0]
    return meta, f"{gpu}-{date}"


def provenance(meta: Mapping[str, Any], *, also: str = "") -> str:
    """The Markdown twin's sentence of where and from what it was measured (`also`: more of the
    stack, such as "NCCL 2.28.9", after the torch version)."""
    stack = f"Driver {meta['driver']}, CUDA {meta['cuda']}, torch {meta['torch']}"
    return (
        f"{stack}{f', {also}' if also else ''}, commit `{meta['commit']}`, {meta['date']}. "
        f"Generated from `{meta['file']}`; command: `{meta['command']}`."
    )
