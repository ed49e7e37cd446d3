"""The service's tables, in the same database as the Optuna storage, and the engine to reach them.

`create_tables` makes the tables and the columns missing (all added columns are nullable, so a
database made by an earlier version keeps its rows: `ALTER TABLE ... ADD COLUMN`).
Timestamps are naive UTC (`utcnow`) from the clock of the process that writes them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy import orm
from sqlalchemy.orm import Mapped, mapped_column

from tuner.store.retry import POSTGRES_ISOLATION, lost_create_race

SQLITE_BUSY_TIMEOUT_S = 30


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def job_devices(worker_device: str) -> tuple[str, ...]:
    """The job devices a worker on `worker_device` ("cpu" or "cuda:INDEX") runs: a job on
    `cuda:INDEX` is its GPU's alone; "auto" and "cpu" any worker's."""
    if worker_device == "cpu":
        return ("auto", "cpu")
    return ("auto", "cpu", "cuda", worker_device)


class Base(orm.DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "streamtune_jobs"
    __table_args__ = (sa.Index("ix_streamtune_jobs_status_created", "status", "created_at"),)

    id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(sa.String(64), index=True)
    status: Mapped[str] = mapped_column(sa.String(16))
    workload: Mapped[str] = mapped_column(sa.String(128))
    preset: Mapped[str] = mapped_column(sa.String(64))
    device: Mapped[str] = mapped_column(sa.String(8))
    # The trials the job asks for (`JobSpec.trials`); the column kept its first name, so
    # tables made before the rename read on without a migration.
    trials: Mapped[int] = mapped_column("n_trials")
    spec: Mapped[dict[str, Any]] = mapped_column(sa.JSON)
    study: Mapped[str] = mapped_column(sa.String(64))
    created_at: Mapped[dt.datetime]
    updated_at: Mapped[dt.datetime]
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    heartbeat_at: Mapped[dt.datetime | None]
    worker: Mapped[str | None] = mapped_column(sa.String(128))
    attempts: Mapped[int] = mapped_column(default=0)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    phase: Mapped[str | None] = mapped_column(sa.String(200))
    error: Mapped[str | None] = mapped_column(sa.Text)
    n_complete: Mapped[int] = mapped_column(default=0)
    n_failed: Mapped[int] = mapped_column(default=0)
    n_pruned: Mapped[int] = mapped_column(default=0)
    best: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    recommendation: Mapped[dict[str, Any] | None] = mapped_column(sa.JSON)
    hardware: Mapped[str | None] = mapped_column(sa.String(128))
    rec_throughput: Mapped[float | None]
    # Sharing a running job (tuner.service.slots); all nullable so that older tables gain them by
    # ALTER TABLE ADD COLUMN (`_add_missing_columns`).
    stage: Mapped[str | None] = mapped_column(sa.String(16))
    finalizer: Mapped[str | None] = mapped_column(sa.String(128))
    slot_lock: Mapped[str | None] = mapped_column(sa.String(128))
    slot_lock_until: Mapped[dt.datetime | None]
    deadline_at: Mapped[dt.datetime | None]
    # Trials cut short by the service (run again, not counted); see tuner.store.counting.
    n_interrupted: Mapped[int | None]
    # A job run by its own workers only (`python -m tuner run --gpus N`, whose workers measure
    # with its flags): no service worker claims or joins it. NULL in rows made before: shared.
    dedicated: Mapped[bool | None]


class WorkerRow(Base):
    __tablename__ = "streamtune_workers"

    id: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    host: Mapped[str] = mapped_column(sa.String(255))
    pid: Mapped[int]
    device: Mapped[str] = mapped_column(sa.String(32))
    started_at: Mapped[dt.datetime]
    heartbeat_at: Mapped[dt.datetime]
    job_id: Mapped[str | None] = mapped_column(sa.String(32))


class TrialEventRow(Base):
    """One finished trial of a job (for /metrics); (job, number) is unique, so never twice."""

    __tablename__ = "streamtune_trial_events"

    job_id: Mapped[str] = mapped_column(sa.String(32), primary_key=True)
    number: Mapped[int] = mapped_column(primary_key=True)
    state: Mapped[str] = mapped_column(sa.String(16))
    seconds: Mapped[float]
    finished_at: Mapped[dt.datetime]


class GpuLeaseRow(Base):
    """Who measures on a GPU: one row per GPU, keyed by its UUID; see `tuner.service.leases`.

    Leases were first keyed by (host, index) in `streamtune_gpu_leases`; that table is no longer
    read (a database made by an earlier checkout keeps it, unused).
    """

    __tablename__ = "streamtune_device_leases"

    device: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    host: Mapped[str] = mapped_column(sa.String(255))
    gpu: Mapped[int]
    worker: Mapped[str] = mapped_column(sa.String(128))
    pid: Mapped[int]
    acquired_at: Mapped[dt.datetime]
    heartbeat_at: Mapped[dt.datetime]


def create_tables(engine: sa.Engine) -> None:
    """Make the tables and columns missing; a race with another process doing it is retried."""
    for attempt in range(3):
        try:
            Base.metadata.create_all(engine)
            _add_missing_columns(engine)
            return
        except sa.exc.SQLAlchemyError as exc:
            if attempt == 2 or not lost_create_race(exc):
                raise


def _add_missing_columns(engine: sa.Engine) -> None:
    """Columns added since a table was made (all nullable): ALTER TABLE ... ADD COLUMN.

    `create_all` makes missing tables only; a database of an earlier version keeps its rows.
    """
    inspector = sa.inspect(engine)
    for table in Base.metadata.sorted_tables:
        present = {column["name"] for column in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            kind = column.type.compile(dialect=engine.dialect)
            with engine.begin() as conn:
                conn.execute(sa.text(f'ALTER TABLE {table.name} ADD COLUMN "{column.name}" {kind}'))


def make_engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        # A pool as large as the API's thread pool is busy: no connection churn under load.
        engine = sa.create_engine(
            url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S}, pool_size=32, max_overflow=8
        )

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            # WAL: readers (the API) never wait for the writer (a worker), and vice versa.
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    if url.startswith("postgresql"):
        # Pinned, never the server's default: see POSTGRES_ISOLATION.
        return sa.create_engine(url, pool_pre_ping=True, isolation_level=POSTGRES_ISOLATION)
    return sa.create_engine(url, pool_pre_ping=True)


def service_job_of(url: str, study: str, *, except_owner: str) -> tuple[str, str] | None:
    """The id and status of the latest job of `url`'s job table whose study is `study`, of an
    owner other than `except_owner` (`run --gpus N`'s own jobs); None where there is none, or no
    job table. Read only: nothing is made in a database the service never used."""
    engine = sa.create_engine(url)
    try:
        if not sa.inspect(engine).has_table(JobRow.__tablename__):
            return None
        with engine.connect() as conn:
            row = conn.execute(
                sa.select(JobRow.id, JobRow.status)
                .where(JobRow.study == study, JobRow.owner != except_owner)
                .order_by(JobRow.created_at.desc())
                .limit(1)
            ).first()
        return None if row is None else (row[0], row[1])
    finally:
        engine.dispose()


def study_not_made(name: str, job_id: str, status: str) -> str:
    """Why the study `name` of the service job `job_id` does not exist: a worker makes it when
    it claims the job. Said alike by the study's page and the job's report (which had said
    "no study named 'job-…' in this storage", as if lost: a probe, 2026-12-07)."""
    said = (
        f"is not made yet: a worker makes it when it claims job {job_id}, which is {status}"
        if status in ("queued", "running")  # running: claimed, its study about to be made
        else f"was never made: job {job_id} ended {status} before its study was"
    )
    return f"study {name!r} {said} (GET /v1/jobs/{job_id})"


def no_recommendation_yet(name: str, job_id: str, status: str) -> str:
    """Why the study `name` of the service job `job_id` has no recommendation, and what to do:
    the API's /best and the CLI's `best` and `export` say it alike (the CLI had advised
    `run --study` again, which it refuses for a job's study: a probe, 2026-12-07)."""
    if status in ("queued", "running"):
        return (
            f"study {name!r} has no recommendation yet: its job {job_id} is {status} "
            f"(GET /v1/jobs/{job_id} shows how far it is)"
        )
    return (
        f"study {name!r} has no recommendation: its job {job_id} ended {status} before its "
        f"final round; POST the job again to tune the model (GET /v1/jobs/{job_id} says why)"
    )
