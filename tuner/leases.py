"""GPU leases: one row per (host, GPU index) in the database, so that two processes never measure
on the same GPU.

A GPU worker (`python -m tuner worker --gpu N`) acquires the lease of its GPU before it claims
any job, heartbeats it with its other heartbeats, and deletes it when it stops. A lease whose
heartbeat is older than `lease_s` belongs to a worker that died (SIGKILL, a lost node): the next
worker for that GPU takes it over. A live lease makes the new worker refuse to start with
`GpuBusy`, naming the host, the GPU and the holder.

The host is `socket.gethostname()` unless `TUNER_HOST` names it: in containers, each gets its own
host name, so workers of one node must be given the node's name to share these leases.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import sqlalchemy as sa

from tuner.errors import TunerError
from tuner.jobs import GpuLeaseRow, JobStore, utcnow


class GpuBusy(TunerError):
    """Another live worker holds the lease of this GPU."""


@dataclasses.dataclass(frozen=True)
class GpuLease:
    store: JobStore
    host: str
    gpu: int
    worker: str
    pid: int

    def acquire(self, *, lease_s: float) -> None:
        """Take the lease: free, or stale (its holder's heartbeat older than `lease_s`)."""
        now = utcnow()
        key = (GpuLeaseRow.host == self.host, GpuLeaseRow.gpu == self.gpu)
        values = {"worker": self.worker, "pid": self.pid, "acquired_at": now, "heartbeat_at": now}
        try:
            with self.store.engine.begin() as conn:
                conn.execute(sa.insert(GpuLeaseRow).values(host=self.host, gpu=self.gpu,
                                                           **values))
            return
        except sa.exc.IntegrityError:
            pass
        stale = GpuLeaseRow.heartbeat_at < now - dt.timedelta(seconds=lease_s)
        with self.store.engine.begin() as conn:
            taken = conn.execute(sa.update(GpuLeaseRow).where(
                *key, sa.or_(stale, GpuLeaseRow.worker == self.worker)).values(**values)).rowcount
            holder = conn.execute(sa.select(GpuLeaseRow).where(*key)).one_or_none()
        if taken == 1:
            return
        if holder is None:  # released between the two statements: try once more
            return self.acquire(lease_s=lease_s)
        age = (now - holder.heartbeat_at).total_seconds()
        raise GpuBusy(
            f"--gpu: GPU {self.gpu} of host {self.host!r} is leased by worker "
            f"{holder.worker} (pid {holder.pid}, heartbeat {age:.0f} s "
            f"ago); two workers must not measure on one GPU: stop that one, or wait until its "
            f"heartbeat is {lease_s:.0f} s old")

    def beat(self) -> bool:
        """Heartbeat the lease; False when another worker has taken it over."""
        with self.store.engine.begin() as conn:
            return conn.execute(sa.update(GpuLeaseRow).where(
                GpuLeaseRow.host == self.host, GpuLeaseRow.gpu == self.gpu,
                GpuLeaseRow.worker == self.worker).values(heartbeat_at=utcnow())).rowcount == 1

    def release(self) -> None:
        with self.store.engine.begin() as conn:
            conn.execute(sa.delete(GpuLeaseRow).where(
                GpuLeaseRow.host == self.host, GpuLeaseRow.gpu == self.gpu,
                GpuLeaseRow.worker == self.worker))
