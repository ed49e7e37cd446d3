"""/metrics counts an interrupted trial as interrupted, as the job and the study do (issue 56).
A real worker claims a real job; its study holds a complete trial and one failed as
interrupted (what a lost worker leaves); the worker copies the progress as it does after each
trial, and the API on the same SQLite file reads the counts."""

from __future__ import annotations

import optuna
from fastapi.testclient import TestClient
from optuna.trial import TrialState

from tests.api.conftest import make_app, make_worker
from tests.api.helpers import AUTH, TINY_JOB
from tuner.service.job import JobRun
from tuner.store import keys


def test_metrics_count_an_interrupted_trial_as_interrupted(storage: str) -> None:
    worker = make_worker(storage)
    worker.start()
    try:
        with TestClient(make_app(storage)) as client:
            job_id = client.post("/v1/jobs", json=TINY_JOB, headers=AUTH).json()["id"]
            row = worker.store.claim(worker.id, devices=worker.devices)
            assert row is not None and row.id == job_id
            study = optuna.create_study(study_name=row.study, storage=worker.storage())
            done = study.ask()
            study.tell(done, 100.0)
            cut = study.ask()
            cut.set_user_attr(keys.FAILURE_REASON, f"{keys.INTERRUPTED_PREFIX}: worker lost")
            study.tell(cut, state=TrialState.FAIL)
            # A trial copied from an earlier study (`tuner.search.earlier`): the job's, not run
            # by it; /metrics had counted each such copy as a complete trial of 0 s.
            copied = study.ask()
            copied.set_user_attr(keys.COPIED_FROM, {"study": "earlier", "trial": 0})
            study.tell(copied, 90.0)
            JobRun(worker)._sync_progress(row)

            job = client.get(f"/v1/jobs/{job_id}", headers=AUTH).json()
            assert (job["n_complete"], job["n_failed"], job["n_interrupted"]) == (2, 0, 1)
            metrics = client.get("/metrics", headers=AUTH).text
    finally:
        worker.close()
    assert 'streamtune_trials_total{state="interrupted"} 1' in metrics
    assert 'streamtune_trials_total{state="failed"} 0' in metrics
    assert 'streamtune_trials_total{state="complete"} 1' in metrics
    assert "streamtune_trial_duration_seconds_count 2" in metrics  # the two it ran
