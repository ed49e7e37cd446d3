"""The API's side of the job store: submit a job, read, list and cancel jobs, and the counts
that `/metrics` and `/healthz` show.

A job is a request to run a tuning study on a per-job study (`job-<id>`). Its row holds the
request, the status and what a reader needs without touching Optuna (trial counts, the best trial
so far, the final recommendation), so that `GET /jobs/{id}` and `/best` are one indexed read.
Workers (`tuner.service.membership`) keep those columns up to date as the run goes.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import math
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

import trainers
from tuner.errors import JobConflict, JobNotFound, TooManyQueued
from tuner.service.jobtables import FINISHED, SHARING_RESET, STATUSES, JobTables
from tuner.service.owners import Owner
from tuner.service.spec import JobSpec
from tuner.service.tables import JobRow, TrialEventRow, WorkerRow, job_devices, utcnow
from tuner.store.keys import JOB_STUDY_PREFIX
from tuner.store.retry import retry_conflicts


@dataclasses.dataclass(frozen=True)
class TrialStats:
    by_state: dict[str, int]
    seconds_sum: float
    buckets: list[tuple[float, int]]  # (upper bound, cumulative count); +Inf last


def _lock_key(owner: str) -> int:
    """A signed 64-bit key of an owner's advisory lock (PostgreSQL's lock keys are bigints)."""
    digest = hashlib.sha256(f"streamtune-queue:{owner}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _visible(by: Owner | None) -> list[sa.ColumnElement[bool]]:
    """The WHERE clause of the jobs `by` may see: its own (by any of its names), or every job."""
    return [] if by is None or by.admin else [JobRow.owner.in_(by.names)]


class Submissions(JobTables):
    """What the API does to jobs (and reads of the worker rows for the health check).

    Reads and cancels take the caller (`by`, an `Owner`): another owner's job is not found, as if
    it did not exist. `by=None` is the operator's view (scripts, tests): every job.
    """

    def create(
        self,
        spec: JobSpec,
        *,
        owner: Owner | str,
        max_queued: int | None = None,
        dedicated: bool = False,
    ) -> JobRow:
        """Queue a job stored under `owner`'s name; TooManyQueued when it has `max_queued`.
        `dedicated`: only workers started for this job (`worker --job ID`) claim or join it."""
        owner = owner if isinstance(owner, Owner) else Owner(name=owner)
        job_id = uuid.uuid4().hex
        values = _new_row(job_id, spec, owner) | {"dedicated": dedicated}
        # One statement, INSERT ... SELECT ... WHERE (queued jobs of this owner) < max_queued:
        # atomic on SQLite, whose writers take the one database lock in turn (no read-then-write
        # upgrade to fail on a busy database). On PostgreSQL each statement counts in its own
        # snapshot (READ COMMITTED), so concurrent creates of one owner would all see the same
        # count: a transaction-scoped advisory lock per owner serialises them, and each counts
        # after the previous one committed.
        # By attribute name (the mapper's): `trials` is stored in the column `n_trials`.
        columns = [JobRow.__mapper__.columns[name] for name in values]
        chosen = sa.select(
            *[sa.literal(v, type_=c.type) for v, c in zip(values.values(), columns, strict=True)]
        )
        if max_queued is not None:
            queued = (
                sa.select(sa.func.count())
                .select_from(JobRow)
                .where(JobRow.owner.in_(owner.names), JobRow.status == "queued")
                .scalar_subquery()
            )
            chosen = chosen.where(queued < max_queued)

        # The engine pins READ COMMITTED (tuner.store.retry.POSTGRES_ISOLATION): under a higher
        # level the snapshot would predate the lock. A transaction that lost a race anyway (a
        # serialization failure, a deadlock) is run again, never shown to the client.
        def insert() -> str | None:
            with self.engine.begin() as conn:
                if self._postgres and max_queued is not None:
                    # Held until this transaction ends (commit or rollback): no unlock to forget.
                    conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_lock_key(owner.name))))
                found: str | None = conn.execute(
                    sa.insert(JobRow).from_select(columns, chosen).returning(JobRow.id)
                ).scalar_one_or_none()
                return found

        inserted = retry_conflicts(insert)
        if inserted is None:
            raise TooManyQueued(
                f"this token already has {max_queued} queued jobs (the limit): "
                "wait for some to start, or cancel some"
            )
        return self.get(job_id)

    def job(self, job_id: str, *, by: Owner | None) -> JobRow:
        """The job, if `by` may see it; JobNotFound otherwise, worded as for an unknown id."""
        row = self.get(job_id)
        if by is not None and not by.owns(row.owner):
            raise JobNotFound(f"no job with id {job_id!r}")
        return row

    def list(
        self,
        *,
        status: str | None = None,
        limit: int = 50,
        offset: int = 0,
        by: Owner | None = None,
    ) -> tuple[list[JobRow], int]:
        """A page of the jobs `by` may see, newest first, and how many there are in all."""
        where = _visible(by) + ([] if status is None else [JobRow.status == status])
        with self._sessions() as session:
            total = session.scalar(sa.select(sa.func.count()).select_from(JobRow).where(*where))
            rows = session.scalars(
                sa.select(JobRow)
                .where(*where)
                .order_by(JobRow.created_at.desc(), JobRow.id)
                .limit(limit)
                .offset(offset)
            ).all()
        return list(rows), int(total or 0)

    def cancel(
        self, job_id: str, *, by: Owner | None = None, lease_s: float | None = None
    ) -> JobRow:
        """A queued job is cancelled now; a running one is flagged (its worker stops it), or
        cancelled now where it is orphaned (`orphaned`, given the workers' `lease_s`): a worker
        killed outright had left the cancel waiting until another worker started (a probe,
        2026-12-07)."""
        now = utcnow()
        flagged = {"cancel_requested": True, "updated_at": now}
        ended = {"status": "cancelled", "finished_at": now, "phase": None, **flagged}
        self.get(job_id)  # JobNotFound for an id that is none (before it reaches the database)
        mine = [JobRow.id == job_id, *_visible(by)]

        def update() -> int:
            with self.engine.begin() as conn:  # conditional single statements: no lost updates
                done = conn.execute(
                    sa.update(JobRow).where(*mine, JobRow.status == "queued").values(**ended)
                ).rowcount
                if not done and lease_s is not None:
                    done = conn.execute(
                        sa.update(JobRow)
                        .where(*mine, *orphaned(lease_s, now))
                        .values(worker=None, **SHARING_RESET, **ended)
                    ).rowcount
                    if done:  # its members' rows, as `requeue_stale` leaves them
                        conn.execute(
                            sa.update(WorkerRow)
                            .where(WorkerRow.job_id == job_id)
                            .values(job_id=None)
                        )
                if not done:
                    done = conn.execute(
                        sa.update(JobRow).where(*mine, JobRow.status == "running").values(**flagged)
                    ).rowcount
                return int(done)

        changed = retry_conflicts(update)
        row = self.job(job_id, by=by)  # JobNotFound for an unknown id, or another's job
        if not changed:
            raise JobConflict(f"job {job_id!r} is already {row.status}")
        return row

    def counts_by_status(self, *, by: Owner | None = None) -> dict[str, int]:
        """The jobs `by` may see (an admin, or `None`: all), by status."""
        counts = dict.fromkeys(STATUSES, 0)
        with self.engine.connect() as conn:
            for status, count in conn.execute(
                sa.select(JobRow.status, sa.func.count())
                .where(*_visible(by))
                .group_by(JobRow.status)
            ):
                counts[status] = int(count)
        return counts

    def trial_stats(self, bounds: Sequence[float], *, by: Owner | None = None) -> TrialStats:
        """Finished trials of the jobs `by` may see (an admin, or `None`: all) by state, and a
        histogram of their durations."""
        seconds = TrialEventRow.seconds
        columns: list[Any] = [sa.func.count(), sa.func.coalesce(sa.func.sum(seconds), 0.0)]
        columns += [
            sa.func.coalesce(sa.func.sum(sa.case((seconds <= b, 1), else_=0)), 0) for b in bounds
        ]
        visible = _visible(by)
        # An owner's trials are those of its jobs: the event rows name the job, not the owner.
        mine = [TrialEventRow.job_id.in_(sa.select(JobRow.id).where(*visible))] if visible else []
        by_state = {"complete": 0, "failed": 0, "pruned": 0, "interrupted": 0}
        with self.engine.connect() as conn:
            for state, count in conn.execute(
                sa.select(TrialEventRow.state, sa.func.count())
                .where(*mine)
                .group_by(TrialEventRow.state)
            ):
                by_state[state] = int(count)
            total, seconds_sum, *cumulative = conn.execute(
                sa.select(*columns).select_from(TrialEventRow).where(*mine)
            ).one()
        buckets = [(b, int(c)) for b, c in zip(bounds, cumulative, strict=True)]
        buckets.append((math.inf, int(total)))
        return TrialStats(by_state=by_state, seconds_sum=float(seconds_sum), buckets=buckets)

    def best_for(
        self,
        workload: str,
        preset: str,
        hardware: str,
        *,
        by: Owner | None = None,
        model_args: dict[str, str] | None = None,
        precision: str | None = None,
    ) -> JobRow | None:
        """Of the finished jobs `by` may see, the one with the fastest recommended config for
        this workload, its shape and hardware. The shape is the library model's effective
        options (`trainers.workload_key`: the preset's unless `model_args` say otherwise): a job
        of batch 32 had answered for one of batch 4, its throughput not comparable.
        `precision`: only a config that trains in it (the recommendation's `precision`).
        WorkloadError for `model_args` the workload does not take."""
        wanted = trainers.workload_key(workload, preset, model_args)
        with self._sessions() as session:
            rows = session.scalars(
                sa.select(JobRow)
                .where(
                    *_visible(by),
                    JobRow.workload == workload,
                    JobRow.preset == preset,
                    # As the GPU's name is written in any case ("CPU", "nvidia h100"): it had
                    # found no job for `gpu=CPU` (a probe, 2026-12-07).
                    sa.func.lower(JobRow.hardware) == hardware.lower(),
                    JobRow.rec_throughput.is_not(None),
                    JobRow.status.in_(FINISHED),
                )
                .order_by(JobRow.rec_throughput.desc())
            )
            return next(
                (
                    row
                    for row in rows
                    if _shape_of(row) == wanted
                    and (
                        precision is None
                        or (row.recommendation or {}).get("precision") == precision
                    )
                ),
                None,
            )

    def studies(self, *, by: Owner | None) -> set[str] | None:
        """The studies of the jobs `by` may see; None: every study of the storage (an admin's, and
        the operator's view, which includes `python -m tuner run`'s studies)."""
        if by is None or by.admin:
            return None
        with self.engine.connect() as conn:
            return set(conn.scalars(sa.select(JobRow.study).where(*_visible(by))))

    def workloads_of(self, studies: Sequence[str]) -> dict[str, str]:
        """The workload each of `studies` that a job made was asked for by name (a plug-in's
        registered name, not the factory path the study's worker ran): study -> name."""
        if not studies:
            return {}
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(JobRow.study, JobRow.workload).where(JobRow.study.in_(list(studies)))
            )
            return {study: workload for study, workload in rows}

    def job_of_study(self, study: str) -> tuple[str, str] | None:
        """The id and status of the latest job that made `study`; None: no job made it."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(JobRow.id, JobRow.status)
                .where(JobRow.study == study)
                .order_by(JobRow.created_at.desc())
                .limit(1)
            ).first()
        return None if row is None else (row[0], row[1])

    def offered_devices(self, lease_s: float) -> set[str] | None:
        """The job devices some live worker runs (`job_devices`); None: no worker is alive."""
        cutoff = utcnow() - dt.timedelta(seconds=lease_s)
        with self.engine.connect() as conn:
            found = set(
                conn.scalars(
                    sa.select(WorkerRow.device).where(WorkerRow.heartbeat_at >= cutoff).distinct()
                )
            )
        return set().union(*(job_devices(d) for d in found)) if found else None

    def workers_alive(self, lease_s: float) -> int:
        cutoff = utcnow() - dt.timedelta(seconds=lease_s)
        with self.engine.connect() as conn:
            return int(
                conn.scalar(
                    sa.select(sa.func.count())
                    .select_from(WorkerRow)
                    .where(WorkerRow.heartbeat_at >= cutoff)
                )
                or 0
            )


ORPHANED_LEASES = 2
"""A running job is orphaned when no worker has heartbeated it, nor is alive as its member, for
this many leases: twice the workers' own rule (`Membership.requeue_stale`), as the API's clock is
not the workers' and cannot tell a database outage, which stops every heartbeat, from a kill."""


def orphaned(lease_s: float, now: dt.datetime) -> list[Any]:
    """Conditions on `JobRow` of a running job its workers have left (killed outright, say):
    not heartbeated for `ORPHANED_LEASES` leases, no finalizer (one running the final round
    alone ends the job, keeping its recommendation), and no live worker its member."""
    cutoff = now - dt.timedelta(seconds=ORPHANED_LEASES * lease_s)
    live_member = sa.exists().where(WorkerRow.job_id == JobRow.id, WorkerRow.heartbeat_at >= cutoff)
    return [
        JobRow.status == "running",
        JobRow.heartbeat_at < cutoff,
        JobRow.finalizer.is_(None),
        ~live_member,
    ]


def _new_row(job_id: str, spec: JobSpec, owner: Owner) -> dict[str, Any]:
    """The column values of a job just queued."""
    now = utcnow()
    return {
        "id": job_id,
        "owner": owner.name,
        "status": "queued",
        "workload": spec.workload,
        "preset": spec.preset,
        "device": spec.device,
        "trials": spec.trials,
        "spec": spec.to_stored(),
        "study": f"{JOB_STUDY_PREFIX}{job_id}",
        "created_at": now,
        "updated_at": now,
        "attempts": 0,
        "cancel_requested": False,
        "n_complete": 0,
        "n_failed": 0,
        "n_pruned": 0,
    }


def _shape_of(row: JobRow) -> str | None:
    """The workload key of a job's model (`trainers.workload_key`), None where its stored
    options no longer name one (a family's option since removed)."""
    model_args = (row.spec or {}).get("model_args") or {}
    try:
        return trainers.workload_key(row.workload, row.preset, model_args)
    except trainers.WorkloadError:
        return None
