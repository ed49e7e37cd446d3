"""The job tables' connection, shared by the three clients of the job store.

`JobTables` opens the database at a URL (tables made when missing) and reads one job; the clients
build on it, one class each (`tuner.service.jobstore` composes them over one engine):

- `tuner.service.submissions.Submissions`: the API's side (submit, read, list, cancel, counts);
- `tuner.service.membership.Membership`: the workers' side (claim, join, heartbeat, progress,
  finish, requeue, the worker rows);
- `tuner.service.slotlocks.SlotLocks`: the lock a shared job's trial slots are taken under.

Timestamps are naive UTC from the clock of the process that writes them (so worker nodes' clocks
should agree to well within the lease). This module knows nothing of HTTP.
"""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa
from sqlalchemy import orm

from tuner.errors import JobNotFound, named
from tuner.service.tables import JobRow, create_tables, make_engine
from tuner.store.storage import check_sqlite_path, check_url, normalise_url, storage_errors

JOB_ID = re.compile(r"[0-9a-f]{32}")  # uuid4().hex, what `Submissions.create` gives a job
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
FINISHED = ("succeeded", "failed", "cancelled")

# What a claim, a requeue and the end of a job clear: nobody shares the job any more.
SHARING_RESET: dict[str, Any] = {
    "stage": None,
    "finalizer": None,
    "slot_lock": None,
    "slot_lock_until": None,
}


class JobTables:
    """The engine and sessions of the job tables at `url` (tables made when missing)."""

    def __init__(self, url: str, *, engine: sa.Engine | None = None) -> None:
        url = normalise_url(url)
        self.url = url
        if engine is None:
            check_url(url)  # a bare path is told its sqlite:/// URL
            check_sqlite_path(url)  # a missing folder is told to be made, as `tuner run` says
        with storage_errors(url):  # as the Optuna storage says it: one line naming --storage
            self.engine = engine or make_engine(url)
            create_tables(self.engine)
        self._sessions = orm.sessionmaker(self.engine, expire_on_commit=False)
        self._postgres = self.engine.dialect.name == "postgresql"

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    def get(self, job_id: str) -> JobRow:
        """The job; JobNotFound for an unknown id (one that is not 32 hexadecimal digits never
        reaches the database, which may not be able to hold it: PostgreSQL refuses NUL)."""
        if not JOB_ID.fullmatch(job_id):
            raise JobNotFound(
                f"no job with id {named(job_id)}: ids are 32 lower-case hexadecimal digits, as "
                "the job's links give them"
            )
        with self._sessions() as session:
            row = session.get(JobRow, job_id)
        if row is None:
            raise JobNotFound(f"no job with id {job_id!r}")
        return row
