"""The worker: claims jobs from the job table and runs each one as `run_study` on its own study.

`python -m tuner worker [--storage URL] [--gpu INDEX]` runs one (`python -m tuner serve` starts one
per visible GPU). A worker loops: requeue jobs whose worker stopped heartbeating, claim the oldest
queued job it can run (`JobStore.claim`, atomic), run it, repeat; with nothing to do it waits
`TUNER_POLL_S`. While a job runs, a thread heartbeats the job row every `TUNER_HEARTBEAT_S` and
reads back whether a cancel was requested and whether the worker still holds the job.

Resuming (after a crash, a kill, or a shutdown): a job is always run on the study `job-<id>`, in
the same storage. Before running, the worker fails every trial of that study still RUNNING (only
a dead worker can have left one: the job was requeued, so nobody else runs its study) with the
failure reason `interrupted: ...`. Trials cut short by the service (those, and those stopped on
request: `tuner.job_study.is_rerun`) do not count toward the job's `n_trials`: they are re-run, and
what they measured stays in the study. So the run gets `n_trials - counted` trials, and a job ends
with exactly `n_trials` counted (complete + failed + pruned) trials, none lost and none twice.
A job killed during its final round has no trials left to run: it runs the final round only (see
`_options`).

Cancelling: the API flags the row; the heartbeat thread sees the flag, `should_stop` answers True,
and `run_study` stops the running trial at its next window (kept as a PRUNED trial with its
windows and `stopped`), starts no other and raises `Stopped`; the job ends as cancelled. A
shutdown (SIGTERM/SIGINT, or the `serve` process that started the worker gone) stops the same way
but puts the job back in the queue. A worker that finds it no longer holds its job (its lease ran
out and another worker took it) stops too, and leaves the row alone.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any, Literal

import optuna
import pydantic
import sqlalchemy as sa
import sqlalchemy.exc
import torch
from optuna.trial import TrialState
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

import trainers
from tuner import study as studies
from tuner.errors import SpaceError, TunerError
from tuner.job_study import INTERRUPTED_PREFIX, best_trial, is_rerun, trial_counts
from tuner.jobs import JobRow, JobSpec, JobStore, WorkloadRegistry
from tuner.measure import Protocol
from tuner.search import RunOptions, Stopped, run_study

log = logging.getLogger("tuner.worker")

# With no trial left to run, a resumed job still needs its final round: run_study is given a
# time budget so small that no trial starts (its documented `timeout_s`), and then decides.
FINISH_ONLY_TIMEOUT_S = 1e-9
ORPHAN_REASON = f"{INTERRUPTED_PREFIX}: its worker was lost; the trial is run again"


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
    torch_threads: int | None = Field(default=None, ge=1, le=1024)
    worker_nice: int = Field(default=0, ge=0, le=19, description=(
        "niceness of `python -m tuner worker` (e.g. 10: the API and the rest of the node go "
        "first when they want the CPU too)"))
    space_dir: str | None = Field(default=None,
                                  description="where explicit search spaces are written")
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
    """Runs jobs of one storage on one device (a GPU index, or the CPU)."""

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
        self.id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.registry = WorkloadRegistry(settings.workloads)
        self.store = JobStore(self.storage_url)
        self._optuna: optuna.storages.BaseStorage | None = None
        self._shutdown = threading.Event()
        self._stop: str | None = None  # "cancel" or "lost", set by the heartbeat thread
        self._phase: str | None = None
        if settings.torch_threads is not None:
            torch.set_num_threads(settings.torch_threads)

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        """Claim and run jobs until `shutdown()` (or a signal through `install_signals`)."""
        self.store.register_worker(self.id, host=socket.gethostname(), pid=os.getpid(),
                                   device=self.device)
        # Never log a database password that the URL may carry.
        shown = sa.engine.make_url(self.storage_url).render_as_string(hide_password=True)
        log.info("worker %s on %s, storage %s", self.id, self.device, shown)
        try:
            while not self._shutdown.is_set():
                self._check_parent()
                try:
                    self.store.beat_worker(self.id, None)
                    ran = self.run_once()
                except sqlalchemy.exc.OperationalError as exc:  # the database is away: wait
                    log.warning("worker %s: database error: %s", self.id, exc.orig)
                    ran = False
                if not ran:
                    self._shutdown.wait(self.settings.poll_s)
        finally:
            self.store.remove_worker(self.id)
            log.info("worker %s stopped", self.id)

    def run_once(self) -> bool:
        """Requeue stale jobs, claim one and run it to its end; False when none was queued."""
        self.store.requeue_stale(lease_s=self.settings.lease_s,
                                 max_attempts=self.settings.max_attempts)
        job = self.store.claim(self.id, devices=self.devices)
        if job is None:
            return False
        log.info("job %s claimed (attempt %d)", job.id, job.attempts)
        self._stop, self._phase = None, "starting"
        done = threading.Event()
        beat = threading.Thread(target=self._beat, args=(job.id, done), daemon=True,
                                name=f"heartbeat-{job.id[:8]}")
        beat.start()
        try:
            self._execute(job)
        finally:
            done.set()
            beat.join()
        return True

    def shutdown(self) -> None:
        self._shutdown.set()

    def install_signals(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.shutdown())

    def should_stop(self) -> bool:
        return self._stop is not None or self._shutdown.is_set()

    # -- one job -------------------------------------------------------------------------
    def _execute(self, job: JobRow) -> None:
        if job.cancel_requested:
            self.store.finish(job.id, self.id, "cancelled")
            return
        try:
            spec = JobSpec.from_dict(job.spec)
            remaining, stored_rec = self._prepare_study(job, spec)
            if remaining <= 0 and stored_rec is not None:
                rec = stored_rec  # killed after deciding, before the row said so
            else:
                rec = run_study(self._options(job, spec, remaining),
                                progress=_JobProgress(self, job), should_stop=self.should_stop)
        except Stopped:
            self._after_stop(job)
            return
        except Exception as exc:  # noqa: BLE001 - a job's failure is recorded; the worker goes on
            if self._stop is not None or self._shutdown.is_set():
                self._after_stop(job)
                return
            log.warning("job %s failed: %s", job.id, describe(exc))
            self._sync_progress(job)
            self.store.finish(job.id, self.id, "failed", error=describe(exc))
            return
        self._sync_progress(job)
        status = "cancelled" if self._stop == "cancel" else "succeeded"
        if self.store.finish(job.id, self.id, status, recommendation=rec):
            log.info("job %s %s", job.id, status)
        else:
            log.warning("job %s: finished, but another worker holds it now", job.id)

    def _after_stop(self, job: JobRow) -> None:
        lease = self.store.heartbeat(job.id, self.id)
        if not lease.owned:
            log.warning("job %s: lost its lease; another worker has it", job.id)
            return
        self._sync_progress(job)
        if lease.cancel_requested:
            self.store.finish(job.id, self.id, "cancelled")
            log.info("job %s cancelled", job.id)
        else:
            self.store.requeue(job.id, self.id, reason=f"requeued: worker {self.id} shut down")
            log.info("job %s requeued (shutdown)", job.id)

    def _prepare_study(self, job: JobRow, spec: JobSpec) -> tuple[int, dict[str, Any] | None]:
        """Fail orphaned RUNNING trials; return (trials left to run, the stored recommendation)."""
        storage = self._storage()
        try:
            study_id = storage.get_study_id_from_name(job.study)
        except KeyError:
            return spec.n_trials, None
        for trial in storage.get_all_trials(study_id, deepcopy=False,
                                            states=(TrialState.RUNNING,)):
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
            storage.set_trial_user_attr(trial_id, "failure_reason", ORPHAN_REASON)
            storage.set_trial_user_attr(trial_id, "failure_kind", "interrupted")
            storage.set_trial_state_values(trial_id, TrialState.FAIL)
            log.info("job %s: trial %d was left running; failed as interrupted", job.id,
                     trial.number)
        counts = trial_counts(storage.get_all_trials(study_id, deepcopy=False))
        counted = counts["complete"] + counts["failed"] + counts["pruned"]
        rec = storage.get_study_user_attrs(study_id).get(studies.RECOMMENDATION)
        return spec.n_trials - counted, rec if isinstance(rec, dict) else None

    def _options(self, job: JobRow, spec: JobSpec, remaining: int) -> RunOptions:
        s = self.settings
        return RunOptions(
            workload=self.registry.target(spec.workload), preset=spec.preset,
            trials=max(1, remaining),
            timeout_s=spec.timeout_s if remaining > 0 else FINISH_ONLY_TIMEOUT_S,
            space=self._space_argument(job, spec), fix=spec.fix_items(),
            storage=self.storage_url, study=job.study,
            device="cpu" if spec.device == "cpu" else self.device,
            objectives=spec.objectives, max_memory_bytes=spec.max_memory_bytes,
            top_k=s.top_k, final_rounds=s.final_rounds, baseline_every=s.baseline_every,
            parity_steps=s.parity_steps, sampler=s.sampler, protocol=s.protocol(),
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

    # -- progress and heartbeats ---------------------------------------------------------
    def _sync_progress(self, job: JobRow) -> None:
        """Copy the study's counts and best trial to the job row; record finished trials."""
        storage = self._storage()
        try:
            study_id = storage.get_study_id_from_name(job.study)
        except KeyError:
            return
        trials = storage.get_all_trials(study_id, deepcopy=False)
        self.store.progress(job.id, self.id, counts=trial_counts(trials), best=best_trial(trials))
        for trial in trials:
            if trial.state.is_finished() and trial.datetime_start and trial.datetime_complete:
                state = {"COMPLETE": "complete", "PRUNED": "pruned"}.get(trial.state.name,
                                                                         "failed")
                seconds = (trial.datetime_complete - trial.datetime_start).total_seconds()
                self.store.record_trial(job.id, trial.number, state, seconds)

    def _beat(self, job_id: str, done: threading.Event) -> None:
        while not done.is_set():
            try:
                lease = self.store.heartbeat(job_id, self.id, phase=self._phase)
                self.store.beat_worker(self.id, job_id)
            except sqlalchemy.exc.SQLAlchemyError as exc:  # a glitch: try again next beat
                log.warning("job %s: heartbeat failed: %s", job_id, exc)
            else:
                if not lease.owned:
                    self._stop = "lost"
                elif lease.cancel_requested:
                    self._stop = "cancel"
            self._check_parent()
            done.wait(self.settings.heartbeat_s)

    def _check_parent(self) -> None:
        parent = self.settings.parent_pid
        if parent is not None and os.getppid() != parent and not self._shutdown.is_set():
            log.warning("worker %s: its serve process %d is gone; shutting down", self.id, parent)
            self.shutdown()

    def _storage(self) -> optuna.storages.BaseStorage:
        if self._optuna is None:
            self._optuna = studies.open_storage(self.storage_url)
        return self._optuna


class _JobProgress:
    """`tuner.search.Progress` for a job: phases go out with the heartbeat, trials to the row."""

    def __init__(self, worker: Worker, job: JobRow) -> None:
        self.worker = worker
        self.job = job

    def start(self, study: str, total: int, resumed: bool) -> None:
        self.worker._phase = f"{'resumed' if resumed else 'started'}: {total} trials to run"

    def phase(self, text: str) -> None:
        self.worker._phase = text

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        self.worker._phase = f"trial {done}/{total} {state}"
        self.worker._sync_progress(self.job)


def main(storage: str | None = None, gpu: int | None = None) -> None:
    """`python -m tuner worker`: run until SIGTERM/SIGINT; the running job is requeued then."""
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


__all__ = ["FINISH_ONLY_TIMEOUT_S", "Worker", "WorkerSettings", "describe", "is_rerun", "main"]
