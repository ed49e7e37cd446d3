"""GPU leases (tuner/leases.py): a live lease refuses a second worker, a dead one's is taken over.

The holder is another process (it is SIGKILLed); the database an SQLite file, as on a single
node. Leases are keyed by GPU UUID where one is known (containers see their GPU as index 0 under
host names of their own), else by host and index. The same with real
`python -m tuner worker --gpu 0` processes needs a GPU (marked `gpu`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import sqlalchemy.orm
import torch

from tests.tuner.tiny import sqlite_url
from tuner.service.jobstore import JobStore
from tuner.service.leases import GpuBusy, GpuLease, gpu_uuid, uuid_key
from tuner.service.tables import GpuLeaseRow

ROOT = Path(__file__).resolve().parents[3]
# Children find this checkout first, and whatever else this process was given (a --target site).
CHILD_PYTHONPATH = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
LEASE_S = 1.5
HOLDER = """
import sys, time
from tuner.service.jobstore import JobStore
from tuner.service.leases import GpuLease
lease = GpuLease(JobStore(sys.argv[1]), "node-a", 0, "holder", 1, sys.argv[3] or None)
lease.acquire(lease_s=float(sys.argv[2]))
print("held", flush=True)
while lease.beat():
    time.sleep(0.2)
"""


def _holder(storage: str, uuid: str | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, storage, str(LEASE_S), uuid or ""],
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": CHILD_PYTHONPATH},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_lease_refuses_and_a_dead_ones_is_taken_over(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    store = JobStore(storage)
    holder = _holder(storage)
    second = GpuLease(store, "node-a", 0, "second", os.getpid())
    try:
        time.sleep(LEASE_S + 0.5)  # older than a lease, but heartbeated: still alive
        with pytest.raises(
            GpuBusy,
            match=r"GPU 0 \(node-a/cuda:0\) is leased by worker holder "
            r"on host 'node-a'",
        ):
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


def test_leases_are_keyed_by_gpu_uuid_whatever_host_and_index_a_worker_sees(tmp_path: Path) -> None:
    """Two containers given one GPU: other host names, both index 0, one UUID: one lease."""
    storage = sqlite_url(tmp_path)
    store = JobStore(storage)
    gpu_a, gpu_b = (
        "GPU-8a1f0c2e-0000-4000-8000-00000000000a",
        "GPU-8a1f0c2e-0000-4000-8000-00000000000b",
    )
    holder = _holder(storage, gpu_a)
    try:
        with pytest.raises(
            GpuBusy,
            match=rf"GPU 3 \({gpu_a}\) is leased by worker holder on "
            r"host 'node-a' \(pid 1, its GPU 0,",
        ):
            GpuLease(store, "container-7f3", 3, "second", os.getpid(), gpu_a).acquire(
                lease_s=LEASE_S
            )
        # The same host and index but another UUID is another GPU (another container's).
        other = GpuLease(store, "node-a", 0, "third", os.getpid(), gpu_b)
        other.acquire(lease_s=LEASE_S)
        assert other.beat()
        # Without a UUID, host and index are the key, and do not collide with UUID keys.
        GpuLease(store, "node-a", 0, "fourth", os.getpid()).acquire(lease_s=LEASE_S)
        assert {row.device for row in _lease_rows(store)} == {gpu_a, gpu_b, "node-a/cuda:0"}
        other.release()
        assert {row.device for row in _lease_rows(store)} == {gpu_a, "node-a/cuda:0"}
    finally:
        holder.kill()
        holder.wait()


def _lease_rows(store: JobStore) -> list[GpuLeaseRow]:
    with sa.orm.Session(store.engine) as session:
        return list(session.scalars(sa.select(GpuLeaseRow)))


def test_torch_uuids_are_keyed_as_nvidia_smi_prints_them() -> None:
    assert uuid_key("58bd3d2b-1c2a-4b7e-9f00-3a8e0d7c6b21") == (
        "GPU-58bd3d2b-1c2a-4b7e-9f00-3a8e0d7c6b21"
    )
    assert uuid_key("GPU-58bd3d2b-1c2a-4b7e-9f00-3a8e0d7c6b21") == (
        "GPU-58bd3d2b-1c2a-4b7e-9f00-3a8e0d7c6b21"
    )
    assert uuid_key("MIG-1234-abcd") == "MIG-1234-abcd"
    assert uuid_key(None) is None
    assert uuid_key("00000000-0000-0000-0000-000000000000") is None
    assert uuid_key("GPU-00000000-0000-0000-0000-000000000000") is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gpu_uuid_on_a_gpu_matches_nvidia_smi() -> None:
    if os.environ.get("CUDA_VISIBLE_DEVICES"):
        pytest.skip("CUDA_VISIBLE_DEVICES hides GPUs that nvidia-smi lists")
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # As sets: CUDA orders devices fastest first, nvidia-smi by PCI bus.
    assert {gpu_uuid(i) for i in range(torch.cuda.device_count())} == set(listed)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_second_worker_on_one_gpu_refuses_to_start(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    env = os.environ | {
        "PYTHONPATH": CHILD_PYTHONPATH,
        "TUNER_LEASE_S": str(LEASE_S),
        "TUNER_HEARTBEAT_S": "0.2",
        "TUNER_POLL_S": "0.2",
    }
    args = [sys.executable, "-m", "tuner", "worker", "--storage", storage, "--gpu", "0"]
    first = subprocess.Popen(args, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not JobStore(storage).live_workers(LEASE_S) and time.monotonic() < deadline:
            time.sleep(0.2)
        refused = subprocess.run(
            args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert refused.returncode == 2
        assert (
            refused.stderr.strip()
            .splitlines()[-1]
            .startswith(f"error: --gpu: GPU 0 ({gpu_uuid(0)}) is leased by worker")
        )
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
