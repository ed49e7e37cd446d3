"""One job, as one of its workers runs it: membership, trials, the final round, heartbeats.

`JobRun(worker).member_of(job, claimed=...)` is a worker's time in a job (see `tuner.service.worker`
for the whole life of a worker, and `tuner.service.slots` for how workers share one job): a
thread heartbeats the job row, the worker row and the GPU lease every `TUNER_HEARTBEAT_S`, reads
back whether a cancel was requested and whether the worker is still a member, and fails the
RUNNING trials whose worker is dead; meanwhile the worker runs trials and, if every slot is
finished and it wins the finalizer role, the final round.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import sys
import threading
import time
from typing import Literal, Protocol

import optuna
import sqlalchemy.exc

from tuner.errors import Stopped
from tuner.evidence.recommendation import Recommendation
from tuner.search.options import RunOptions
from tuner.search.search import Search
from tuner.search.study import apply_gpu_defaults, open_search
from tuner.service.gatehelp import JobClaims
from tuner.service.job_errors import describe, no_config
from tuner.service.jobstore import FINISHED, WorkerStore
from tuner.service.settings import WorkerSettings
from tuner.service.slots import GAVE_UP_REASON, JobSlots, count_slots, fail_orphans
from tuner.service.spec import JobSpec, WorkloadRegistry
from tuner.service.tables import JobRow, utcnow
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.counting import TrialCounts, best_trial, count_trials, finished_state
from tuner.store.retry import Backoff, is_transient
from tuner.store.running import fail_running

log = logging.getLogger("tuner.worker")


class JobMember(Protocol):
    """What a job's run needs of the worker that is its member (`tuner.service.worker.Worker`
    implements it; this module never imports the worker, so the two do not import each other)."""

    @property
    def id(self) -> str: ...
    @property
    def settings(self) -> WorkerSettings: ...
    @property
    def store(self) -> WorkerStore: ...
    @property
    def backoff(self) -> Backoff: ...
    @property
    def stopping(self) -> threading.Event: ...
    @property
    def registry(self) -> WorkloadRegistry: ...
    @property
    def only_job(self) -> str | None:
        """The one job this worker serves (`run --gpus N`'s workers), None: any job."""
        ...

    def storage(self) -> optuna.storages.BaseStorage:
        """The Optuna storage of the jobs' studies (opened once per worker)."""
        ...

    def options_for(self, job: JobRow, spec: JobSpec) -> RunOptions:
        """The `RunOptions` this worker runs `job`'s study with."""
        ...

    def beat_in(self, job_id: str) -> None:
        """The worker's own heartbeat while in a job: its GPU lease, the database seen up, and
        the job's trials whose worker is dead failed. Raises the database's errors."""
        ...

    def db_down(self) -> None:
        """The database did not answer a heartbeat."""
        ...

    def check_parent(self) -> None:
        """Shut down when the `serve` process that started this worker is gone."""
        ...


CANCEL_READ_S = 0.25
"""How often `JobRun.should_stop` reads the job's cancel flag itself (monotonic seconds)."""


class JobRun:
    """A worker's membership of one job (one at a time). `stop` is set by the heartbeat thread:
    "cancel" (the API flagged the job) or "lost" (the worker is no longer a member)."""

    def __init__(self, worker: JobMember) -> None:
        self.worker = worker
        self._stop: str | None = None
        self._phase: str | None = None
        self._job_id: str | None = None
        """The job this worker is a member of now (None: none), whose cancel `should_stop` reads."""
        self._cancel_read_at = 0.0
        self._prepared: tuple[str, Search, float | None] | None = None
        """A job's search opened before this worker was a member of it (`prepare`)."""

    @property
    def prepared_for(self) -> str | None:
        return None if self._prepared is None else self._prepared[0]

    def prepare(self, job: JobRow) -> None:
        """Open `job`'s search before joining it, while its claimer opens the study (`run --gpus
        N`: on 4 H100s, 2026-11-28, the last trial had started 33 s after the first). Raises
        what opening raises (joining opens again and meets it where a job records it)."""
        if self._prepared is None:
            self._prepared = (job.id, *self._open_search(job))

    def discard(self) -> None:
        """Close a prepared search that no membership took."""
        if self._prepared is not None:
            self._prepared[1].close()
            self._prepared = None

    def should_stop(self) -> bool:
        """Polled by the search between trials and after each window; reads a cancel itself every
        `CANCEL_READ_S` (the heartbeat alone let three trials start after one, 2026-12-02)."""
        if self._stop is None and time.monotonic() >= self._cancel_read_at:
            self._cancel_read_at = time.monotonic() + CANCEL_READ_S
            self._read_cancel()
        return self._stop is not None or self.worker.stopping.is_set()

    def _read_cancel(self) -> bool:
        """Whether a cancel of the job is asked for, read now (`_stop` then "cancel")."""
        try:
            if self._job_id is not None and self.worker.store.get(self._job_id).cancel_requested:
                self._stop = "cancel"
        except Exception as exc:
            if not is_transient(exc):
                raise
            # The database is away: the heartbeat says so, and reads the cancel once back.
        return self._stop == "cancel"

    def member_of(self, job: JobRow, *, claimed: bool) -> bool:
        """Be a member of `job` until no trial of it is left for this worker."""
        self._stop, self._phase = None, "starting"
        self._job_id, self._cancel_read_at = job.id, 0.0
        done = threading.Event()
        beat = threading.Thread(
            target=self._beat, args=(job, done), daemon=True, name=f"heartbeat-{job.id[:8]}"
        )
        beat.start()
        try:
            return self._execute(job, claimed=claimed)
        finally:
            self.discard()  # prepared for this job, but it ended before a search was needed
            self._job_id = None
            done.set()
            beat.join()
            self._leave(job)

    def _execute(self, job: JobRow, *, claimed: bool) -> bool:
        """Run trials of the job, and its final round if it falls to this worker; False when
        this worker found nothing to do in it (every slot taken by others)."""
        if job.cancel_requested:
            self.worker.store.finish(job.id, self.worker.id, "cancelled")
            return True
        search: Search | None = None
        try:
            search, budget = self._take_prepared(job) or self._open_search(job)
            deadline = job.deadline_at
            if claimed:
                opened = self._open_job(job, search, budget)
                if isinstance(opened, Recommendation):  # killed after deciding, before the row
                    return self._finish(job, opened)
                if opened is False:
                    return True  # lost it meanwhile (cancelled, or taken for dead)
                deadline = opened
            if not claimed:
                self._count_from_the_job(search)
            finalizing, helped = self._trials(job, search, self._slots(job, deadline, search))
            if not finalizing:
                return search.done > 0 or claimed or helped
            self._phase = "final round"
            rec = self.worker.backoff.call(search.decide, what=f"job {job.id}: final round")
        except Stopped:
            self._after_stop(job)
            return True
        except Exception as exc:  # a job's failure is recorded; the worker goes on
            if is_transient(exc):
                raise  # the database is away: the loop waits for it; the job is not at fault
            if self._stop is not None or self.worker.stopping.is_set():
                self._after_stop(job)
                return True
            log.warning("job %s failed: %s", job.id, describe(exc))
            self._sync_progress(job)
            error = self._as_asked(job, describe(exc))
            self.worker.store.finish(job.id, self.worker.id, "failed", error=error)
            return True
        finally:
            if search is not None:
                search.close()
        return self._finish(job, rec)

    def _open_search(self, job: JobRow) -> tuple[Search, float | None]:
        """This worker's search of `job`, and the job's search budget (None: none)."""
        spec = JobSpec.of(job)
        progress = _JobProgress(self, job)
        search = open_search(
            self.worker.options_for(job, spec),
            progress=progress,
            should_stop=self.should_stop,
            owner=self.worker.id,
            retry=self.worker.backoff,
            storage=self.worker.storage(),
        )
        search.share_gate(
            JobClaims(
                self.worker.store,
                search.study,
                job_id=job.id,
                worker=self.worker.id,
                alive=lambda: self.worker.store.live_workers(self.worker.settings.lease_s),
                hold_s=self.worker.settings.lease_s,
                backoff=self.worker.backoff,
            )
        )
        # The same budget and patience as `python -m tuner run` on one GPU; a job of N GPUs
        # (`run --gpus N`) shares one GPU's default budget over its N workers.
        budget = apply_gpu_defaults(
            search,
            progress,
            workers=spec.max_members or 1,
            job_timeout_s=spec.timeout_s,
            job=True,
        )
        return search, budget

    def _take_prepared(self, job: JobRow) -> tuple[Search, float | None] | None:
        prepared, self._prepared = self._prepared, None
        if prepared is None:
            return None
        if prepared[0] != job.id:
            prepared[1].close()
            return None
        return prepared[1], prepared[2]

    def _trials(self, job: JobRow, search: Search, slots: JobSlots) -> tuple[bool, bool]:
        """Trials while a slot is left for this worker, then help (`_help`), and trials again
        where a slot came free meanwhile. Whether the final round fell to this worker, and
        whether it helped."""
        helped, store, me = False, self.worker.store, self.worker.id
        while True:
            search.run_trials(slots)
            # Read now, not by the next heartbeat: a cancel asked before the final round ends
            # the job without one (a repeat job, whose trials were all copied, had run it).
            if search.stopped or self._read_cancel():
                raise Stopped(f"stopped after {search.done} trials")
            # Under the slot lock: a worker that found the patience short a moment ago must not
            # take a trial after this one claimed the final round.
            if slots.locked(lambda: slots.trials_over() and store.claim_finalizing(job.id, me)):
                return True, helped
            took, freed = self._help(job, search, slots)
            helped = helped or took
            if not freed:
                return False, helped
            search.progress.phase("trials: a slot came free (a trial interrupted, or a gain)")
            search.ended = None  # the recommendation says what ended these, not the first

    def _help(self, job: JobRow, search: Search, slots: JobSlots) -> tuple[bool, bool]:
        """No trial left for this worker, and another runs trials or the final round: take the
        gate's parts that the final round will ask for (`tuner.service.gatehelp`). Whether it
        ran any, and whether it stopped for a slot come free (`JobSlots.free_again`)."""
        self._phase = "gate: helping while the others run"
        # A service worker waits for no trial to end: a queued job may need it. One of
        # `run --gpus N`'s workers serves this job alone: it stays to take what comes, a slot
        # freed included (it had helped on to the deadline, a trial short: a probe, 2026-12-08).
        wait, freed = self.worker.only_job is not None, False

        def over() -> bool:
            nonlocal freed
            if self._stop is not None or self.worker.stopping.is_set():
                return True
            if self.worker.store.get(job.id).status in FINISHED:
                return True
            freed = wait and slots.free_again()
            return freed

        return search.help_gate(over, slots.trials_over, wait=wait) > 0, freed

    def _count_from_the_job(self, search: Search) -> None:
        """The patience of every worker of the job counts the trials begun since the job was
        opened (`keys.JOB_BEGUN`, written by the claimer in `_open_job`), not since this
        worker's search opened: a worker that left the job (nothing to help with) and joins it
        again would otherwise count afresh and start trials that the patience had ruled out."""
        stored = self.worker.backoff.call(
            lambda: search.study.user_attrs.get(keys.JOB_BEGUN), what="reading the study"
        )
        if isinstance(stored, list):
            search.joined = frozenset(int(n) for n in stored)

    def _open_job(
        self, job: JobRow, search: Search, budget: float | None
    ) -> Recommendation | dt.datetime | Literal[False] | None:
        """The claimer's part before any trial: the study prepared, the start baselines, the job
        opened for trials. The recommendation where the study already holds one (its worker was
        killed after deciding, before the row said so); False where the job was lost meanwhile;
        else the job's deadline (None: none)."""
        stored = self._prepare_study(job)
        if stored is not None:
            return stored
        search.measure_baselines("start")
        begun = sorted(search.joined)  # before any member's trial: `_count_from_the_job`
        self.worker.backoff.call(
            lambda: search.study.set_user_attr(keys.JOB_BEGUN, begun),
            what=f"job {job.id}: storing the trials begun before it",
        )
        # The request's budget, or the default on a GPU (`apply_gpu_defaults`).
        deadline = None if budget is None else (utcnow() + dt.timedelta(seconds=budget))
        hardware = studies.meta(search.study)["hardware"]
        if not self.worker.store.open_trials(
            job.id, self.worker.id, hardware=hardware, deadline=deadline
        ):
            return False
        # A repeat job's trials copied from an earlier study count from now: the row had said 0
        # complete through its whole final round, while /trials listed them.
        self._sync_progress(job)
        return deadline

    def _as_asked(self, job: JobRow, text: str) -> str:
        """`text` naming a plug-in as the job did: its registered name, not its factory path,
        and its files by their names, not the server's folders (`its factory raised KeyError
        (/srv/.../my_model.py:15)` had shown a client where the server keeps its code)."""
        target = self.worker.registry.plugins.get(job.workload)
        if target is None:
            return text
        module = sys.modules.get(target.split(":")[0])
        folder = os.path.dirname(getattr(module, "__file__", None) or "")
        text = text.replace(folder + os.sep, "") if folder else text
        return text.replace(target, job.workload)

    def _finish(self, job: JobRow, rec: Recommendation) -> bool:
        counts = self._sync_progress(job)
        # A cancel asked during the final round: cancelled (it had depended on when the
        # heartbeat read it), the recommendation kept.
        status = "cancelled" if self._read_cancel() else "succeeded"
        error = None
        if rec.config is None and status == "succeeded":
            # Nothing to train with: failed, as `tuner run` exits 1 (it had served a null config).
            status, error = "failed", no_config(rec)
        # With the study's counts now (the one rule), and the job's name of a plug-in workload.
        stored = (rec if counts is None else rec.with_counts(counts)).to_dict()
        stored["workload"], error = job.workload, error and self._as_asked(job, error)
        finished = self.worker.backoff.call(
            lambda: self.worker.store.finish(
                job.id, self.worker.id, status, error=error, recommendation=stored
            ),
            what=f"job {job.id}: finishing",
        )
        if finished:
            log.info("job %s %s", job.id, status)
        else:
            log.warning("job %s: decided, but this worker no longer holds it", job.id)
        return True

    def _slots(self, job: JobRow, deadline: dt.datetime | None, search: Search) -> JobSlots:
        return JobSlots(
            self.worker.store,
            self.worker.storage(),
            job=job,
            deadline=deadline,
            worker=self.worker.id,
            hold_s=self.worker.settings.lease_s,
            backoff=self.worker.backoff,
            out_of_patience=search.out_of_patience,
        )

    def _after_stop(self, job: JobRow) -> None:
        lease = self.worker.store.heartbeat(job.id, self.worker.id)
        if not lease.owned:
            log.warning("job %s: this worker is no longer one of its workers", job.id)
            return
        self._sync_progress(job)
        if lease.cancel_requested:
            if self.worker.store.finish(job.id, self.worker.id, "cancelled"):
                log.info("job %s cancelled", job.id)
        elif self.worker.store.requeue(
            job.id,
            self.worker.id,
            reason=f"requeued: worker {self.worker.id} shut down",
            lease_s=self.worker.settings.lease_s,
        ):
            log.info("job %s requeued (shutdown)", job.id)
        else:
            log.info("job %s: left it to its other workers (shutdown)", job.id)

    def _leave(self, job: JobRow) -> None:
        """Stop being a member; a trial of this worker still RUNNING (given up) is failed."""
        try:
            fail_running(
                self.worker.storage(),
                job.study,
                lambda t: t.user_attrs.get(keys.OWNER) == self.worker.id,
                GAVE_UP_REASON,
            )
            self.worker.store.leave(self.worker.id)
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning(
                "job %s: could not leave it (%s); the others take this worker for dead "
                "after %.0f s",
                job.id,
                type(exc).__name__,
                self.worker.settings.lease_s,
            )

    def _prepare_study(self, job: JobRow) -> Recommendation | None:
        """Fail the orphaned RUNNING trials; the stored recommendation if every slot is done."""
        storage = self.worker.storage()
        others = self.worker.store.live_workers(self.worker.settings.lease_s) - {self.worker.id}
        orphans = fail_orphans(storage, job.study, alive=others, unowned_after_s=0.0)
        for number in orphans:
            log.info("job %s: trial %d was left running; failed as interrupted", job.id, number)
        if count_slots(storage, job, None).free > 0:
            return None
        found = storage.get_study_id_from_name(job.study)
        rec = storage.get_study_user_attrs(found).get(keys.RECOMMENDATION)
        return Recommendation.from_dict(rec) if isinstance(rec, dict) else None

    # -- progress, heartbeats and dead workers -------------------------------------------
    def _sync_progress(self, job: JobRow) -> TrialCounts | None:
        """Copy the study's counts and best trial to the job row; record the trials it ran
        once (not those copied from an earlier study). The counts; None: not read."""
        try:
            storage = self.worker.storage()
            found = storage.get_study_id_from_name(job.study)
            trials = storage.get_all_trials(found, deepcopy=False)
            counts = count_trials(trials)
            self.worker.store.progress(
                job.id, self.worker.id, counts=counts, best=best_trial(trials), phase=self._phase
            )
            recorded = self.worker.store.recorded_trials(job.id)
            for trial in trials:
                if (
                    trial.number in recorded
                    or keys.COPIED_FROM in trial.user_attrs  # /metrics counted them, 0 s each
                    or not trial.state.is_finished()
                    or not trial.datetime_start
                    or not trial.datetime_complete
                ):
                    continue
                state = finished_state(trial)
                seconds = (trial.datetime_complete - trial.datetime_start).total_seconds()
                self.worker.store.record_trial(job.id, trial.number, state, seconds)
        except KeyError:
            return None  # no study yet
        except Exception as exc:
            if not is_transient(exc):
                raise
            why = type(exc).__name__
            log.warning("job %s: progress not copied (%s); the next trial copies it", job.id, why)
            return None
        return counts

    def _beat(self, job: JobRow, done: threading.Event) -> None:
        while not done.is_set():
            try:
                lease = self.worker.store.heartbeat(job.id, self.worker.id, phase=self._phase)
                self.worker.beat_in(job.id)
            except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
                self.worker.db_down()
                log.warning("job %s: heartbeat failed: %s", job.id, type(exc).__name__)
            else:
                if not lease.owned:
                    self._stop = "lost"
                elif lease.cancel_requested:
                    self._stop = "cancel"
            self.worker.check_parent()
            done.wait(self.worker.settings.heartbeat_s)


class _JobProgress:
    """`tuner.search.Progress` for a job: phases go out with the heartbeat, trials to the row."""

    def __init__(self, run: JobRun, job: JobRow) -> None:
        self.run = run
        self.job = job

    def start(self, study: str, total: int, resumed: bool) -> None:
        self.run._phase = f"{'resumed' if resumed else 'started'}: {total} trials in all"

    def phase(self, text: str) -> None:
        self.run._phase = text
        # Also in the worker's log, timed: the study keeps each worker's seconds by phase, not
        # when each part ran (on 4 H200s, 2026-11-28, who profiled when was a guess).
        log.info("job %s: %s", self.job.id, text)

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        self.run._phase = f"{done} trial{'s' * (done != 1)} run here, the last {state}"
        self.run._sync_progress(self.job)
