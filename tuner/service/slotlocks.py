"""The slot lock of a shared job: a guarded UPDATE of the job row with an expiry, the same on
PostgreSQL and SQLite (`tuner.service.slots` takes trial slots under it)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from tuner.service.jobtables import JobTables
from tuner.service.tables import JobRow, utcnow


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
