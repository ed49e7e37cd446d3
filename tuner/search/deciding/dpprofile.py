"""Profiles of a study of N > 1 processes: the config run under torchrun as its trials are, rank 0
recording its third of three timed windows with torch.profiler (`trainers.distributed --trace`),
the trace analysed here like a one-process profile (`tuner.evidence.trace.profile_from_trace`).

Rank 0's trace holds its NCCL kernels beside its compute kernels, so the profile carries the
share of communication the step left exposed (`tuner.evidence.comm`), and the verdict says it.
Only on GPUs: over gloo on a CPU the collectives run on host threads, with no kernel to overlap,
and the profile would only repeat the measurement.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import torch

import trainers
from trainers import LoopConfig
from trainers.program import run_distributed
from tuner.evidence.trace import Profile, profile_from_trace


class DataParallelProfiler:
    """A `tuner.search.deciding.profiling.Profiler` for configs of `nproc` processes."""

    def __init__(
        self,
        workload: str,
        preset: str,
        *,
        nproc: int,
        steps: int,
        warmup: int,
        seed: int,
        device: torch.device,
        matmul_precision: str,
        model_args: Mapping[str, str] | None = None,
        precision: trainers.Precision | None = None,
    ) -> None:
        self.workload = workload
        self.preset = preset
        self.nproc = nproc
        self.steps = steps
        self.warmup = warmup
        self.seed = seed
        self.device = device
        self.matmul_precision = matmul_precision
        self.model_args = dict(model_args or {})
        self.precision = precision

    def __call__(self, config: LoopConfig) -> Profile:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="streamtune-dpprofile-") as folder:
            path = Path(folder) / "trace.json"
            result = run_distributed(
                self.workload,
                self.preset,
                config,
                trainers.RunArgs(
                    steps=3 * self.steps,
                    # Graph capture and compilation stay out of the recorded window.
                    warmup=max(self.warmup, trainers.min_warmup(config)),
                    windows=3,
                    device=self.device,
                    precision=self.precision,
                    seed=self.seed,
                ),
                nproc=self.nproc,
                model_args=self.model_args,
                matmul_precision=self.matmul_precision,
                trace=path,
            )
            raw = path.read_bytes()
        return profile_from_trace(
            raw, result, config, self.device, steps=self.steps, started=started
        )
