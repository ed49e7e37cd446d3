"""The gate's work shared among one job's workers: each part claimed once, idle workers helping.

On one GPU a 1.1B job spent 155-449 s in the gate after its trials, its parts one after another
(`docs/benchmarks/README.md`, the held-out rows: reference 37, envelope 99, twin 148, config 51 s
on `llama-1b`), while with `run --gpus N` the workers whose trials had ended sat idle and the
finalizer ran the whole gate on its own GPU. Now a worker that finds no trial slot left takes
what does not compare speeds while the others run their trials or decide
(`tuner.search.helping`): the envelope, the gates of the contenders and of the trials still
running, then the profiles. The claims that keep each of those parts on one worker are here.

A claim is a study attribute `CLAIM_PREFIX` + the verdict's or envelope's key holding the
claiming worker's id ("" once given back). It is taken under the job's slot lock
(`SlotLocks.lock_slots`), so two workers never both take one key; a claim whose worker has no
live heartbeat (`live_workers`) is taken over, so a worker that died mid-gate never blocks the
job.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import optuna

from tuner.service.slotlocks import SlotLocks
from tuner.store.retry import Backoff

CLAIM_PREFIX = "claim/"
WAIT_S = 2.0
"""How often a worker waiting for another's part reads the study again."""


class JobClaims:
    """`tuner.search.gating.parity.GateClaims` of one job's study, for one of its workers."""

    wait_s = WAIT_S

    def __init__(
        self,
        locks: SlotLocks,
        study: optuna.Study,
        *,
        job_id: str,
        worker: str,
        alive: Callable[[], Collection[str]],
        hold_s: float,
        backoff: Backoff,
    ) -> None:
        self.locks = locks
        self.study = study
        self.job_id = job_id
        self.worker = worker
        self.alive = alive
        self.hold_s = hold_s
        self.backoff = backoff

    def take(self, key: str) -> bool:
        return self.backoff.call(lambda: self._take(key), what=f"job {self.job_id}: claiming {key}")

    def holder(self, key: str) -> str | None:
        return self.backoff.call(
            lambda: self._holder(key), what=f"job {self.job_id}: reading {key}"
        )

    def release(self, key: str) -> None:
        def give_back() -> None:
            if self._attrs().get(CLAIM_PREFIX + key) == self.worker:
                self.study.set_user_attr(CLAIM_PREFIX + key, "")

        self.backoff.call(give_back, what=f"job {self.job_id}: giving {key} back")

    def _take(self, key: str) -> bool:
        locked = self._lock()
        try:
            if self._holder(key) is not None:
                return False
            self.study.set_user_attr(CLAIM_PREFIX + key, self.worker)
            return True
        finally:
            if locked:
                self.locks.unlock_slots(self.job_id, self.worker)

    def _holder(self, key: str) -> str | None:
        found = self._attrs().get(CLAIM_PREFIX + key)
        if not found or found == self.worker:
            return None
        return str(found) if found in self.alive() else None

    def _lock(self) -> bool:
        """The job's slot lock, held for one claim. Not had within `hold_s` (the job ended,
        so no trial is taken any more, or its holder died and the lock has not expired yet):
        the claim goes on without it, as a job's last parts are not raced for."""
        return self.locks.wait_for_slots(
            self.job_id,
            self.worker,
            hold_s=self.hold_s,
            stop=self.backoff.stop,
            within_s=self.hold_s,
        )

    def _attrs(self) -> dict[str, object]:
        return dict(self.study.user_attrs)
