"""The slot lock of a shared job: a guarded UPDATE of the job row with an expiry, the same on
PostgreSQL and SQLite (`tuner.service.slots` takes trial slots under it)."""

from __future__ import annotations

import datetime as dt
import random
import threading
import time

import sqlalchemy as sa

from tuner.service.jobtables import JobTables
from tuner.service.tables import JobRow, utcnow

LOCK_WAIT_S = (0.02, 0.1)  # a wait for the slot lock, drawn uniformly: no two workers in step


class SlotLocks(JobTables):
    """Take and give back a running job's slot lock."""

    def lock_slots(self, job_id: str, worker: str, *, hold_s: float) -> bool:
        """Take the job's slot lock (free, or expired); False when another worker holds it."""
        now = utcnow()
        with self.engine.begin() as conn:
            return (
                conn.execute(
                    sa.update(JobRow)
                    .where(
                        JobRow.id == job_id,
                        JobRow.status == "running",
                        sa.or_(
                            JobRow.slot_lock.is_(None),
                            JobRow.slot_lock == worker,
                            JobRow.slot_lock_until < now,
                        ),
                    )
                    .values(slot_lock=worker, slot_lock_until=now + dt.timedelta(seconds=hold_s))
                ).rowcount
                == 1
            )

    def wait_for_slots(
        self,
        job_id: str,
        worker: str,
        *,
        hold_s: float,
        stop: threading.Event,
        within_s: float | None = None,
    ) -> bool:
        """Take the slot lock, waiting while another worker holds it; False once `stop` is set
        or `within_s` seconds (None: no limit) have passed without it."""
        deadline = None if within_s is None else time.monotonic() + within_s
        while not self.lock_slots(job_id, worker, hold_s=hold_s):
            if deadline is not None and time.monotonic() > deadline:
                return False
            if stop.wait(random.uniform(*LOCK_WAIT_S)):
                return False
        return True

    def finalizing(self, job_id: str) -> bool:
        """Whether a worker has claimed the job's final round (`Membership.claim_finalizing`):
        no trial slot is taken after that (`JobSlots`)."""
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(JobRow.finalizer).where(JobRow.id == job_id)).scalar()
        return found is not None

    def unlock_slots(self, job_id: str, worker: str) -> bool:
        """Give the slot lock back; False when it expired and another worker took it."""
        with self.engine.begin() as conn:
            return (
                conn.execute(
                    sa.update(JobRow)
                    .where(
                        JobRow.id == job_id,
                        JobRow.slot_lock == worker,
                    )
                    .values(slot_lock=None, slot_lock_until=None)
                ).rowcount
                == 1
            )
