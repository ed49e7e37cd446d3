"""The job store: the tables of jobs, workers and trial events, in the same database as the
Optuna storage, and every query on them.

`JobStore` is one object over one engine for the callers that want all of it (a test, a script,
`python -m tuner worker` which is both a member and a slot taker). Each client is typed by its own
part, so that what it may do is what it says it needs:

- the API: `tuner.service.submissions.Submissions` (submit, read, list, cancel, counts);
- a worker's membership of jobs: `tuner.service.membership.Membership`;
- the trial slots of a shared job: `tuner.service.slotlocks.SlotLocks`;
- a worker, both of the last two: `WorkerStore`.

This module knows nothing of HTTP.
"""

from __future__ import annotations

from tuner.service.jobtables import FINISHED, STATUSES, JobTables
from tuner.service.membership import Lease, Membership
from tuner.service.slotlocks import SlotLocks
from tuner.service.submissions import Submissions, TrialStats


class WorkerStore(Membership, SlotLocks):
    """A worker's part of the store: its membership of jobs, and the slot locks of shared jobs."""


class JobStore(Submissions, WorkerStore):
    """Jobs, workers and trial events in the database at `url` (tables made when missing)."""


__all__ = [
    "FINISHED",
    "STATUSES",
    "JobStore",
    "JobTables",
    "Lease",
    "Membership",
    "SlotLocks",
    "Submissions",
    "TrialStats",
    "WorkerStore",
]
