"""A signalled worker whose job is in a part that polls nothing (a gate's reference run, a
compile) hands the job back itself before `serve`'s pool kills it: a Ctrl-C of `serve` during a
gate had left the job running with an attempt charged and its trial RUNNING (a user's probe,
2026-12-06). A real worker, a real job on SQLite, the job's study in Optuna."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from tests.api.conftest import make_worker
from tuner.request import JobSpec
from tuner.service.jobstore import JobStore
from tuner.service.pool import STOP_GRACE_S
from tuner.service.slots import GAVE_UP_REASON
from tuner.service.worker import GIVE_BACK_S
from tuner.store import keys


def test_a_signalled_worker_hands_back_the_job_it_holds_and_exits(storage: str) -> None:
    assert GIVE_BACK_S < STOP_GRACE_S  # before the pool's kill, with time to write
    store = JobStore(storage)
    worker = make_worker(storage)
    worker.start()
    try:
        job = store.create(JobSpec(workload="mlp", preset="tiny", device="cpu"), owner="alice")
        row = worker.store.claim(worker.id, devices=worker.devices)
        assert row is not None and row.id == job.id and store.get(job.id).attempts == 1
        study = optuna.create_study(study_name=row.study, storage=worker.storage())
        running = study.ask()  # this worker's trial, in the gate's reference run say
        running.set_user_attr(keys.OWNER, worker.id)
        exits: list[int] = []
        worker.give_back(exit_process=exits.append)  # no job held: nothing, no exit
        assert exits == [] and store.get(job.id).status == "running"
        worker._member_job = row  # as while `_member_of` runs the job
        worker.give_back(exit_process=exits.append)
        assert exits == [0]
        after = store.get(job.id)
        assert (after.status, after.worker, after.attempts) == ("queued", None, 0)
        assert after.error == f"requeued: worker {worker.id} shut down"
        (trial,) = optuna.load_study(study_name=row.study, storage=storage).trials
        assert trial.state == TrialState.FAIL
        assert trial.user_attrs[keys.FAILURE_REASON] == GAVE_UP_REASON
    finally:
        worker.close()
        store.close()
