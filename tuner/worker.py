"""The worker: claims or joins jobs from the job table and runs their trials on one device.

`python -m tuner worker [--storage URL] [--gpu INDEX]` runs one (`python -m tuner serve` starts one
per visible GPU). A worker loops: requeue jobs none of whose workers heartbeat any more, claim the
oldest queued job it can run (`JobStore.claim`, atomic), or else join a running job that has a
trial slot free or is ready for its final round, run trials of it until no slot is left, repeat;
with nothing to do it waits `TUNER_POLL_S`. While it is in a job, a thread heartbeats the job
row, the worker row and the GPU lease every `TUNER_HEARTBEAT_S`, reads back whether a cancel was
requested and whether the worker is still a member of the job, and fails the RUNNING trials of
the job's study whose worker is dead (`tuner.job_run.fail_orphans`).

Several workers on one job (`tuner.job_run`): the claimer fails the orphaned RUNNING trials,
measures both baselines (the job's "start" baselines, on its device) and opens the job for
trials; every member then takes trial slots under the job's slot lock until `n_trials` trials
count. Drift baselines: each worker measures both baselines again after every `baseline_every`
trials it ran itself, and their drift compares its device with that device's first measurement.
The worker that finds every slot finished claims the final round: only it decides, on its device.

Grace period of a worker killed mid-trial: its trial is failed as `interrupted: ...` (not
counted, run again) by another worker of the job once the dead worker's heartbeat is older than
`TUNER_LEASE_S`, at that worker's next heartbeat: within `lease_s + heartbeat_s` of the dead
worker's last heartbeat. Dead workers' rows are removed, and a dead finalizer's job goes back to
stage "trials", where the next worker to look finalizes it.

The database away: every database call of the loop is retried with exponential backoff
(`tuner.retry`, `TUNER_RETRY_BASE_S` doubling up to `TUNER_RETRY_MAX_S`, with jitter), a measured
trial's result is told once the database is back (never measured again), and the heartbeat
thread retries at its own pace. A worker that has just seen the database come back does not take
other workers for dead until it has been connected for `lease_s` (they have had no chance to
heartbeat either).

Cancelling: the API flags the row; the heartbeat thread sees the flag, `should_stop` answers True,
and the running trial stops at its next window (kept as a PRUNED trial with its windows and
`stopped`, not counted); the job ends as cancelled (once a final round has started, that round
finishes and its recommendation is kept). A shutdown (SIGTERM/SIGINT, or the `serve` process
that started the worker gone) stops the running trial the same way; the worker leaves the job
(the last live member puts it back in the queue), gives its GPU lease back and exits 0.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import signal
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import optuna
import pydantic
import sqlalchemy as sa
import sqlalchemy.exc
import torch
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

import trainers
from tuner import study as studies
from tuner.errors import SpaceError, TunerError
from tuner.job_run import (
    GAVE_UP_REASON,
    ORPHAN_REASON,
    JobSlots,
    count_slots,
    fail_orphans,
    fail_running,
)
from tuner.job_study import best_trial, is_rerun, trial_counts
from tuner.jobs import STUDY_PREFIX, JobRow, JobSpec, JobStore, WorkloadRegistry, utcnow
from tuner.leases import GpuLease, gpu_uuid
from tuner.measure import Protocol
from tuner.retry import Backoff, is_transient
from tuner.search import OWNER_ATTR, RunOptions, Search, Stopped, open_search

log = logging.getLogger("tuner.worker")


class WorkerSettings(BaseSettings):
    """The worker's settings, from `TUNER_*` environment variables (the operator's, not users')."""

    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore")

    storage: str = studies.DEFAULT_STORAGE
    workloads: dict[str, str] = Field(
        default_factory=dict, description="plug-in workloads: JSON {name: package.module:factory}")
    lease_s: float = Field(default=60.0, gt=0, le=86_400,
                           description="heartbeat age after which a job is requeued")
    heartbeat_s: float = Field(default=5.0, gt=0, le=3_600)
    poll_s: float = Field(default=2.0, gt=0, le=3_600)
    max_attempts: int = Field(default=3, ge=1, le=100,
                              description="claims of one job before it fails")
    measure_warmup: int = Field(default=10, ge=0, le=100_000)
    measure_windows: int = Field(default=5, ge=1, le=10_000)
    measure_window_steps: int = Field(default=20, ge=1, le=1_000_000)
    final_rounds: int = Field(default=3, ge=1, le=100)
    top_k: int = Field(default=3, ge=1, le=100)
    parity_steps: int = Field(default=20, ge=2, le=100_000)
    baseline_every: int = Field(default=10, ge=1, le=100_000)
    sampler: Literal["tpe", "random"] = "tpe"
    matmul_precision: Literal["highest", "high", "medium"] = Field(
        default="highest", description="torch float32 matmul precision of every job (high: TF32)")
    torch_threads: int | None = Field(default=None, ge=1, le=1024)
    worker_nice: int = Field(default=0, ge=0, le=19, description=(
        "niceness of `python -m tuner worker` (e.g. 10: the API and the rest of the node go "
        "first when they want the CPU too)"))
    space_dir: str | None = Field(default=None,
                                  description="where explicit search spaces are written")
    host: str | None = Field(default=None, min_length=1, max_length=255, description=(
        "the host name this worker reports (default: socket.gethostname()); GPU leases are "
        "keyed by the GPU's UUID, and by this host and the index only where torch has no UUID"))
    retry_base_s: float = Field(default=0.5, gt=0, le=600,
                                description="first wait after a database error")
    retry_max_s: float = Field(default=30.0, gt=0, le=3_600,
                               description="longest wait between database retries")
    parent_pid: int | None = Field(default=None,
                                   description="set by `serve`: shut down when it is gone")

    def protocol(self) -> Protocol:
        return Protocol(warmup=self.measure_warmup, windows=self.measure_windows,
                        window_steps=self.measure_window_steps)


