"""The worker: claims or joins jobs from the job table and runs their trials on one device.

`python -m tuner worker [--storage URL] [--gpu INDEX]` runs one (`python -m tuner serve` starts one
per visible GPU). A worker loops: requeue jobs none of whose workers heartbeat any more, claim the
oldest queued job it can run (`Membership.claim`, atomic), or else join a running job that has a
trial slot free or is ready for its final round, run trials of it until no slot is left, repeat;
with nothing to do it waits `TUNER_POLL_S`. With `--job ID` (the workers `python -m tuner run
--gpus N` starts) it claims or joins that job only, and exits 0 once the job has ended. While it is
in a job, a thread heartbeats the job row, the worker row and the GPU lease every
`TUNER_HEARTBEAT_S`, reads back whether a cancel was requested and whether the worker is still a
member of the job, and fails the RUNNING trials of the job's study whose worker is dead
(`tuner.service.slots.fail_orphans`).

Several workers on one job (`tuner.service.slots`): the claimer fails the orphaned RUNNING trials,
measures both baselines (the job's "start" baselines, on its device) and opens the job for
trials; every member then takes trial slots under the job's slot lock until `trials` trials
count. Drift baselines: each worker measures both baselines again after every `baseline_every`
trials it ran itself, and their drift compares its device with that device's first measurement.
The worker that finds every slot finished claims the final round: only it decides, on its device.

Grace period of a worker killed mid-trial: its trial is failed as `interrupted: ...` (not
counted, run again) by another worker of the job once the dead worker's heartbeat is older than
`TUNER_LEASE_S`, at that worker's next heartbeat: within `lease_s + heartbeat_s` of the dead
worker's last heartbeat. Dead workers' rows are removed, and a dead finalizer's job goes back to
stage "trials", where the next worker to look finalizes it.

The database away: every database call of the loop is retried with exponential backoff
(`tuner.store.retry`, `TUNER_RETRY_BASE_S` doubling up to `TUNER_RETRY_MAX_S`, with jitter), a
measured trial's result is told once the database is back (never measured again), and the heartbeat
thread retries at its own pace. A worker that has just seen the database come back does not take
other workers for dead until it has been connected for `lease_s` (they have had no chance to
heartbeat either).

Cancelling: the API flags the row; the heartbeat thread sees the flag, `should_stop` answers True,
and the running trial stops at its next window (kept as a PRUNED trial with its windows and
`stopped`, not counted); the job ends as cancelled (once a final round has started, that round
finishes and its recommendation is kept). A shutdown (SIGTERM/SIGINT, or the `serve` process
that started the worker gone) stops the running trial the same way; the worker leaves the job
(the last live member puts it back in the queue), gives its GPU lease back and exits 0. Where
the job is in a part that polls nothing (a gate's reference or envelope run, a compile) the
signal's worker hands the job back itself after GIVE_BACK_S and exits 0, before `serve`'s pool
kills it (`tuner.service.pool.STOP_GRACE_S`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable

import optuna
import sqlalchemy as sa
import sqlalchemy.exc
import torch

import trainers
from trainers.program import REGISTRY_VARIABLE
from tuner.errors import JobNotFound, TunerError
from tuner.request import run_options
from tuner.search.options import RunOptions
from tuner.search.proposing.defaults import CPU_FINAL_ROUNDS
from tuner.service.job import JobRun
from tuner.service.jobstore import FINISHED, WorkerStore
from tuner.service.leases import GpuLease, gpu_uuid
from tuner.service.settings import WorkerSettings, load_settings
from tuner.service.slots import GAVE_UP_REASON, count_slots, fail_orphans
from tuner.service.spec import JobSpec, WorkloadRegistry
from tuner.service.tables import JobRow, job_devices
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.keys import JOB_STUDY_PREFIX as STUDY_PREFIX
from tuner.store.retry import Backoff, is_transient
from tuner.store.running import fail_running

log = logging.getLogger("tuner.worker")


GIVE_BACK_S = 20.0
"""How long a signalled worker waits for its job to stop at a point that polls before it hands
the job back itself (`Worker.give_back`): inside the pool's STOP_GRACE_S (30 s)."""


