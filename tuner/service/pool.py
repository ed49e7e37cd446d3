"""The worker processes of one node: `python -m tuner worker` children, restarted when they die.

`serve` starts one per visible GPU (or one on the CPU, or `--workers N`). `python -m tuner run
--gpus N` starts N for its one job (`tuner.service.node`): each pinned to its GPU through
`CUDA_VISIBLE_DEVICES` (so that nothing it runs, a compile or a child, touches another GPU), its
output in a log file, and not restarted (a worker that exits is done, or broken). They get
`TUNER_PARENT_PID`: when `serve` is gone (even killed), each stops its running trial at the next
window and leaves its job (the job's last live worker puts it back in the queue). On a normal stop
the pool sends them SIGTERM (same effect) and waits.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

import trainers
from tuner.service.leases import visible_name

log = logging.getLogger("tuner.serve")
STOP_GRACE_S = 30.0
RESTART_BACKOFF_S = 5.0


def default_slots(count: int | None) -> list[int | None]:
    """GPU index per worker: one per visible GPU; `count` given: round-robin; no GPU: CPU."""
    gpus = torch.cuda.device_count()
    if count is None:
        count = max(gpus, 1)
    return [i % gpus if gpus else None for i in range(count)]


COMPILE_THREADS_VARIABLE = "TORCHINDUCTOR_COMPILE_THREADS"


def compile_threads_env(workers: int, *, cpus: int, environ: dict[str, str]) -> dict[str, str]:
    """Inductor's compile workers for each of `workers` processes sharing `cpus` cores: an equal
    share (at most Inductor's own cap of 32), unless the user set `TORCHINDUCTOR_COMPILE_THREADS`
    or there is one worker. Inductor gives every process min(32, all cores): four workers of
    `run --gpus 4` compiling their first trials at once ran 128 compile processes on 64 cores.
    On 4 H200s (`llama-1b`, 2026-11-28) the whole-model float8 trial took 107 s there against
    80 s alone, its gate's eager twin 137 s against 93 s; that contention is suspected, not
    measured apart (the split is not measured yet). Empty: leave Inductor's."""
    if workers <= 1 or COMPILE_THREADS_VARIABLE in environ:
        return {}
    return {COMPILE_THREADS_VARIABLE: str(max(1, min(32, cpus // workers)))}


class WorkerPool:
    """Worker child processes, restarted (after a pause) when one dies."""

    def __init__(
        self,
        slots: list[int | None],
        storage: str,
        *,
        job: str | None = None,
        logs: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`job` given: workers of that job alone, pinned, logging to `logs`, with `env` added,
        and not restarted (module doc)."""
        self.slots = slots
        self.storage = storage
        self.job = job
        self.logs = logs
        self.env = env or {}
        self.spawned_at: list[float] = [0.0] * len(slots)
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * len(slots)
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="worker-pool")

    def start(self) -> None:
        for index in range(len(self.slots)):
            self.procs[index] = self._spawn(index)
        if self.slots and self.job is None:
            self._watcher.start()

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        gpu = self.slots[index]
        args = [sys.executable, "-m", "tuner", "worker"]
        # The storage URL through the environment, never the command line: a process list
        # (`ps -ef`) shows every user the arguments, and the URL may carry a password.
        env = os.environ | {"TUNER_PARENT_PID": str(os.getpid()), "TUNER_STORAGE": self.storage}
        env |= compile_threads_env(
            len(self.slots), cpus=trainers.usable_cores(), environ=dict(os.environ)
        )
        output = None
        if self.job is not None:
            args += ["--job", self.job]
            # Pinned: the one GPU is the worker's index 0; a CPU stand-in sees no GPU at all
            # (else it would lease GPU 0, as one worker per node does by default).
            env |= self.env | {"CUDA_VISIBLE_DEVICES": "" if gpu is None else visible_name(gpu)}
            gpu = None if gpu is None else 0
            if self.logs is not None:
                output = (self.logs / f"worker-{index}.log").open("ab")
        if gpu is not None:
            args += ["--gpu", str(gpu)]
        log.info("starting worker %d (%s)", index, "cpu" if gpu is None else f"cuda:{gpu}")
        self.spawned_at[index] = time.monotonic()
        try:
            return subprocess.Popen(
                args, env=env, stdout=output, stderr=subprocess.STDOUT if output else None
            )
        finally:
            if output is not None:
                output.close()  # the child has its own copy

    def _watch(self) -> None:
        while not self._stopping.wait(RESTART_BACKOFF_S):
            for index, proc in enumerate(self.procs):
                if proc is not None and proc.poll() is not None and not self._stopping.is_set():
                    log.warning("worker %d exited with %s; restarting it", index, proc.returncode)
                    self.procs[index] = self._spawn(index)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        self._stopping.set()
        running = [p for p in self.procs if p is not None and p.poll() is None]
        for proc in running:
            proc.terminate()
        deadline = time.monotonic() + grace_s
        for proc in running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