def describe(exc: BaseException) -> str:
    """One line for a job's `error`, naming the request field where there is one."""
    if isinstance(exc, trainers.ConfigError):
        return f"{exc.field}: {exc}"
    if isinstance(exc, trainers.WorkloadError):
        return f"{exc.field or 'workload'}: {exc}"
    if isinstance(exc, SpaceError):
        return f"space/fix: {exc}"
    if isinstance(exc, TunerError | trainers.TrainerError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"[:2000]


class Worker:
    """Runs trials of jobs of one storage on one device (a GPU index, or the CPU)."""

    def __init__(self, settings: WorkerSettings, *, storage: str | None = None,
                 gpu: int | None = None) -> None:
        self.settings = settings
        self.storage_url = storage or settings.storage
        if gpu is None and torch.cuda.is_available():
            gpu = 0
        if gpu is not None and not 0 <= gpu < torch.cuda.device_count():
            raise TunerError(f"--gpu: {gpu} is invalid: this node has "
                             f"{torch.cuda.device_count()} visible GPUs")
        self.device = "cpu" if gpu is None else f"cuda:{gpu}"
        self.devices = ("auto", "cpu") if gpu is None else ("auto", "cpu", "cuda")
        self.hardware = trainers.fingerprint_key(trainers.fingerprint(torch.device(self.device)))
        self.host = settings.host or socket.gethostname()
        self.id = f"{self.host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.registry = WorkloadRegistry(settings.workloads)
        self.store = JobStore(self.storage_url)
        self.lease = None if gpu is None else GpuLease(self.store, self.host, gpu, self.id,
                                                       os.getpid(), gpu_uuid(gpu))
        self._optuna: optuna.storages.BaseStorage | None = None
        self._storage_lock = threading.Lock()
        self._shutdown = threading.Event()
        self.backoff = Backoff(base_s=settings.retry_base_s, max_s=settings.retry_max_s,
                               stop=self._shutdown)
        self._started = False
        self._stop: str | None = None  # "cancel" or "lost", set by the heartbeat thread
        self._phase: str | None = None
        # Monotonic time since which the database has answered (None: it is away now).
        self._db_ok_since: float | None = -math.inf
        if settings.torch_threads is not None:
            torch.set_num_threads(settings.torch_threads)

    # -- the loop ------------------------------------------------------------------------
    def start(self) -> None:
        """Register the worker and take its GPU's lease (`tuner.leases.GpuBusy` if taken)."""
        if self._started:
            return
        self._storage()  # Optuna's tables exist before any job is touched
        self.store.register_worker(self.id, host=self.host, pid=os.getpid(), device=self.device)
        if self.lease is not None:
            try:
                self.lease.acquire(lease_s=self.settings.lease_s)
            except TunerError:
                self.store.remove_worker(self.id)
                raise
        self._started = True

    def close(self) -> None:
        """Give the GPU lease back and remove the worker's row (and so its memberships)."""
        if not self._started:
            return
        try:
            if self.lease is not None:
                self.lease.release()
            self.store.remove_worker(self.id)
        except sqlalchemy.exc.SQLAlchemyError as exc:
            log.warning("worker %s: could not say goodbye (%s); its rows go stale after %.0f s",
                        self.id, type(exc).__name__, self.settings.lease_s)
        self._started = False

    def run(self) -> None:
        """Claim and run jobs until `shutdown()` (or a signal through `install_signals`)."""
        self.start()
        # Never log a database password that the URL may carry.
        shown = sa.engine.make_url(self.storage_url).render_as_string(hide_password=True)
        log.info("worker %s on %s, storage %s", self.id, self.device, shown)
        failures = 0
        try:
            while not self._shutdown.is_set():
                self._check_parent()
                try:
                    self._beat_idle()
                    ran = self.run_once()
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    self._db_down()
                    wait = self.backoff.delay(failures)
                    failures += 1
                    log.warning("worker %s: database unavailable (%s); retrying in %.1f s",
                                self.id, type(exc.__cause__ or exc).__name__, wait)
                    self._shutdown.wait(wait)
                    continue
                failures = 0
                self._db_up()
                if not ran:
                    self._shutdown.wait(self.settings.poll_s)
        finally:
            self.close()
            log.info("worker %s stopped", self.id)

    def run_once(self) -> bool:
        """Claim a queued job, or join a running one, and run its trials; False if none had any."""
        self.start()
        self._sweep()
        job = self.store.claim(self.id, devices=self.devices)
        if job is not None:
            log.info("job %s claimed (attempt %d)", job.id, job.attempts)
            return self._in_job(job, claimed=True)
        storage = self._storage()
        for job in self.store.joinable(devices=self.devices, hardware=self.hardware):
            slots = count_slots(storage, job.study, job.n_trials, job.deadline_at)
            if (slots.free > 0 or slots.finished) and self.store.join(job.id, self.id):
                log.info("job %s joined (%d of %d trials counted)", job.id, slots.counted,
                         job.n_trials)
                if self._in_job(job, claimed=False):
                    return True
        return False

    def shutdown(self) -> None:
        self._shutdown.set()

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.shutdown())

    def should_stop(self) -> bool:
        return self._stop is not None or self._shutdown.is_set()

    # -- one job -------------------------------------------------------------------------
    def _in_job(self, job: JobRow, *, claimed: bool) -> bool:
        """Be a member of `job` until no trial of it is left for this worker."""
        self._stop, self._phase = None, "starting"
        done = threading.Event()
        beat = threading.Thread(target=self._beat, args=(job, done), daemon=True,
                                name=f"heartbeat-{job.id[:8]}")
        beat.start()
        try:
            return self._execute(job, claimed=claimed)
        finally:
            done.set()
            beat.join()
            self._leave(job)

    def _execute(self, job: JobRow, *, claimed: bool) -> bool:
        """Run trials of the job, and its final round if it falls to this worker.

        False when this worker found nothing to do in it (every slot taken by others).
        """
        if job.cancel_requested:
            self.store.finish(job.id, self.id, "cancelled")
            return True
        search: Search | None = None
        try:
            spec = JobSpec.from_dict(job.spec)
            search = open_search(self._options(job, spec), progress=_JobProgress(self, job),
                                 should_stop=self.should_stop, owner=self.id,
                                 retry=self.backoff, storage=self._storage())
            deadline = job.deadline_at
            if claimed:
                stored = self._prepare_study(job)
                if stored is not None:  # killed after deciding, before the row said so
                    return self._finish(job, stored)
                search.measure_baselines("start")
                deadline = None if spec.timeout_s is None else (
                    utcnow() + dt.timedelta(seconds=spec.timeout_s))
                hardware = studies.meta(search.study)["hardware"]
                if not self.store.open_trials(job.id, self.id, hardware=hardware,
                                              deadline=deadline):
                    return True  # lost it meanwhile (cancelled, or taken for dead)
            slots = self._slots(job, deadline)
            search.run_trials(slots)
            if search.stopped:
                raise Stopped(f"stopped after {search.done} trials")
            if not slots.count().finished or not self.store.claim_finalizing(job.id, self.id):
                return search.done > 0 or claimed
            self._phase = "final round"
            rec = self.backoff.call(search.decide, what=f"job {job.id}: final round")
        except Stopped:
            self._after_stop(job)
            return True
        except Exception as exc:  # a job's failure is recorded; the worker goes on
            if is_transient(exc):
                raise  # the database is away: the loop waits for it; the job is not at fault
            if self._stop is not None or self._shutdown.is_set():
                self._after_stop(job)
                return True
            log.warning("job %s failed: %s", job.id, describe(exc))
            self._sync_progress(job)
            self.store.finish(job.id, self.id, "failed", error=describe(exc))
            return True
        finally:
            if search is not None:
                search.close()
        return self._finish(job, rec)

    def _finish(self, job: JobRow, rec: dict[str, Any]) -> bool:
        self._sync_progress(job)
        status = "cancelled" if self._stop == "cancel" else "succeeded"
        finished = self.backoff.call(
            lambda: self.store.finish(job.id, self.id, status, recommendation=rec),
            what=f"job {job.id}: finishing")
        if finished:
            log.info("job %s %s", job.id, status)
        else:
            log.warning("job %s: decided, but this worker no longer holds it", job.id)
        return True

    def _slots(self, job: JobRow, deadline: dt.datetime | None) -> JobSlots:
        return JobSlots(self.store, self._storage(), job_id=job.id, study=job.study,
                        n_trials=job.n_trials, deadline=deadline, worker=self.id,
                        hold_s=self.settings.lease_s, backoff=self.backoff)

    def _after_stop(self, job: JobRow) -> None:
        lease = self.store.heartbeat(job.id, self.id)
        if not lease.owned:
            log.warning("job %s: this worker is no longer one of its workers", job.id)
            return
        self._sync_progress(job)
        if lease.cancel_requested:
            if self.store.finish(job.id, self.id, "cancelled"):
                log.info("job %s cancelled", job.id)
        elif self.store.requeue(job.id, self.id, reason=f"requeued: worker {self.id} shut down",
                                lease_s=self.settings.lease_s):
            log.info("job %s requeued (shutdown)", job.id)
        else:
            log.info("job %s: left it to its other workers (shutdown)", job.id)

    def _leave(self, job: JobRow) -> None:
        """Stop being a member; a trial of this worker still RUNNING (given up) is failed."""
        try:
            fail_running(self._storage(), job.study,
                         lambda t: t.user_attrs.get(OWNER_ATTR) == self.id, GAVE_UP_REASON)
            self.store.leave(self.id)
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("job %s: could not leave it (%s); the others take this worker for dead "
                        "after %.0f s", job.id, type(exc).__name__, self.settings.lease_s)

    def _prepare_study(self, job: JobRow) -> dict[str, Any] | None:
        """Fail the orphaned RUNNING trials; the stored recommendation if every slot is done."""
        storage = self._storage()
        orphans = fail_orphans(storage, job.study,
                               alive=self.store.live_workers(self.settings.lease_s) - {self.id},
                               unowned_after_s=0.0)
        for number in orphans:
            log.info("job %s: trial %d was left running; failed as interrupted", job.id, number)
        if count_slots(storage, job.study, job.n_trials, None).free > 0:
            return None
        found = storage.get_study_id_from_name(job.study)
        rec = storage.get_study_user_attrs(found).get(studies.RECOMMENDATION)
        return rec if isinstance(rec, dict) else None

    def _options(self, job: JobRow, spec: JobSpec) -> RunOptions:
        s = self.settings
        return RunOptions(
            workload=self.registry.target(spec.workload), preset=spec.preset,
            trials=spec.n_trials, space=self._space_argument(job, spec), fix=spec.fix_items(),
            storage=self.storage_url, study=job.study,
            device="cpu" if spec.device == "cpu" else self.device,
            objectives=spec.objectives, max_memory_bytes=spec.max_memory_bytes,
            top_k=s.top_k, final_rounds=s.final_rounds, baseline_every=s.baseline_every,
            parity_steps=s.parity_steps, sampler=s.sampler, protocol=s.protocol(),
            matmul_precision=s.matmul_precision,
        )
    def _space_argument(self, job: JobRow, spec: JobSpec) -> str:
        """`RunOptions.space`: the built-in name, or a JSON file of the explicit space.

        The file's path is the space's name in the study, and a resumed study must be given the
        same one: reuse the path the study recorded, else `<space_dir>/job-<id>.json`.
        """
        if isinstance(spec.space, str):
            return spec.space
        path = Path(self.settings.space_dir or Path(tempfile.gettempdir()) / "streamtune-spaces",
                    f"{job.study}.json")
        storage = self._storage()
        try:
            attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(job.study))
            recorded = attrs.get(studies.META, {}).get("space", {}).get("name")
            if isinstance(recorded, str) and recorded.endswith(".json"):
                path = Path(recorded)
        except KeyError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec.space), encoding="utf-8")
        return str(path)

    # -- progress, heartbeats and dead workers -------------------------------------------
    def _sync_progress(self, job: JobRow) -> None:
        """Copy the study's counts and best trial to the job row; record finished trials once."""
        try:
            storage = self._storage()
            found = storage.get_study_id_from_name(job.study)
            trials = storage.get_all_trials(found, deepcopy=False)
            self.store.progress(job.id, self.id, counts=trial_counts(trials),
                                best=best_trial(trials))
            recorded = self.store.recorded_trials(job.id)
            for trial in trials:
                if (trial.number in recorded or not trial.state.is_finished()
                        or not trial.datetime_start or not trial.datetime_complete):
                    continue
                state = {"COMPLETE": "complete", "PRUNED": "pruned"}.get(trial.state.name,
                                                                         "failed")
                seconds = (trial.datetime_complete - trial.datetime_start).total_seconds()
                self.store.record_trial(job.id, trial.number, state, seconds)
        except KeyError:
            return  # no study yet
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning("job %s: progress not copied (%s); the next trial copies it", job.id,
                        type(exc).__name__)

    def _beat(self, job: JobRow, done: threading.Event) -> None:
        while not done.is_set():
            try:
                lease = self.store.heartbeat(job.id, self.id, phase=self._phase)
                gpu_held = self.lease is None or self.lease.beat()
                self._db_up()
                if self._may_sweep():
                    self._fail_orphans(job.id)
            except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
                self._db_down()
                log.warning("job %s: heartbeat failed: %s", job.id, type(exc).__name__)
            else:
                if not lease.owned:
                    self._stop = "lost"
                elif lease.cancel_requested:
                    self._stop = "cancel"
                if not gpu_held:
                    self._gpu_lost()
            self._check_parent()
            done.wait(self.settings.heartbeat_s)

    def _beat_idle(self) -> None:
        if not self.store.beat_worker(self.id):  # taken for dead while the database was away
            self.store.register_worker(self.id, host=self.host, pid=os.getpid(),
                                       device=self.device)
        if self.lease is not None and not self.lease.beat():
            self._gpu_lost()

    def _gpu_lost(self) -> None:
        log.error("worker %s: another worker took over the lease of %s (%s) on %s (this one "
                  "was taken for dead); stopping", self.id, self.device,
                  self.lease.key if self.lease else "-", self.host)
        self.shutdown()

    def _sweep(self) -> None:
        """Requeue jobs without live workers; forget dead workers and fail their trials."""
        if not self._may_sweep():
            return
        self.store.requeue_stale(lease_s=self.settings.lease_s,
                                 max_attempts=self.settings.max_attempts)
        for dead in self.store.forget_dead_workers(self.settings.lease_s):
            log.info("worker %s is dead (no heartbeat for %.0f s)", dead.id,
                     self.settings.lease_s)
            if dead.job_id is not None:
                self._fail_orphans(dead.job_id)

    def _fail_orphans(self, job_id: str) -> None:
        study = f"{STUDY_PREFIX}{job_id}"
        alive = self.store.live_workers(self.settings.lease_s)
        for number in fail_orphans(self._storage(), study, alive=alive,
                                   unowned_after_s=self.settings.lease_s):
            log.info("job %s: trial %d's worker is dead; failed as interrupted", job_id, number)

    def _may_sweep(self) -> bool:
        """Whether others' stale heartbeats mean they are dead (module doc: the database away)."""
        since = self._db_ok_since
        return since is not None and time.monotonic() - since >= self.settings.lease_s

    def _db_up(self) -> None:
        if self._db_ok_since is None:
            self._db_ok_since = time.monotonic()

    def _db_down(self) -> None:
        self._db_ok_since = None

    def _check_parent(self) -> None:
        parent = self.settings.parent_pid
        if parent is not None and os.getppid() != parent and not self._shutdown.is_set():
            log.warning("worker %s: its serve process %d is gone; shutting down", self.id, parent)
            self.shutdown()

    def _storage(self) -> optuna.storages.BaseStorage:
        with self._storage_lock:  # the heartbeat thread may ask first
            if self._optuna is None:
                self._optuna = studies.open_storage(self.storage_url)
            return self._optuna


class _JobProgress:
    """`tuner.search.Progress` for a job: phases go out with the heartbeat, trials to the row."""

    def __init__(self, worker: Worker, job: JobRow) -> None:
        self.worker = worker
        self.job = job

    def start(self, study: str, total: int, resumed: bool) -> None:
        self.worker._phase = f"{'resumed' if resumed else 'started'}: {total} trials in all"

    def phase(self, text: str) -> None:
        self.worker._phase = text

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        self.worker._phase = f"{done} trials run here, the last {state}"
        self.worker._sync_progress(self.job)


def main(storage: str | None = None, gpu: int | None = None) -> None:
    """`python -m tuner worker`: run until SIGTERM/SIGINT (then exit 0, see the module doc)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        settings = WorkerSettings()
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        raise TunerError(f"TUNER_{str(first['loc'][0]).upper()}: {first['msg']}") from exc
    if settings.worker_nice and hasattr(os, "nice"):
        os.nice(settings.worker_nice)
    worker = Worker(settings, storage=storage, gpu=gpu)
    worker.registry.check()
    worker.install_signals()
    worker.run()


__all__ = ["ORPHAN_REASON", "Worker", "WorkerSettings", "describe", "is_rerun", "main"]