class Worker:
    """Runs trials of jobs of one storage on one device (a GPU index, or the CPU)."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        storage: str | None = None,
        gpu: int | None = None,
        job: str | None = None,
    ) -> None:
        self.settings = settings
        # One job only, then exit (a worker of `python -m tuner run --gpus N`); None: any job.
        self.only_job = job
        self.storage_url = storage or settings.storage
        if gpu is None and torch.cuda.is_available():
            gpu = 0
        if gpu is not None and not 0 <= gpu < torch.cuda.device_count():
            raise TunerError(
                f"--gpu: {gpu} is invalid: this node has {torch.cuda.device_count()} visible GPUs"
            )
        self.device = "cpu" if gpu is None else f"cuda:{gpu}"
        self.devices = job_devices(self.device)
        self.hardware = trainers.fingerprint_key(trainers.fingerprint(torch.device(self.device)))
        self.host = settings.host or socket.gethostname()
        self.id = f"{self.host}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.registry = WorkloadRegistry(settings.workloads, settings.programs)
        if settings.programs:
            # The measurements find a program by this variable (trainers.program.find_program),
            # also when the setting came as an argument rather than from the environment.
            os.environ[REGISTRY_VARIABLE] = settings.programs
        self.store = WorkerStore(self.storage_url)
        self.lease = (
            None
            if gpu is None
            else GpuLease(self.store, self.host, gpu, self.id, os.getpid(), gpu_uuid(gpu))
        )
        self._optuna: optuna.storages.BaseStorage | None = None
        self._storage_lock = threading.Lock()
        self.stopping = threading.Event()
        self.backoff = Backoff(
            base_s=settings.retry_base_s, max_s=settings.retry_max_s, stop=self.stopping
        )
        self._started = False
        self._run: JobRun | None = None  # the job this worker is a member of, if any
        self._member_job: JobRow | None = None  # that job's row (`give_back`)
        self._give_back_timer: threading.Timer | None = None
        self._ready: JobRun | None = None  # the one job's search, opened before joining it
        self._prepared_once = False  # tried to open it ahead (once: a failure is met on joining)
        # Monotonic time since which the database has answered (None: it is away now).
        self._db_ok_since: float | None = -math.inf
        if settings.torch_threads is not None:
            torch.set_num_threads(settings.torch_threads)

    # -- the loop ------------------------------------------------------------------------
    def start(self) -> None:
        """Register the worker and take its GPU's lease (`tuner.errors.GpuBusy` if taken)."""
        if self._started:
            return
        self.storage()  # Optuna's tables exist before any job is touched
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
        try:
            if self._ready is not None:
                self._ready.discard()
                self._ready = None
            if self._started:
                self._goodbye()
        finally:
            # The database connections go back now, not when the worker is collected: `serve`
            # and the tests make many workers in one process. Both reconnect if it starts again.
            self.store.close()
            if self._optuna is not None:
                studies.close_storage(self._optuna)

    def _goodbye(self) -> None:
        try:
            if self.lease is not None:
                self.lease.release()
            self.store.remove_worker(self.id)
        except sqlalchemy.exc.SQLAlchemyError as exc:
            log.warning(
                "worker %s: could not say goodbye (%s); its rows go stale after %.0f s",
                self.id,
                type(exc).__name__,
                self.settings.lease_s,
            )
        self._started = False

    def run(self) -> None:
        """Claim and run jobs until `shutdown()` (or a signal through `install_signals`)."""
        try:
            self.start()
        except BaseException:
            self.close()  # a GPU taken or the database away at the start: the engines go back
            raise
        # Never log a database password that the URL may carry.
        log.info(
            "worker %s on %s, storage %s", self.id, self.device, studies.masked(self.storage_url)
        )
        failures = 0
        try:
            while not self.stopping.is_set():
                self.check_parent()
                try:
                    self._beat_idle()
                    ran = self.run_once()
                except Exception as exc:
                    if not is_transient(exc):
                        raise
                    self.db_down()
                    wait = self.backoff.delay(failures)
                    failures += 1
                    log.warning(
                        "worker %s: database unavailable (%s); retrying in %.1f s",
                        self.id,
                        type(exc.__cause__ or exc).__name__,
                        wait,
                    )
                    self.stopping.wait(wait)
                    continue
                failures = 0
                self.db_up()
                if self.only_job is not None and self._job_over():
                    break
                if not ran:
                    self.stopping.wait(self.settings.poll_s)
        finally:
            self.close()
            log.info("worker %s stopped", self.id)

    def run_once(self) -> bool:
        """Claim a queued job, or join a running one, and run its trials; False if none had any."""
        self.start()
        self._sweep()
        job = self.store.claim(self.id, devices=self.devices, job=self.only_job)
        if job is not None:
            log.info("job %s claimed (attempt %d)", job.id, job.attempts)
            return self._member_of(job, claimed=True)
        storage = self.storage()
        joinable = self.store.joinable(
            devices=self.devices, hardware=self.hardware, job=self.only_job
        )
        for job in joinable:
            slots = count_slots(storage, job, job.deadline_at)
            limit = JobSpec.of(job).max_members
            if (slots.free > 0 or slots.finished) and self.store.join(
                job.id, self.id, max_members=limit
            ):
                log.info(
                    "job %s joined (%d of %d trials counted)", job.id, slots.counted, slots.trials
                )
                if self._member_of(job, claimed=False):
                    return True
        if self.only_job is not None and not joinable:
            self._prepare_only_job()
        return False

    def _prepare_only_job(self) -> None:
        """A worker of `run --gpus N` whose job another worker claimed and is opening: open this
        worker's search of it meanwhile (`JobRun.prepare`), heartbeats going, once."""
        if self._ready is not None or self._prepared_once:
            return
        try:
            row = self.store.get(self.only_job or "")
        except JobNotFound:
            return
        if row.status != "running" or row.stage is not None or row.device not in self.devices:
            return  # not claimed yet, or open already (then not joinable here: nothing to do)
        self._prepared_once = True
        ready = JobRun(self)
        done = threading.Event()
        beat = threading.Thread(target=self._beat_until, args=(done,), daemon=True)
        beat.start()
        try:
            ready.prepare(row)
        except Exception as exc:  # noqa: BLE001 - joining opens it again and records the error
            log.info("job %s: not opened ahead (%s)", row.id, type(exc).__name__)
            ready.discard()
            return
        finally:
            done.set()
            beat.join()
        self._ready = ready

    def _beat_until(self, done: threading.Event) -> None:
        while not done.wait(self.settings.heartbeat_s):
            with contextlib.suppress(sqlalchemy.exc.SQLAlchemyError):
                self._beat_idle()

    def shutdown(self) -> None:
        self.stopping.set()

    def check_job(self) -> None:
        """`--job ID` naming no job of this storage is a one-line error: the worker had exited 0
        at once, as if that job had ended. A database that does not answer now is met by `run`
        (it retries): nothing is said here then."""
        if self.only_job is None:
            return
        try:
            row = self.store.get(self.only_job)
            if row.status in FINISHED:  # it exits at once: had said nothing, as if it had run
                log.warning("job %s has already ended (%s): nothing to run", row.id, row.status)
        except JobNotFound:
            where = studies.masked(self.storage_url)
            raise TunerError(
                f"--job: no job {self.only_job!r} in the storage {where}:"
                " allowed the id of a job there (`python -m tuner run --gpus N` starts its own)"
            ) from None
        except sa.exc.SQLAlchemyError as exc:
            if not is_transient(exc):
                raise

    def _job_over(self) -> bool:
        """Whether the one job this worker serves has ended (or is gone)."""
        try:
            row = self.store.get(self.only_job or "")
        except JobNotFound:
            return True
        return row.status in FINISHED

    def install_signals(self) -> None:
        def stop(*_: object) -> None:
            self.shutdown()
            if self._give_back_timer is None:
                self._give_back_timer = threading.Timer(GIVE_BACK_S, self.give_back)
                self._give_back_timer.daemon = True
                self._give_back_timer.start()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)

    def give_back(self, exit_process: Callable[[int], object] | None = None) -> None:
        """The job this worker is still a member of, handed back as a shutdown hands it back
        (queued again, its claim not counted as an attempt, this worker's running trial failed
        as given up), then the process ended: a Ctrl-C of `serve` during a gate had left the
        job running and charged, the worker killed at the grace's end (a user's probe,
        2026-12-06). Nothing where no job is held: the loop ends on its own."""
        job = self._member_job
        if job is None:
            return
        try:
            fail_running(
                self.storage(),
                job.study,
                lambda t: t.user_attrs.get(keys.OWNER) == self.id,
                GAVE_UP_REASON,
            )
            reason = f"requeued: worker {self.id} shut down"
            if self.store.requeue(job.id, self.id, reason=reason, lease_s=self.settings.lease_s):
                log.info("job %s requeued (shutdown, before its running part stopped)", job.id)
            self._goodbye()
        finally:
            (exit_process or _exit_now)(0)

    def should_stop(self) -> bool:
        run = self._run
        return self.stopping.is_set() or (run is not None and run.should_stop())

    def options_for(self, job: JobRow, spec: JobSpec) -> RunOptions:
        """The `RunOptions` this worker runs `job`'s study with: the job's request, the worker's
        own protocol and device (`tuner.request.run_options`, as the CLI's run). On a CPU, the
        final rounds and profiles the operator did not set are the CLI's CPU defaults
        (`tuner.cli._cpu_defaults`): the same request then runs the same way through either."""
        s = self.settings
        device = "cpu" if spec.device == "cpu" else self.device
        final_rounds, profile = s.final_rounds, s.profile
        if trainers.resolve_device(device).type == "cpu":
            if "final_rounds" not in s.model_fields_set:
                final_rounds = CPU_FINAL_ROUNDS
            if "profile" not in s.model_fields_set:
                profile = "none"
        return run_options(
            spec,
            workload=self.registry.target(spec.workload),
            device=device,
            budget=False,
            storage=self.storage_url,
            study=job.study,
            # The owner's own records only: another owner's job must not be found through the
            # trials it measured (tuner.search.earlier names the study it copies from).
            scope=job.owner,
            top_k=s.top_k,
            final_rounds=final_rounds,
            baseline_every=s.baseline_every,
            profile=profile,
            parity_steps=s.parity_steps,
            precision_parity_steps=s.precision_parity_steps,
            precision_tolerance=s.precision_tolerance,
            sampler=s.sampler,
            protocol=s.protocol(),
            auto_window_steps=s.measure_window_steps is None,
            # A precision named (or several allowed) sets the matmul precision itself.
            matmul_precision=s.matmul_precision
            if spec.precision is None and spec.precisions is None
            else "highest",
        )

    def beat_in(self, job_id: str) -> None:
        """`JobMember.beat_in`: the GPU lease, the database up, dead workers' trials failed."""
        if self.lease is not None and not self.lease.beat():
            self.gpu_lost()
        self.db_up()
        if self.may_sweep():
            self.fail_orphans(job_id)

    def _member_of(self, job: JobRow, *, claimed: bool) -> bool:
        ready, self._ready = self._ready, None
        self._run = ready if ready is not None and ready.prepared_for == job.id else JobRun(self)
        if ready is not None and ready is not self._run:
            ready.discard()
        self._member_job = job
        try:
            return self._run.member_of(job, claimed=claimed)
        finally:
            self._run = self._member_job = None

    # -- one job -------------------------------------------------------------------------
    def _beat_idle(self) -> None:
        if not self.store.beat_worker(self.id):  # taken for dead while the database was away
            self.store.register_worker(self.id, host=self.host, pid=os.getpid(), device=self.device)
        if self.lease is not None and not self.lease.beat():
            self.gpu_lost()

    def gpu_lost(self) -> None:
        log.error(
            "worker %s: another worker took over the lease of %s (%s) on %s (this one "
            "was taken for dead); stopping",
            self.id,
            self.device,
            self.lease.key if self.lease else "-",
            self.host,
        )
        self.shutdown()

    def _sweep(self) -> None:
        """Requeue jobs without live workers; forget dead workers and fail their trials."""
        if not self.may_sweep():
            return
        self.store.requeue_stale(
            lease_s=self.settings.lease_s, max_attempts=self.settings.max_attempts
        )
        for dead in self.store.forget_dead_workers(self.settings.lease_s):
            log.info("worker %s is dead (no heartbeat for %.0f s)", dead.id, self.settings.lease_s)
            if dead.job_id is not None:
                self.fail_orphans(dead.job_id)

    def fail_orphans(self, job_id: str) -> None:
        study = f"{STUDY_PREFIX}{job_id}"
        alive = self.store.live_workers(self.settings.lease_s)
        for number in fail_orphans(
            self.storage(), study, alive=alive, unowned_after_s=self.settings.lease_s
        ):
            log.info("job %s: trial %d's worker is dead; failed as interrupted", job_id, number)

    def may_sweep(self) -> bool:
        """Whether others' stale heartbeats mean they are dead (module doc: the database away)."""
        since = self._db_ok_since
        return since is not None and time.monotonic() - since >= self.settings.lease_s

    def db_up(self) -> None:
        if self._db_ok_since is None:
            self._db_ok_since = time.monotonic()

    def db_down(self) -> None:
        self._db_ok_since = None

    def check_parent(self) -> None:
        parent = self.settings.parent_pid
        if parent is not None and os.getppid() != parent and not self.stopping.is_set():
            log.warning("worker %s: its serve process %d is gone; shutting down", self.id, parent)
            self.shutdown()

    def storage(self) -> optuna.storages.BaseStorage:
        with self._storage_lock:  # the heartbeat thread may ask first
            if self._optuna is None:
                self._optuna = studies.open_storage(self.storage_url)
            return self._optuna


def _exit_now(code: int) -> None:
    """End the process now, its log written out: the main thread may be deep in a compile."""
    logging.shutdown()
    os._exit(code)


def main(storage: str | None = None, gpu: int | None = None, job: str | None = None) -> None:
    """`python -m tuner worker`: run until SIGTERM/SIGINT (then exit 0, see the module doc), or
    with `job` until that job has ended."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = load_settings(WorkerSettings)
    if settings.worker_nice and hasattr(os, "nice"):
        os.nice(settings.worker_nice)
    worker = Worker(settings, storage=storage, gpu=gpu, job=job)
    worker.registry.check()
    worker.check_job()
    worker.install_signals()
    worker.run()


__all__ = ["Worker", "main"]
