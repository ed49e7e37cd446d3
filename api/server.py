"""`python -m tuner serve`: the API under uvicorn, and worker processes on this node.

Workers are `python -m tuner worker` child processes (one per visible GPU, or one on the CPU, or
`--workers N`, or none with `--no-worker`), restarted when they die. They get `TUNER_PARENT_PID`:
when `serve` is gone (even killed), each stops its running trial at the next window and leaves
its job (the job's last live worker puts it back in the queue). On a normal stop `serve` sends
them SIGTERM (same effect) and waits.
"""

from __future__ import annotations

import gc
import ipaddress
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pydantic
import torch
import uvicorn

from api.app import create_app
from api.settings import ApiSettings
from tuner.errors import TunerError

log = logging.getLogger("tuner.serve")
STOP_GRACE_S = 30.0
RESTART_BACKOFF_S = 5.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_exposure(host: str, settings: ApiSettings) -> None:
    """Refuse to serve beyond this machine without tokens: anyone could then run jobs."""
    if not settings.api_tokens and not is_loopback(host):
        raise TunerError(
            f"--host: refusing to serve on {host!r} without TUNER_API_TOKENS: anyone who can "
            "reach the port could submit and cancel jobs. Set TUNER_API_TOKENS (comma separated "
            "bearer tokens) or serve on 127.0.0.1.")


def load_settings(storage: str | None = None) -> ApiSettings:
    """The settings (`storage` overrides TUNER_STORAGE); a bad variable is reported by name."""
    try:
        settings = ApiSettings()
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        raise TunerError(f"TUNER_{str(first['loc'][0]).upper()}: {first['msg']}") from exc
    return settings if storage is None else settings.model_copy(update={"storage": storage})


def default_slots(count: int | None) -> list[int | None]:
    """GPU index per worker: one per visible GPU; `count` given: round-robin; no GPU: CPU."""
    gpus = torch.cuda.device_count()
    if count is None:
        count = max(gpus, 1)
    return [i % gpus if gpus else None for i in range(count)]


class WorkerPool:
    """Worker child processes, restarted (after a pause) when one dies."""

    def __init__(self, slots: list[int | None], storage: str) -> None:
        self.slots = slots
        self.storage = storage
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * len(slots)
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="worker-pool")

    def start(self) -> None:
        for index in range(len(self.slots)):
            self.procs[index] = self._spawn(index)
        if self.slots:
            self._watcher.start()

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        gpu = self.slots[index]
        args = [sys.executable, "-m", "tuner", "worker", "--storage", self.storage]
        if gpu is not None:
            args += ["--gpu", str(gpu)]
        env = os.environ | {"TUNER_PARENT_PID": str(os.getpid())}
        log.info("starting worker %d (%s)", index, "cpu" if gpu is None else f"cuda:{gpu}")
        return subprocess.Popen(args, env=env)

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


def serve(*, host: str, port: int, workers: int | None, no_worker: bool,
          storage: str | None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = load_settings(storage=storage)
    check_exposure(host, settings)
    app = create_app(settings)
    if workers is None:
        workers = settings.workers
    pool = WorkerPool([] if no_worker else default_slots(workers), settings.storage)
    # uvicorn shuts down on SIGTERM/SIGINT, then raises the signal again under the handlers it
    # found: these, which end `serve` normally, so that the workers are stopped and waited for.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    pool.start()
    # Everything imported so far (torch, optuna: ~300k objects) lives as long as the process:
    # out of the collector's sight, a full collection takes microseconds instead of ~140 ms,
    # which would otherwise be a latency spike every few thousand requests.
    gc.collect()
    gc.freeze()
    try:
        uvicorn.run(app, host=host, port=port, access_log=settings.access_log,
                    log_level="info")
    except _Stopping:
        pass
    finally:
        pool.stop()


class _Stopping(Exception):
    """SIGTERM or SIGINT reached `serve`."""


def _stop(signum: int, _frame: object) -> None:
    raise _Stopping(signum)
