"""One job's study shared by several workers: trial slots, trials whose worker died, finalizing.

A job asks for `trials` counted trials (`tuner.store.counting.count_trials`: complete, failed and
pruned trials that were not cut short by the service). Its workers share the Optuna study
`job-<id>` through ask/tell, with TPE's constant liar (`tuner.search.options.make_sampler`) so
that a trial being measured counts as a bad result for the others' sampling instead of being drawn
again.

Slots: a worker takes a trial only under the job's slot lock (`SlotLocks.lock_slots`: a guarded
UPDATE of the job row, which expires after `hold_s` so that a worker dying inside it cannot
block the job). Holding it, the worker counts the counted and the RUNNING trials, and asks and
samples a new one only when their sum is below `trials`; so at most `trials` trials count,
each trial number is taken once, and the sampler sees every trial being measured. A worker whose
lock expired and was taken by another before it gave it back fails the trial it just asked
(interrupted, not counted), so an expiry never makes one trial too many.

Trials whose worker died: every trial carries its worker's id (`tuner.store.keys.OWNER`); a
RUNNING trial whose worker is not alive (no heartbeat for `lease_s`) is failed as
`interrupted: ...` (`fail_orphans`), which frees its slot, and another worker runs a new trial.
A RUNNING trial with no owner (its worker died between asking it and writing its id) is failed
once it is `lease_s` old, or at once by a worker that claims the job from the queue (nobody else
can be running it then).

Finalizing: a worker that finds no free slot and no RUNNING trial (`SlotCount.finished`) claims
the job's finalizer role (`Membership.claim_finalizing`, atomic); only that worker runs the final
round, so the speedups are measured on one device.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Collection

import optuna
from optuna.trial import FrozenTrial

from tuner.service.slotlocks import SlotLocks
from tuner.service.tables import JobRow, utcnow
from tuner.store import keys
from tuner.store.counting import count_trials
from tuner.store.keys import INTERRUPTED_PREFIX
from tuner.store.keys import OWNER as OWNER_ATTR
from tuner.store.retry import Backoff
from tuner.store.running import fail_running, study_id

ORPHAN_REASON = f"{INTERRUPTED_PREFIX}: its worker was lost; the trial is run again"
EXPIRED_REASON = (
    f"{INTERRUPTED_PREFIX}: the job's slot lock expired while this trial was asked; "
    "the trial is run again"
)
GAVE_UP_REASON = f"{INTERRUPTED_PREFIX}: its worker gave it up; the trial is run again"


@dataclasses.dataclass(frozen=True)
class SlotCount:
    counted: int
    running: int
    trials: int
    past_deadline: bool
    copied: int = 0  # of `counted`: taken from an earlier study (`tuner.search.earlier`), not run

    @property
    def tally(self) -> str:
        """The counted trials as run and taken: a repeat job's copies had been said as run."""
        taken = f", {self.copied} taken from an earlier study" if self.copied else ""
        return f"{self.counted - self.copied} run{taken}"

    @property
    def free(self) -> int:
        return 0 if self.past_deadline else self.trials - self.counted - self.running

    @property
    def finished(self) -> bool:
        """Every slot is finished (or the job's time is up and none runs): time to decide."""
        return self.running == 0 and (self.counted >= self.trials or self.past_deadline)


def count_slots(
    storage: optuna.storages.BaseStorage, job: JobRow, deadline: dt.datetime | None
) -> SlotCount:
    """The slots of `job`'s study: the counting rule against the trials the job asked for (the
    row's `trials`, its one stored place), and whether its time is up."""
    found = study_id(storage, job.study)
    trials = [] if found is None else storage.get_all_trials(found, deepcopy=False)
    counts = count_trials(trials)
    copies = [t for t in trials if keys.COPIED_FROM in t.user_attrs]
    return SlotCount(
        counted=counts.counted,
        running=counts.running,
        trials=job.trials,
        past_deadline=deadline is not None and utcnow() > deadline,
        copied=count_trials(copies).counted,
    )


def fail_orphans(
    storage: optuna.storages.BaseStorage,
    study: str,
    *,
    alive: Collection[str],
    unowned_after_s: float,
) -> list[int]:
    """Fail RUNNING trials whose worker is not alive (module doc); their numbers."""
    now = dt.datetime.now()  # Optuna stores naive local times

    def orphaned(trial: FrozenTrial) -> bool:
        owner = trial.user_attrs.get(OWNER_ATTR)
        if owner is not None:
            return owner not in alive
        started = trial.datetime_start or now
        return (now - started).total_seconds() >= unowned_after_s

    return fail_running(storage, study, orphaned, ORPHAN_REASON)


