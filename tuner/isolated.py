"""Parity checks in a separate process, so that they cannot change the measurements.

`check_parity` switches PyTorch to deterministic kernels and sets `CUBLAS_WORKSPACE_CONFIG`. Both
are process-wide, and measured on an H100 they outlast the check: eager steps of transformer
`small` went from 14 to 21-23 ms and `medium` from 31 to 43-50 ms after one parity check in the
same process (docs/benchmarks/README.md, "Parity in its own process"). So the tuner runs every
parity check in one long-lived child process (spawned, not forked: CUDA cannot be forked), one at
a time, while the measuring process waits: two measurements never share the GPU.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
from typing import Any

import trainers
from trainers import LoopConfig


def _losses(workload: str, preset: str, config: dict[str, Any], steps: int, seed: int,
            device: str, matmul_precision: str) -> list[float]:
    import torch  # in the child

    # A spawned child defaults to spawning its own children too, which would make every
    # DataLoader worker import torch again (about 1 s each on a CPU); the training process
    # forks them, so the check does the same.
    if "fork" in multiprocessing.get_all_start_methods():
        multiprocessing.set_start_method("fork", force=True)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts here
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    torch.set_float32_matmul_precision(matmul_precision)
    return trainers.parity_losses(workload, preset, LoopConfig.from_dict(config), steps=steps,
                                  seed=seed, device=device)


class ParityProcess:
    """Runs `trainers.parity_losses` in a child process and compares in this one."""

    def __init__(self, workload: str, preset: str, *, steps: int, seed: int, device: str,
                 matmul_precision: str) -> None:
        self.workload = workload
        self.preset = preset
        self.steps = steps
        self.seed = seed
        self.device = device
        self.matmul_precision = matmul_precision
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._reference: list[float] | None = None

    def _run(self, config: LoopConfig) -> list[float]:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        future = self._pool.submit(_losses, self.workload, self.preset, config.to_dict(),
                                   self.steps, self.seed, self.device, self.matmul_precision)
        return future.result()

    def check(self, config: LoopConfig) -> trainers.ParityVerdict:
        if self._reference is None:
            self._reference = self._run(trainers.REFERENCE)
        losses = self._run(config)
        return trainers.parity.compare(losses, self._reference, exact=not config.cuda_graph,
                                       tolerance=trainers.GRAPH_RTOL)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
