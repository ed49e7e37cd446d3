"""Tuning jobs: a table in the same database as the Optuna storage, and every query on it.

A job is a request to run `tuner.search.search.run_study` on a per-job study (`job-<id>`). Its
row holds the request, the status and what a reader needs without touching Optuna (trial counts,
the best trial so far, the final recommendation), so that `GET /jobs/{id}` and `/best` are one
indexed read. Workers (`tuner.service.worker`) keep those columns up to date as the run goes.

Statuses: queued -> running -> succeeded | failed | cancelled; a running job whose workers all
stopped heartbeating for longer than the lease goes back to queued (or to failed after
`max_attempts` claims, or to cancelled when a cancel was requested), and the last worker of a job
shutting down puts it back to queued itself.

Several workers share a running job (`tuner.service.slots`): the worker that claims it from the
queue measures the baselines and opens it (`stage` "trials"); others join it (`WorkerRow.job_id`,
the job's members) and take trial slots one at a time under the job's slot lock (`slot_lock`, a
guarded UPDATE with an expiry, the same on PostgreSQL and SQLite); the worker that finds every
slot finished claims `finalizer` (stage "finalizing") and alone runs the final round. Members
heartbeat the job row; the job's lease is its heartbeat, whoever wrote it.

Claiming is atomic: one `UPDATE ... WHERE id = (SELECT ... LIMIT 1) RETURNING`. On PostgreSQL the
subquery is `FOR UPDATE SKIP LOCKED`, so concurrent workers skip each other's rows; on SQLite the
statement takes the single writer lock first (the engine waits up to `SQLITE_BUSY_TIMEOUT_S` for
it) and the `status` guard in the WHERE clause makes a lost race a no-op.

Timestamps are naive UTC from the clock of the process that writes them (so worker nodes' clocks
should agree to well within the lease).

This module knows nothing of HTTP.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy import orm

from tuner.errors import JobConflict, JobNotFound, TooManyQueued, TunerError
from tuner.service.spec import JobSpec
from tuner.service.tables import (
    JobRow,
    TrialEventRow,
    WorkerRow,
    create_tables,
    make_engine,
    utcnow,
)
from tuner.store.counting import TrialCounts
from tuner.store.jsonsafe import json_safe
from tuner.store.keys import JOB_STUDY_PREFIX

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
FINISHED = ("succeeded", "failed", "cancelled")


@dataclasses.dataclass(frozen=True)
class Lease:
    owned: bool
    cancel_requested: bool


@dataclasses.dataclass(frozen=True)
class TrialStats:
    by_state: dict[str, int]
    seconds_sum: float
    buckets: list[tuple[float, int]]  # (upper bound, cumulative count); +Inf last


class JobStore:
    """Jobs, workers and trial events in the database at `url` (tables made when missing)."""

    def __init__(self, url: str, *, engine: sa.Engine | None = None) -> None:
        self.url = url
        self.engine = engine or make_engine(url)
        try:
            create_tables(self.engine)
        except sa.exc.ArgumentError as exc:
            raise TunerError(f"storage: {url!r} is not a usable database URL: {exc}") from exc
        except sa.exc.OperationalError as exc:
            raise TunerError(f"storage: cannot open {url!r}: {exc.orig}") from exc
        self._sessions = orm.sessionmaker(self.engine, expire_on_commit=False)
        self._postgres = self.engine.dialect.name == "postgresql"

    def close(self) -> None:
        self.engine.dispose()

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    # -- the API's side ------------------------------------------------------------------
    def create(self, spec: JobSpec, *, owner: str, max_queued: int | None = None) -> JobRow:
        job_id = uuid.uuid4().hex
        now = utcnow()
        values: dict[str, Any] = {
            "id": job_id,
            "owner": owner,
            "status": "queued",
            "workload": spec.workload,
            "preset": spec.preset,
            "device": spec.device,
            "n_trials": spec.n_trials,
            "spec": spec.to_dict(),
            "study": f"{JOB_STUDY_PREFIX}{job_id}",
            "created_at": now,
            "updated_at": now,
            "attempts": 0,
            "cancel_requested": False,
            "n_complete": 0,
            "n_failed": 0,
            "n_pruned": 0,
        }
        # One statement, INSERT ... SELECT ... WHERE (queued jobs of this owner) < max_queued:
        # atomic on SQLite (no read-then-write upgrade to fail on a busy database). On
        # PostgreSQL, concurrent POSTs of one token may pass the limit by their number.
        columns = [JobRow.__table__.c[name] for name in values]
        chosen = sa.select(
            *[sa.literal(v, type_=c.type) for v, c in zip(values.values(), columns, strict=True)]
        )
        if max_queued is not None:
            queued = (
                sa.select(sa.func.count())
                .select_from(JobRow)
                .where(JobRow.owner == owner, JobRow.status == "queued")
                .scalar_subquery()
            )
            chosen = chosen.where(queued < max_queued)
        with self.engine.begin() as conn:
            inserted = conn.execute(
                sa.insert(JobRow).from_select(columns, chosen).returning(JobRow.id)
            ).scalar_one_or_none()
        if inserted is None:
            raise TooManyQueued(
                f"this token already has {max_queued} queued jobs (the limit): "
                "wait for some to start, or cancel some"
            )
        return self.get(job_id)

    def get(self, job_id: str) -> JobRow:
        with self._sessions() as session:
            row = session.get(JobRow, job_id)
        if row is None:
            raise JobNotFound(f"no job with id {job_id!r}")
        return row

    def list(
        self, *, status: str | None = None, limit: int = 50, offset: int = 0
    ) -> tuple[list[JobRow], int]:
        """A page of jobs, newest first, and how many there are in all."""
        where = [] if status is None else [JobRow.status == status]
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

    def cancel(self, job_id: str) -> JobRow:
        """A queued job is cancelled now; a running one is flagged (its worker stops it)."""
        now = utcnow()
        flagged = {"cancel_requested": True, "updated_at": now}
        with self.engine.begin() as conn:  # conditional single statements: no lost updates
            changed = conn.execute(
                sa.update(JobRow)
                .where(JobRow.id == job_id, JobRow.status == "queued")
                .values(status="cancelled", finished_at=now, phase=None, **flagged)
            ).rowcount
            if not changed:
                changed = conn.execute(
                    sa.update(JobRow)
                    .where(JobRow.id == job_id, JobRow.status == "running")
                    .values(**flagged)
                ).rowcount
        row = self.get(job_id)  # JobNotFound for an unknown id
        if not changed:
            raise JobConflict(f"job {job_id!r} is already {row.status}")
        return row

    def counts_by_status(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        with self.engine.connect() as conn:
            for status, count in conn.execute(
                sa.select(JobRow.status, sa.func.count()).group_by(JobRow.status)
            ):
                counts[status] = int(count)
        return counts

    def trial_stats(self, bounds: Sequence[float]) -> TrialStats:
        """Finished trials of all jobs by state, and a histogram of their durations."""
        seconds = TrialEventRow.seconds
        columns: list[Any] = [sa.func.count(), sa.func.coalesce(sa.func.sum(seconds), 0.0)]
        columns += [
            sa.func.coalesce(sa.func.sum(sa.case((seconds <= b, 1), else_=0)), 0) for b in bounds
        ]
        by_state = {"complete": 0, "failed": 0, "pruned": 0}
        with self.engine.connect() as conn:
            for state, count in conn.execute(
                sa.select(TrialEventRow.state, sa.func.count()).group_by(TrialEventRow.state)
            ):
                by_state[state] = int(count)
            total, seconds_sum, *cumulative = conn.execute(sa.select(*columns)).one()
        buckets = [(b, int(c)) for b, c in zip(bounds, cumulative, strict=True)]
        buckets.append((math.inf, int(total)))
        return TrialStats(by_state=by_state, seconds_sum=float(seconds_sum), buckets=buckets)

    def best_for(self, workload: str, preset: str, hardware: str) -> JobRow | None:
        """The finished job with the fastest recommended config for this workload and hardware."""
        with self._sessions() as session:
            return session.scalars(
                sa.select(JobRow)
                .where(
                    JobRow.workload == workload,
                    JobRow.preset == preset,
                    JobRow.hardware == hardware,
                    JobRow.rec_throughput.is_not(None),
                    JobRow.status.in_(FINISHED),
                )
                .order_by(JobRow.rec_throughput.desc())
                .limit(1)
            ).first()

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

    # -- the workers' side ---------------------------------------------------------------
    def requeue_stale(self, *, lease_s: float, max_attempts: int) -> int:
        """Running jobs no member heartbeats any more: back to the queue (or ended).

        Their members lose their membership, so that one of them coming back (say, from a
        network partition) finds it no longer holds the job.
        """
        now = utcnow()
        stale = sa.and_(
            JobRow.status == "running", JobRow.heartbeat_at < now - dt.timedelta(seconds=lease_s)
        )
        lost = "requeued: its workers stopped heartbeating"
        changed = 0
        with self.engine.begin() as conn:
            ids = list(conn.scalars(sa.select(JobRow.id).where(stale)))
            for where, values in (
                (
                    sa.and_(stale, JobRow.cancel_requested),
                    {"status": "cancelled", "finished_at": now},
                ),
                (
                    sa.and_(stale, JobRow.attempts >= max_attempts),
                    {
                        "status": "failed",
                        "finished_at": now,
                        "error": f"its worker was lost {max_attempts} times; not requeued again",
                    },
                ),
                (stale, {"status": "queued", "error": lost}),
            ):
                result = conn.execute(
                    sa.update(JobRow)
                    .where(where)
                    .values(worker=None, phase=None, updated_at=now, **_SHARING_RESET, **values)
                )
                changed += result.rowcount
            if ids:
                conn.execute(
                    sa.update(WorkerRow).where(WorkerRow.job_id.in_(ids)).values(job_id=None)
                )
        return changed

    def claim(self, worker: str, *, devices: Iterable[str]) -> JobRow | None:
        """Atomically take the oldest queued job this worker can run; None when there is none.

        The claiming worker becomes the job's first member.
        """
        now = utcnow()
        candidate = (
            sa.select(JobRow.id)
            .where(JobRow.status == "queued", JobRow.device.in_(list(devices)))
            .order_by(JobRow.created_at, JobRow.id)
            .limit(1)
        )
        if self._postgres:
            candidate = candidate.with_for_update(skip_locked=True)
        statement = (
            sa.update(JobRow)
            .where(JobRow.id == candidate.scalar_subquery(), JobRow.status == "queued")
            .values(
                status="running",
                worker=worker,
                heartbeat_at=now,
                updated_at=now,
                started_at=sa.func.coalesce(JobRow.started_at, now),
                attempts=JobRow.attempts + 1,
                error=None,
                **_SHARING_RESET,
            )
            .returning(JobRow.id)
        )
        with self.engine.begin() as conn:
            claimed = conn.execute(statement).scalar_one_or_none()
            if claimed is not None:
                conn.execute(
                    sa.update(WorkerRow)
                    .where(WorkerRow.id == worker)
                    .values(job_id=claimed, heartbeat_at=now)
                )
        return None if claimed is None else self.get(claimed)

    def open_trials(
        self, job_id: str, worker: str, *, hardware: str, deadline: dt.datetime | None
    ) -> bool:
        """The claimer has opened the study and measured the baselines: others may join now."""
        return self._update_owned(
            job_id, worker, stage="trials", hardware=hardware, deadline_at=deadline
        )

    def joinable(self, *, devices: Iterable[str], hardware: str) -> Sequence[JobRow]:
        """Running jobs open for trials that this worker could measure, oldest first.

        A job is measured on one kind of hardware (its study's fingerprint): CPU jobs on the
        CPU, others on the GPU model of the worker that claimed it.
        """
        same_hardware = sa.or_(
            sa.and_(JobRow.device == "cpu", JobRow.hardware == "cpu"),
            sa.and_(JobRow.device != "cpu", JobRow.hardware == hardware),
        )
        with self._sessions() as session:
            return list(
                session.scalars(
                    sa.select(JobRow)
                    .where(
                        JobRow.status == "running",
                        JobRow.stage == "trials",
                        JobRow.finalizer.is_(None),
                        JobRow.cancel_requested.is_(False),
                        JobRow.device.in_(list(devices)),
                        same_hardware,
                    )
                    .order_by(JobRow.started_at, JobRow.id)
                )
            )

    def join(self, job_id: str, worker: str) -> bool:
        """Become a member of a running job open for trials; False when it no longer is."""
        open_job = (
            sa.select(JobRow.id)
            .where(
                JobRow.id == job_id,
                JobRow.status == "running",
                JobRow.stage == "trials",
                JobRow.finalizer.is_(None),
            )
            .exists()
        )
        with self.engine.begin() as conn:
            return (
                conn.execute(
                    sa.update(WorkerRow)
                    .where(WorkerRow.id == worker, open_job)
                    .values(job_id=job_id, heartbeat_at=utcnow())
                ).rowcount
                == 1
            )

    def leave(self, worker: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.update(WorkerRow).where(WorkerRow.id == worker).values(job_id=None))

    def heartbeat(self, job_id: str, worker: str, *, phase: str | None = None) -> Lease:
        """Heartbeat a job this worker is a member of, and the worker itself."""
        now = utcnow()
        values: dict[str, Any] = {"heartbeat_at": now}
        if phase is not None:
            values["phase"] = phase[:200]
        with self.engine.begin() as conn:
            result = conn.execute(
                sa.update(JobRow)
                .where(
                    JobRow.id == job_id,
                    JobRow.status == "running",
                    self._member(worker, job_id),
                )
                .values(**values)
                .returning(JobRow.cancel_requested)
            )
            flag = result.scalar_one_or_none()
            conn.execute(
                sa.update(WorkerRow).where(WorkerRow.id == worker).values(heartbeat_at=now)
            )
        return Lease(owned=flag is not None, cancel_requested=bool(flag))

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

    def claim_finalizing(self, job_id: str, worker: str) -> bool:
        """Become the one worker that runs the job's final round; False when another is."""
        return self._update_owned(
            job_id,
            worker,
            _extra=(JobRow.finalizer.is_(None),),
            stage="finalizing",
            finalizer=worker,
        )

    def progress(
        self, job_id: str, worker: str, *, counts: TrialCounts, best: dict[str, Any] | None
    ) -> bool:
        """The study's counts (`tuner.store.counting.count_trials`) and best trial, on the row."""
        return self._update_owned(
            job_id,
            worker,
            n_complete=counts.complete,
            n_failed=counts.failed,
            n_pruned=counts.pruned,
            n_interrupted=counts.interrupted,
            best=json_safe(best),
        )

    def finish(
        self,
        job_id: str,
        worker: str,
        status: str,
        *,
        error: str | None = None,
        recommendation: dict[str, Any] | None = None,
    ) -> bool:
        """End a job this worker is a member of; False when it no longer is.

        Once a finalizer runs the final round, only it ends the job (a cancel then waits for the
        round, whose recommendation is kept).
        """
        if status not in FINISHED:
            raise ValueError(f"status={status!r}: allowed {', '.join(FINISHED)}")
        values: dict[str, Any] = {
            "status": status,
            "error": error,
            "finished_at": utcnow(),
            "phase": None,
            **_SHARING_RESET,
        }
        if recommendation is not None:
            rec = json_safe(recommendation)
            throughput = rec.get("throughput") if rec.get("config") is not None else None
            values |= {
                "recommendation": rec,
                "hardware": rec.get("hardware"),
                "rec_throughput": None if not throughput else throughput.get("median"),
            }
        not_finalizing = sa.or_(JobRow.finalizer.is_(None), JobRow.finalizer == worker)
        return self._update_owned(job_id, worker, _extra=(not_finalizing,), **values)

    def requeue(self, job_id: str, worker: str, *, reason: str, lease_s: float) -> bool:
        """Give a job back to the queue when this worker is its last live member (shutdown)."""
        cutoff = utcnow() - dt.timedelta(seconds=lease_s)
        others = (
            sa.select(WorkerRow.id)
            .where(
                WorkerRow.job_id == job_id, WorkerRow.id != worker, WorkerRow.heartbeat_at >= cutoff
            )
            .exists()
        )
        return self._update_owned(
            job_id,
            worker,
            _extra=(~others,),
            status="queued",
            worker=None,
            phase=None,
            error=reason,
            **_SHARING_RESET,
        )

    def record_trial(self, job_id: str, number: int, state: str, seconds: float) -> None:
        """Record a finished trial once (a second call for it is a no-op)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.insert(TrialEventRow).values(
                        job_id=job_id,
                        number=number,
                        state=state,
                        seconds=seconds,
                        finished_at=utcnow(),
                    )
                )
        except sa.exc.IntegrityError:
            pass

    def recorded_trials(self, job_id: str) -> set[int]:
        with self.engine.connect() as conn:
            return set(
                conn.scalars(sa.select(TrialEventRow.number).where(TrialEventRow.job_id == job_id))
            )

    def _member(self, worker: str, job_id: str) -> sa.ColumnElement[bool]:
        return (
            sa.select(WorkerRow.id)
            .where(WorkerRow.id == worker, WorkerRow.job_id == job_id)
            .exists()
        )

    def _update_owned(
        self,
        job_id: str,
        member: str,
        *,
        _extra: Sequence[sa.ColumnElement[bool]] = (),
        **values: Any,
    ) -> bool:
        with self.engine.begin() as conn:
            result = conn.execute(
                sa.update(JobRow)
                .where(
                    JobRow.id == job_id,
                    JobRow.status == "running",
                    self._member(member, job_id),
                    *_extra,
                )
                .values(updated_at=utcnow(), **values)
            )
        return result.rowcount == 1

    # -- workers ---------------------------------------------------------------------------
    def register_worker(self, worker: str, *, host: str, pid: int, device: str) -> None:
        now = utcnow()
        with self.engine.begin() as conn:
            conn.execute(
                sa.insert(WorkerRow).values(
                    id=worker,
                    host=host,
                    pid=pid,
                    device=device,
                    started_at=now,
                    heartbeat_at=now,
                    job_id=None,
                )
            )

    def beat_worker(self, worker: str) -> bool:
        """Heartbeat an idle worker; False when its row is gone (it was taken for dead)."""
        with self.engine.begin() as conn:
            return (
                conn.execute(
                    sa.update(WorkerRow).where(WorkerRow.id == worker).values(heartbeat_at=utcnow())
                ).rowcount
                == 1
            )

    def remove_worker(self, worker: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.delete(WorkerRow).where(WorkerRow.id == worker))

    def live_workers(self, lease_s: float) -> set[str]:
        cutoff = utcnow() - dt.timedelta(seconds=lease_s)
        with self.engine.connect() as conn:
            return set(
                conn.scalars(sa.select(WorkerRow.id).where(WorkerRow.heartbeat_at >= cutoff))
            )

    def forget_dead_workers(self, lease_s: float) -> Sequence[WorkerRow]:
        """Workers whose heartbeat is older than the lease: removed, and what they held freed.

        Returns them (with the job each was in), so that their running trials can be failed.
        A finalizer among them gives its job back to stage "trials", where any member finalizes.
        """
        cutoff = utcnow() - dt.timedelta(seconds=lease_s)
        with self.engine.begin() as conn:
            dead = list(
                conn.execute(
                    sa.delete(WorkerRow)
                    .where(WorkerRow.heartbeat_at < cutoff)
                    .returning(WorkerRow.id, WorkerRow.job_id)
                )
            )
            ids = [row.id for row in dead]
            if ids:
                conn.execute(
                    sa.update(JobRow)
                    .where(JobRow.status == "running", JobRow.finalizer.in_(ids))
                    .values(stage="trials", finalizer=None)
                )
                conn.execute(
                    sa.update(JobRow)
                    .where(JobRow.slot_lock.in_(ids))
                    .values(slot_lock=None, slot_lock_until=None)
                )
        return [WorkerRow(id=row.id, job_id=row.job_id) for row in dead]


# What a claim, a requeue and the end of a job clear: nobody shares the job any more.
_SHARING_RESET: dict[str, Any] = {
    "stage": None,
    "finalizer": None,
    "slot_lock": None,
    "slot_lock_until": None,
}