class JobSlots:
    """`tuner.search.options.TrialSlots` of a shared job: slots taken under the job's slot lock."""

    def __init__(
        self,
        store: SlotLocks,
        storage: optuna.storages.BaseStorage,
        *,
        job: JobRow,
        deadline: dt.datetime | None,
        worker: str,
        hold_s: float,
        backoff: Backoff,
        out_of_patience: Callable[[], bool] = lambda: False,
    ) -> None:
        """`out_of_patience`: whether the search's patience (every worker's trials) has ended
        the job's trials, with slots left free (`Search.out_of_patience`)."""
        self.store = store
        self.storage = storage
        self.job = job
        self.job_id = job.id
        self.study = job.study
        self.deadline = deadline
        self.worker = worker
        self.hold_s = hold_s
        self.backoff = backoff
        self.out_of_patience = out_of_patience
        self.last: SlotCount | None = None

    def take(
        self, create: Callable[[], optuna.Trial], prepare: Callable[[optuna.Trial], None]
    ) -> optuna.Trial | None:
        return self.backoff.call(
            lambda: self._take_once(create, prepare), what=f"job {self.job_id}: taking a trial slot"
        )

    def more(self) -> bool:
        return self.last is not None and self.last.free > 1

    def ended(self) -> tuple[str, str]:
        count = self.last
        if count is None:
            return "request", "this worker is stopping"
        if count.past_deadline:
            return (
                "timeout",
                f"timeout: the job's search budget ran out after {count.counted} trials",
            )
        if count.free > 0:  # the slots were free, but a worker was deciding
            return "others", f"another worker of the job ended its trials ({count.tally})"
        return "trials", f"every trial asked for was run or taken ({count.tally})"

    def locked(self, fn: Callable[[], bool]) -> bool:
        """`fn()` under the job's slot lock: no worker takes a trial meanwhile. False without
        running it where the lock was not taken (this worker is stopping)."""
        if not self._lock():
            return False
        try:
            return fn()
        finally:
            self.store.unlock_slots(self.job_id, self.worker)

    def count(self) -> SlotCount:
        return self.backoff.call(
            lambda: count_slots(self.storage, self.job, self.deadline),
            what=f"job {self.job_id}: counting trials",
        )

    def trials_over(self) -> bool:
        """No trial of the job is left to run: every slot is counted or the job's time is up
        (`SlotCount.finished`), or no trial runs and the patience has stopped the trials:
        without that, 2 H200s' workers had run on to the deadline (2026-11-28)."""
        count = self.count()
        return count.finished or (count.running == 0 and self.out_of_patience())

    def free_again(self) -> bool:
        """A slot this worker may take has come free while it had none: a trial failed as
        interrupted (its worker dead or shut down) frees its slot, and a gain after the patience
        had ended the trials frees the slots it left; none once the final round is claimed."""
        if self.count().free <= 0 or self.out_of_patience():
            return False
        return not self.backoff.call(
            lambda: self.store.finalizing(self.job_id), what=f"job {self.job_id}: reading it"
        )

    def _take_once(
        self, create: Callable[[], optuna.Trial], prepare: Callable[[optuna.Trial], None]
    ) -> optuna.Trial | None:
        if not self._lock():
            self.last = None  # shutting down: no count, and no trial after this one
            return None
        trial: optuna.Trial | None = None
        try:
            self.last = count_slots(self.storage, self.job, self.deadline)
            # A finalizer claims under this lock once the trials are over (`JobRun`), the
            # patience's end included, which leaves slots free: none is taken after it.
            if self.last.free > 0 and not self.store.finalizing(self.job_id):
                trial = create()
                prepare(trial)
            exclusive = self.store.unlock_slots(self.job_id, self.worker)
        except BaseException:
            if trial is not None:
                self._abandon(trial, GAVE_UP_REASON)
            raise
        if trial is not None and not exclusive:
            self._abandon(trial, EXPIRED_REASON)
            return self._take_once(create, prepare)
        return trial

    def _lock(self) -> bool:
        return self.store.wait_for_slots(
            self.job_id, self.worker, hold_s=self.hold_s, stop=self.backoff.stop
        )

    def _abandon(self, trial: optuna.Trial, reason: str) -> None:
        number = trial.number
        self.backoff.call(
            lambda: fail_running(self.storage, self.study, lambda t: t.number == number, reason),
            what=f"job {self.job_id}: giving trial {number} up",
        )
