"""GPU leases (tuner/leases.py): a live lease refuses a second worker, a dead one's is taken over.

The holder is another process (it is SIGKILLed); the database an SQLite file, as on a single
node. The same with real `python -m tuner worker --gpu 0` processes needs a GPU (marked `gpu`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.tuner.tiny import sqlite_url
from tuner.jobs import JobStore
from tuner.leases import GpuBusy, GpuLease

ROOT = Path(__file__).resolve().parents[2]
# Children find this checkout first, and whatever else this process was given (a --target site).
CHILD_PYTHONPATH = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
LEASE_S = 1.5
HOLDER = """
import sys, time
from tuner.jobs import JobStore
from tuner.leases import GpuLease
lease = GpuLease(JobStore(sys.argv[1]), "node-a", 0, "holder", 1)
lease.acquire(lease_s=float(sys.argv[2]))
print("held", flush=True)
while lease.beat():
    time.sleep(0.2)
"""


def _holder(storage: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, storage, str(LEASE_S)], cwd=ROOT,
                            env=os.environ | {"PYTHONPATH": CHILD_PYTHONPATH},
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_lease_refuses_and_a_dead_ones_is_taken_over(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    store = JobStore(storage)
    holder = _holder(storage)
    second = GpuLease(store, "node-a", 0, "second", os.getpid())
    try:
        time.sleep(LEASE_S + 0.5)  # older than a lease, but heartbeated: still alive
        with pytest.raises(GpuBusy, match=r"GPU 0 of host 'node-a' is leased by worker holder"):
            second.acquire(lease_s=LEASE_S)
        GpuLease(store, "node-a", 1, "second", os.getpid()).acquire(lease_s=LEASE_S)  # other GPU
        GpuLease(store, "node-b", 0, "third", os.getpid()).acquire(lease_s=LEASE_S)  # other host
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        with pytest.raises(GpuBusy):  # its last heartbeat is younger than a lease yet
            second.acquire(lease_s=LEASE_S)
        time.sleep(LEASE_S + 0.2)
        second.acquire(lease_s=LEASE_S)
        assert second.beat()
        assert not GpuLease(store, "node-a", 0, "holder", 1).beat()  # the holder lost it
        second.release()
        GpuLease(store, "node-a", 0, "fourth", os.getpid()).acquire(lease_s=LEASE_S)  # freed
    finally:
        if holder.poll() is None:
            holder.kill()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_second_worker_on_one_gpu_refuses_to_start(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    env = os.environ | {"PYTHONPATH": CHILD_PYTHONPATH, "TUNER_LEASE_S": str(LEASE_S),
                        "TUNER_HEARTBEAT_S": "0.2", "TUNER_POLL_S": "0.2"}
    args = [sys.executable, "-m", "tuner", "worker", "--storage", storage, "--gpu", "0"]
    first = subprocess.Popen(args, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not JobStore(storage).live_workers(LEASE_S) and time.monotonic() < deadline:
            time.sleep(0.2)
        refused = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                                 timeout=120, check=False)
        assert refused.returncode == 2
        assert refused.stderr.strip().splitlines()[-1].startswith("error: --gpu: GPU 0 of host")
        first.send_signal(signal.SIGKILL)
        first.wait()
        time.sleep(LEASE_S + 0.5)
        taker = subprocess.Popen(args, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        time.sleep(10)
        assert taker.poll() is None  # it took the stale lease over and runs
        taker.send_signal(signal.SIGTERM)
        assert taker.wait(timeout=60) == 0
    finally:
        for proc in (first,):
            if proc.poll() is None:
                proc.kill()
