"""The workers' side of the job store: claiming, joining and leaving jobs, heartbeats, progress,
the end of a job, and the worker rows.

Statuses: queued -> running -> succeeded | failed | cancelled; a running job whose workers all
stopped heartbeating for longer than the lease goes back to queued (or to failed after
`max_attempts` claims, or to cancelled when a cancel was requested), and the last worker of a job
shutting down puts it back to queued itself.

Several workers share a running job (`tuner.service.slots`): the worker that claims it from the
queue measures the baselines and opens it (`stage` "trials"); others join it (`WorkerRow.job_id`,
the job's members) and take trial slots one at a time under the job's slot lock
(`tuner.service.slotlocks`); the worker that finds every slot finished claims `finalizer` (stage
"finalizing") and alone runs the final round. Members heartbeat the job row; the job's lease is
its heartbeat, whoever wrote it.

Claiming is atomic: one `UPDATE ... WHERE id = (SELECT ... LIMIT 1) RETURNING`. On PostgreSQL the
subquery is `FOR UPDATE SKIP LOCKED`, so concurrent workers skip each other's rows; on SQLite the
statement takes the single writer lock first (the engine waits up to `SQLITE_BUSY_TIMEOUT_S` for
it) and the `status` guard in the WHERE clause makes a lost race a no-op.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from tuner.service.jobtables import FINISHED, SHARING_RESET, JobTables
from tuner.service.tables import JobRow, TrialEventRow, WorkerRow, utcnow
from tuner.store.counting import TrialCounts
from tuner.store.jsonsafe import json_safe


@dataclasses.dataclass(frozen=True)
class Lease:
    owned: bool
    cancel_requested: bool


class Membership(JobTables):
    """What workers do to the job table: membership of jobs, and their own rows."""

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
                    .values(worker=None, phase=None, updated_at=now, **SHARING_RESET, **values)
                )
                changed += result.rowcount
            if ids:
                conn.execute(
                    sa.update(WorkerRow).where(WorkerRow.job_id.in_(ids)).values(job_id=None)
                )
        return changed

    def claim(
        self, worker: str, *, devices: Iterable[str], job: str | None = None
    ) -> JobRow | None:
        """Atomically take the oldest queued job this worker can run; None when there is none.

        The claiming worker becomes the job's first member. `job`: that job only (the workers
        of `python -m tuner run --gpus N` take no other); without it, no dedicated job.
        """
        now = utcnow()
        only = _only(job)
        candidate = (
            sa.select(JobRow.id)
            .where(JobRow.status == "queued", JobRow.device.in_(list(devices)), *only)
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
                **SHARING_RESET,
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

    def joinable(
        self, *, devices: Iterable[str], hardware: str, job: str | None = None
    ) -> Sequence[JobRow]:
        """Running jobs open for trials that this worker could measure, oldest first (`job`:
        that job only).

        A job is measured on one kind of hardware (its study's fingerprint): CPU jobs on the
        CPU, others on the GPU model of the worker that claimed it.
        """
        only = _only(job)
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
                        *only,
                    )
                    .order_by(JobRow.started_at, JobRow.id)
                )
            )

    def join(self, job_id: str, worker: str, *, max_members: int | None = None) -> bool:
        """Become a member of a running job open for trials; False when it no longer is, or
        when it has `max_members` members already (its `gpus`). The count is part of the one
        UPDATE: SQLite's writers take turns; on PostgreSQL two workers joining in the same
        instant may both pass it (one member too many for a while, never a wrong result)."""
        members = (
            sa.select(sa.func.count())
            .select_from(WorkerRow)
            .where(WorkerRow.job_id == job_id)
            .scalar_subquery()
        )
        room = () if max_members is None else (members < max_members,)
        open_job = (
            sa.select(JobRow.id)
            .where(
                JobRow.id == job_id,
                JobRow.status == "running",
                JobRow.stage == "trials",
                JobRow.finalizer.is_(None),
                *room,
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
        self,
        job_id: str,
        worker: str,
        *,
        counts: TrialCounts,
        best: dict[str, Any] | None,
        phase: str | None = None,
    ) -> bool:
        """The study's counts (`tuner.store.counting.count_trials`) and best trial, on the row,
        and the worker's phase with them where given: in one write, so a reader never sees the
        counts of one moment beside the phase of another (the heartbeat alone carried the
        phase, up to `heartbeat_s` after the counts)."""
        more: dict[str, Any] = {} if phase is None else {"phase": phase[:200]}
        return self._update_owned(
            job_id,
            worker,
            n_complete=counts.complete,
            n_failed=counts.failed,
            n_pruned=counts.pruned,
            n_interrupted=counts.interrupted,
            best=json_safe(best),
            **more,
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
            # A cancel asked while the worker decided: cancelled, read in the same statement (a
            # read before it left the moment between for `succeeded`, the review of 2026-12-07).
            "status": (
                sa.case((JobRow.cancel_requested, "cancelled"), else_=status)
                if status == "succeeded"
                else status
            ),
            "error": error,
            "finished_at": utcnow(),
            "phase": None,
            **SHARING_RESET,
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
        """Give a job back to the queue when this worker is its last live member (shutdown).

        Its claim is not counted as an attempt: `max_attempts` bounds the workers lost with a
        job (a crash, a machine gone), and a job handed back by two clean restarts had then
        failed at its first crash ("its worker was lost 3 times")."""
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
            attempts=sa.case((JobRow.attempts > 0, JobRow.attempts - 1), else_=0),
            **SHARING_RESET,
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


def _only(job: str | None) -> tuple[sa.ColumnElement[bool], ...]:
    """The jobs a worker may claim or join: `job` alone for a worker started for it; otherwise
    any but a dedicated job (`JobRow.dedicated`: a `run --gpus N` job, measured with its own
    flags by its own workers, which a service worker's settings would mix into its study)."""
    if job is not None:
        return (JobRow.id == job,)
    return (JobRow.dedicated.is_not(True),)
