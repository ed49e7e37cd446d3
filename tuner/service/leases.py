"""GPU leases: one row per GPU in the database, so that two processes never measure on one GPU.

A GPU worker (`python -m tuner worker --gpu N`) acquires the lease of its GPU before it claims
any job, heartbeats it with its other heartbeats, and deletes it when it stops. A lease whose
heartbeat is older than `lease_s` belongs to a worker that died (SIGKILL, a lost node): the next
worker for that GPU takes it over. A live lease makes the new worker refuse to start with
`GpuBusy`, naming the GPU, the holder and its host.

A lease is keyed by the GPU's UUID (`GPU-...`, as `nvidia-smi -L` prints it), which is the same
whatever index and host name the process sees: in containers every worker sees its one GPU as
index 0 and has a host name of its own, and two containers given the same GPU still share one
lease. Where torch reports no UUID the key falls back to `<host>/cuda:<index>`, with the host
from `socket.gethostname()` or `TUNER_HOST`, and the index as `CUDA_VISIBLE_DEVICES` names it
where that is set: `run --gpus N` pins each worker to one GPU, which each then sees as index 0.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os

import sqlalchemy as sa
import torch

from tuner.errors import GpuBusy
from tuner.service.jobtables import JobTables
from tuner.service.tables import GpuLeaseRow, utcnow


def gpu_uuid(index: int) -> str | None:
    """The UUID of visible CUDA device `index` as `nvidia-smi -L` prints it, or None if unknown."""
    return uuid_key(getattr(torch.cuda.get_device_properties(index), "uuid", None))


def uuid_key(uuid: object) -> str | None:
    """torch's device UUID ('58bd3d2b-...') as nvidia-smi prints it ('GPU-58bd3d2b-...').

    None for a missing or all-zero UUID (some builds and virtual devices report zeros).
    """
    text = "" if uuid is None else str(uuid).strip()
    if not text.replace("GPU-", "").strip("0-"):
        return None
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def visible_name(index: int) -> str:
    """How the node names visible CUDA device `index`: its `CUDA_VISIBLE_DEVICES` entry where
    that is set (a pinned process sees its one GPU as 0), else the index itself."""
    entries = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e]
    return entries[index] if index < len(entries) else str(index)


@dataclasses.dataclass(frozen=True)
class GpuLease:
    """The lease of GPU `gpu` (the index this process sees) of `host`, with its UUID if known."""

    store: JobTables
    host: str
    gpu: int
    worker: str
    pid: int
    uuid: str | None = None

    @property
    def key(self) -> str:
        return self.uuid or f"{self.host}/cuda:{visible_name(self.gpu)}"

    def acquire(self, *, lease_s: float) -> None:
        """Take the lease: free, or stale (its holder's heartbeat older than `lease_s`)."""
        now = utcnow()
        values = {
            "host": self.host,
            "gpu": self.gpu,
            "worker": self.worker,
            "pid": self.pid,
            "acquired_at": now,
            "heartbeat_at": now,
        }
        try:
            with self.store.engine.begin() as conn:
                conn.execute(sa.insert(GpuLeaseRow).values(device=self.key, **values))
            return
        except sa.exc.IntegrityError:
            pass
        mine = GpuLeaseRow.device == self.key
        stale = GpuLeaseRow.heartbeat_at < now - dt.timedelta(seconds=lease_s)
        with self.store.engine.begin() as conn:
            taken = conn.execute(
                sa.update(GpuLeaseRow)
                .where(mine, sa.or_(stale, GpuLeaseRow.worker == self.worker))
                .values(**values)
            ).rowcount
            holder = conn.execute(sa.select(GpuLeaseRow).where(mine)).one_or_none()
        if taken == 1:
            return
        if holder is None:  # released between the two statements: try once more
            return self.acquire(lease_s=lease_s)
        age = (now - holder.heartbeat_at).total_seconds()
        raise GpuBusy(
            f"--gpu: GPU {self.gpu} ({self.key}) is leased by worker {holder.worker} on host "
            f"{holder.host!r} (pid {holder.pid}, its GPU {holder.gpu}, heartbeat {age:.0f} s "
            f"ago); two workers must not measure on one GPU: stop that one, or wait until its "
            f"heartbeat is {lease_s:.0f} s old"
        )

    def beat(self) -> bool:
        """Heartbeat the lease; False when another worker has taken it over."""
        with self.store.engine.begin() as conn:
            return (
                conn.execute(
                    sa.update(GpuLeaseRow)
                    .where(
                        GpuLeaseRow.device == self.key,
                        GpuLeaseRow.worker == self.worker,
                    )
                    .values(heartbeat_at=utcnow())
                ).rowcount
                == 1
            )

    def release(self) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(
                sa.delete(GpuLeaseRow).where(
                    GpuLeaseRow.device == self.key, GpuLeaseRow.worker == self.worker
                )
            )
