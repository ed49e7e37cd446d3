"""A real worker (in this process) running real tiny jobs: results, cancel, requeue, resume."""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy as sa
import torch
from fastapi.testclient import TestClient
from optuna.trial import TrialState

from tests.api.conftest import EXPLICIT_SPACE, SMALL, Finished, make_app, make_worker
from tests.api.helpers import ADMIN_AUTH, AUTH, OTHER_AUTH, TINY_JOB, wait_for
from tests.trainers import own_workloads
from tests.tuner.workloads_for_tests import INJECTED
from trainers import LoopConfig
from tuner.errors import Interrupted, Stopped, TunerError
from tuner.evidence.reader import list_studies, recommendation
from tuner.evidence.verdicts import CPU_EXPLANATION
from tuner.search.gating.memo import MEMO_ENV
from tuner.search.study import run_study
from tuner.search.trials import trials_without_gain
from tuner.service import job as job_module
from tuner.service.jobstore import JobStore
from tuner.service.settings import WorkerSettings, load_settings
from tuner.service.slots import ORPHAN_REASON
from tuner.service.spec import JobSpec
from tuner.service.tables import JobRow
from tuner.service.worker import Worker
from tuner.store.counting import TrialCounts
from tuner.store.counting import count_trials as trial_counts
from tuner.store.keys import JOB_BEGUN
from tuner.store.keys import STOPPED as STOPPED_ATTR

# -- a finished job and what every endpoint says about it ------------------------------------


def test_a_finished_job_reports_its_trials_and_best(finished: Finished) -> None:
    job, client = finished.job, finished.client
    assert job["n_complete"] + job["n_failed"] + job["n_pruned"] == job["trials"] == 3
    assert job["attempts"] == 1 and job["has_recommendation"] and job["hardware"] == "cpu"
    assert job["started_at"] and job["finished_at"] and job["error"] is None
    assert job["fastest_trial"]["throughput"] > 0
    assert job["space"] == EXPLICIT_SPACE | {"sync_interval": {"low": 1, "high": 4, "log": False}}
    best = client.get(job["links"]["best"], headers=AUTH)
    assert best.status_code == 200
    rec = best.json()
    assert rec["study"] == job["study"] and rec["trial_counts"]["complete"] == job["n_complete"]
    LoopConfig.from_dict(rec["config"])
    trials = client.get(job["links"]["trials"], headers=AUTH).json()
    assert trials["total"] == 3 and [t["number"] for t in trials["items"]] == [0, 1, 2]
    for trial in trials["items"]:
        assert trial["counted"] and not trial["stopped"] and trial["state"] == "complete"
        config = trial["config"]
        assert config["num_streams"] in (1, 2) and 1 <= config["sync_interval"] <= 4
        assert config["sync_mode"] in ("synchronize", "event")
        assert config["num_workers"] == 0 and config["pin_memory"] is True  # fixed and pinned
        low, high = trial["ci95"]
        assert low <= trial["throughput"] <= high and len(trial["windows"]) == 3
        assert trial["duration_s"] > 0 and trial["started_at"].endswith("Z")
    page = client.get(job["links"]["trials"], params={"limit": 1, "offset": 2}, headers=AUTH).json()
    assert [t["number"] for t in page["items"]] == [2] and page["total"] == 3


def test_a_finished_job_serves_its_report_and_its_profiles(finished: Finished) -> None:
    job, client = finished.job, finished.client
    rec = client.get(job["links"]["best"], headers=AUTH).json()
    # Profiled on the CPU: the verdicts say so, with the figures behind them.
    assert set(rec["verdicts"]) == {"pytorch-default", "seed-baseline", "recommended"}
    for found in rec["verdicts"].values():
        assert found["kind"] == "unknown" and found["explanation"] == CPU_EXPLANATION
        assert found["figures"]["step_ms"] > 0
    assert rec["explanation"] and rec["profile_errors"] == {}
    page = client.get(job["links"]["report"], headers=AUTH)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert job["study"] in page.text and "Plotly.newPlot" in page.text
    assert client.get("/v1/jobs/nope/report", headers=AUTH).status_code == 404
    assert client.get(f"/v1/jobs/{job['id']}/report").status_code == 401


def test_studies_list_the_jobs_and_the_local_runs(finished: Finished) -> None:
    """An admin token sees every study; a token sees its jobs' (tests/api/test_ownership.py)."""
    client, job = finished.client, finished.job
    listed = client.get("/v1/studies", headers=ADMIN_AUTH).json()
    by_name = {s["name"]: s for s in listed["items"]}
    assert set(by_name) == {job["study"], finished.local_study} and listed["total"] == 2
    local = by_name[finished.local_study]
    assert local["job_id"] is None and local["links"]["job"] is None
    assert (local["workload"], local["preset"], local["hardware"]) == ("mlp", "tiny", "cpu")
    assert local["fingerprint"]["device_type"] == "cpu" and local["trials"]["complete"] == 2
    assert local["recommended"] == finished.local_rec["config"]
    # One name per meaning (issue 56): `best` is the recommendation, this the fastest trial.
    assert "best" not in local and local["fastest_trial"]["throughput"] > 0
    mine = by_name[job["study"]]
    assert mine["job_id"] == job["id"] and mine["links"]["job"] == job["links"]["self"]
    assert client.get(job["links"]["study"], headers=AUTH).json() == mine
    local_best = client.get(f"/v1/studies/{finished.local_study}/best", headers=ADMIN_AUTH).json()
    assert local_best == json.loads(json.dumps(finished.local_rec))
    page = client.get("/v1/studies", params={"limit": 1, "offset": 1}, headers=ADMIN_AUTH).json()
    assert page["items"][0]["name"] == sorted(by_name)[1]
    own = client.get("/v1/studies", headers=AUTH).json()
    assert [s["name"] for s in own["items"]] == [job["study"]] and own["total"] == 1


def test_unknown_studies_are_404_and_undecided_ones_409(finished: Finished) -> None:
    client = finished.client
    for path in ("/v1/studies/nope", "/v1/studies/nope/best"):
        for headers in (AUTH, ADMIN_AUTH):
            response = client.get(path, headers=headers)
            assert response.status_code == 404
            assert "no study named 'nope'" in response.json()["detail"]
    optuna.create_study(study_name="undecided", storage=finished.storage)
    try:
        response = client.get("/v1/studies/undecided/best", headers=ADMIN_AUTH)
        assert response.status_code == 409 and "no recommendation" in response.json()["detail"]
        assert client.get("/v1/studies/undecided", headers=ADMIN_AUTH).json()["workload"] is None
    finally:
        optuna.delete_study(study_name="undecided", storage=finished.storage)


def test_recommendations_pick_the_best_finished_job(finished: Finished) -> None:
    client, job = finished.client, finished.job
    hit = client.get(
        "/v1/recommendations",
        params={"workload": "mlp", "preset": "tiny", "gpu": "cpu"},
        headers=AUTH,
    )
    assert hit.status_code == 200
    assert hit.json()["job_id"] == job["id"] and hit.json()["gpu"] == "cpu"
    assert hit.json()["config"] == client.get(job["links"]["best"], headers=AUTH).json()["config"]
    # A GPU's name in another case finds it (`gpu=CPU` had been a 404).
    upper = client.get(
        "/v1/recommendations",
        params={"workload": "mlp", "preset": "tiny", "gpu": "CPU"},
        headers=AUTH,
    )
    assert upper.status_code == 200 and upper.json()["gpu"] == "cpu", upper.text
    miss = client.get(
        "/v1/recommendations",
        params={"workload": "mlp", "preset": "tiny", "gpu": "NVIDIA H100"},
        headers=AUTH,
    )
    assert miss.status_code == 404 and "'NVIDIA-H100'" in miss.json()["detail"]
    assert hit.json()["model_args"] == {}
    # A library model's options name its shape; a built-in takes none, and a malformed one is
    # the query's error.
    query = {"workload": "mlp", "preset": "tiny", "gpu": "cpu"}
    for model_arg, said in [("batch=4", "takes no model args"), ("batch", "key=value")]:
        bad = client.get(
            "/v1/recommendations", params=query | {"model_arg": model_arg}, headers=AUTH
        )
        assert bad.status_code == 422 and said in bad.text, bad.text
    # A precision the job did not train in finds nothing; one that is no precision is refused.
    in_float8 = client.get(
        "/v1/recommendations", params=query | {"precision": "float8"}, headers=AUTH
    )
    assert in_float8.status_code == 404 and "precision='float8'" in in_float8.text
    bad = client.get("/v1/recommendations", params=query | {"precision": "fp9"}, headers=AUTH)
    assert bad.status_code == 422 and "precision" in bad.text and "bf16-autocast" in bad.text
    # A workload the server does not run is the query's error, naming what it runs.
    unknown = client.get("/v1/recommendations", params=query | {"workload": "mpl"}, headers=AUTH)
    assert unknown.status_code == 422 and "'mpl'" in unknown.text and "transformer" in unknown.text
    assert unknown.json()["detail"][0]["loc"] == ["query", "workload"]
    path = client.get("/v1/recommendations", params=query | {"workload": "a.b:c"}, headers=AUTH)
    assert path.status_code == 422 and "TUNER_WORKLOADS" in path.text  # as POST /v1/jobs says
    preset = client.get("/v1/recommendations", params=query | {"preset": "huge"}, headers=AUTH)
    assert preset.status_code == 422 and "no preset 'huge': allowed tiny" in preset.text
    assert preset.json()["detail"][0]["loc"] == ["query", "preset"]
    missing = client.get("/v1/recommendations", params={"workload": "mlp"}, headers=AUTH)
    assert missing.status_code == 422
    assert {tuple(e["loc"]) for e in missing.json()["detail"]} == {
        ("query", "preset"),
        ("query", "gpu"),
    }


def test_metrics_count_jobs_and_trials(finished: Finished) -> None:
    response = finished.client.get("/metrics", headers=AUTH)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = dict(
        line.rsplit(" ", 1) for line in response.text.splitlines() if not line.startswith("#")
    )
    assert lines['streamtune_jobs{state="succeeded"}'] == "1"
    assert lines['streamtune_trials_total{state="complete"}'] == str(finished.job["n_complete"])
    assert lines["streamtune_trial_duration_seconds_count"] == "3"
    assert lines['streamtune_trial_duration_seconds_bucket{le="+Inf"}'] == "3"
    assert float(lines["streamtune_trial_duration_seconds_sum"]) > 0


# -- a worker in a thread ------------------------------------------------------------------


@pytest.fixture
def running(storage: str) -> Iterator[tuple[TestClient, Worker]]:
    """A client and a worker looping in a thread (transformer-sized windows: ~0.1 s each)."""
    worker = make_worker(storage, measure_windows=5, measure_window_steps=20)
    thread = threading.Thread(target=worker.run, daemon=True)
    with TestClient(make_app(storage)) as client:
        thread.start()
        try:
            yield client, worker
        finally:
            worker.shutdown()
            thread.join(timeout=60)
            assert not thread.is_alive()


def _job(client: TestClient, job: dict[str, Any], auth: dict[str, str] = AUTH) -> dict[str, Any]:
    got: dict[str, Any] = client.get(job["links"]["self"], headers=auth).json()
    return got


def test_healthz_counts_live_workers(running: tuple[TestClient, Worker]) -> None:
    client, _ = running
    health = wait_for(
        lambda: (h := client.get("/healthz").json())["workers_alive"] and h,
        timeout_s=20,
        what="the worker to register",
    )
    assert health == {"status": "ok", "database": True, "workers_alive": 1}


def test_a_repeat_job_copies_no_more_than_its_trials_and_says_which_are_copies(
    monkeypatch: pytest.MonkeyPatch, running: tuple[TestClient, Worker]
) -> None:
    """A job of 1 trial after one of 3 ended with 3 counted trials, all copies, and `/trials`
    did not say they were (a new API client's trial). Another owner's job of the same request
    copies nothing: it named the first owner's job, which that owner could not see (a probe of
    the service, 2026-12-05)."""
    monkeypatch.setenv(MEMO_ENV, "on")
    client, _ = running

    def finished(body: dict[str, Any], auth: dict[str, str] = AUTH) -> dict[str, Any]:
        job = client.post("/v1/jobs", json=TINY_JOB | body, headers=auth).json()
        return wait_for(
            lambda: (j := _job(client, job, auth))["status"] == "succeeded" and j,
            timeout_s=240,
            what="the job to succeed",
        )

    first = finished({"trials": 3})
    seen: list[int] = []  # the row's count when the repeat job's final round begins
    said = job_module._JobProgress.phase

    def phase(progress: Any, text: str) -> None:
        if text.startswith("final round: top configs"):
            seen.append(progress.run.worker.store.get(progress.job.id).n_complete)
        said(progress, text)

    monkeypatch.setattr(job_module._JobProgress, "phase", phase)
    again = finished({"trials": 1})
    assert seen == [again["n_complete"]] and seen[0] >= 1  # the copy counted from the start
    assert again["n_complete"] + again["n_failed"] + again["n_pruned"] == 1
    # Its one trial a copy: said as taken, where it had been said as run.
    assert again["search_ended"].endswith("(0 run, 1 taken from an earlier study)"), again
    (copy,) = client.get(again["links"]["trials"], headers=AUTH).json()["items"]
    originals = client.get(first["links"]["trials"], headers=AUTH).json()["items"]
    assert copy["copied_from"]["study"] == first["study"] and copy["duration_s"] is None
    fastest = max(originals, key=lambda t: t["throughput"] or 0.0)
    assert copy["copied_from"]["trial"] == fastest["number"] and copy["counted"]
    assert all(t["copied_from"] is None and t["duration_s"] > 0 for t in originals)
    theirs = finished({"trials": 1}, OTHER_AUTH)
    (own,) = client.get(theirs["links"]["trials"], headers=OTHER_AUTH).json()["items"]
    assert own["copied_from"] is None and own["duration_s"] > 0
    best = client.get(theirs["links"]["best"], headers=OTHER_AUTH).json()
    assert first["id"] not in json.dumps(best)


def test_cancel_stops_a_running_job_and_keeps_its_trials(
    running: tuple[TestClient, Worker],
) -> None:
    client, _ = running
    body = TINY_JOB | {"workload": "transformer", "trials": 200}
    job = client.post("/v1/jobs", json=body, headers=AUTH).json()
    wait_for(lambda: _job(client, job)["n_complete"] >= 1, timeout_s=60, what="a complete trial")
    cancel = client.post(job["links"]["cancel"], headers=AUTH)
    assert cancel.status_code == 200
    assert cancel.json()["status"] == "running" and cancel.json()["cancel_requested"]
    ended = wait_for(
        lambda: (j := _job(client, job))["status"] == "cancelled" and j,
        timeout_s=30,
        what="the job to end as cancelled",
    )
    assert ended["finished_at"] and ended["n_complete"] >= 1 and ended["phase"] is None
    trials = client.get(job["links"]["trials"], params={"limit": 200}, headers=AUTH).json()
    assert 1 <= trials["total"] < 200
    assert all(t["state"] != "running" for t in trials["items"])
    assert sum(t["state"] == "complete" for t in trials["items"]) == ended["n_complete"]
    for trial in trials["items"]:
        if trial["stopped"]:  # stopped at a window: pruned, with what it measured, and why
            assert trial["state"] == "pruned" and not trial["counted"]
            assert trial["pruned_reason"].startswith("stopped at a window: the job was cancelled")
            assert 1 <= len(trial["windows"]) < 5
    assert client.get(job["links"]["best"], headers=AUTH).status_code == 409
    assert client.post(job["links"]["cancel"], headers=AUTH).status_code == 409


def test_a_cancel_is_seen_before_the_next_trial_without_waiting_for_the_heartbeat(
    storage: str,
) -> None:
    """With a heartbeat far apart (60 s here, 5 s by default), the worker still reads the cancel
    between trials (`JobRun.should_stop`): at most the trial running at the cancel, and one
    that began before its next read, start after it. The heartbeat alone let three tiny trials
    start after one (a new user's trial, 2026-12-02)."""
    worker = make_worker(storage, heartbeat_s=60.0, measure_windows=2, measure_window_steps=5)
    thread = threading.Thread(target=worker.run_once, daemon=True)
    with TestClient(make_app(storage)) as client:
        job = client.post(
            "/v1/jobs", json=TINY_JOB | {"trials": 200, "patience": 0}, headers=AUTH
        ).json()
        thread.start()
        wait_for(lambda: _job(client, job)["n_complete"] >= 2, timeout_s=60, what="two trials")
        assert client.post(job["links"]["cancel"], headers=AUTH).status_code == 200
        cancelled = dt.datetime.now(dt.UTC)
        ended = wait_for(
            lambda: (j := _job(client, job))["status"] == "cancelled" and j,
            timeout_s=30,
            what="the job to end as cancelled",
        )
        thread.join(timeout=60)
        trials = client.get(job["links"]["trials"], params={"limit": 200}, headers=AUTH).json()
    after = [t for t in trials["items"] if dt.datetime.fromisoformat(t["started_at"]) > cancelled]
    assert len(after) <= 1, (len(after), trials["total"])
    assert dt.datetime.fromisoformat(ended["finished_at"]) - cancelled < dt.timedelta(seconds=30)


@pytest.mark.slow
def test_a_worker_shutting_down_requeues_its_job_and_another_finishes_it(
    running: tuple[TestClient, Worker], storage: str
) -> None:
    client, worker = running
    job = client.post(
        "/v1/jobs", json=TINY_JOB | {"workload": "transformer", "trials": 5}, headers=AUTH
    ).json()
    wait_for(lambda: _job(client, job)["n_complete"] >= 1, timeout_s=60, what="a complete trial")
    worker.shutdown()
    requeued = wait_for(
        lambda: (j := _job(client, job))["status"] == "queued" and j,
        timeout_s=30,
        what="the job to be requeued",
    )
    assert "shut down" in requeued["error"]
    assert make_worker(storage).run_once()
    done = _job(client, job)
    # The claim handed back at the shutdown is not an attempt: only the one that finished it.
    assert done["status"] == "succeeded" and done["attempts"] == 1
    assert done["n_complete"] + done["n_failed"] + done["n_pruned"] == 5
    trials = client.get(job["links"]["trials"], headers=AUTH).json()["items"]
    assert sum(t["counted"] for t in trials) == 5


# -- resuming: stale leases, orphaned trials, a job killed after its last trial -------------


def _ghost_claims(store: JobStore, job_id: str) -> JobRow:
    """A worker that claims the job and dies: its heartbeat is an hour old."""
    claimed = store.claim("ghost", devices=("cpu", "auto"))
    assert claimed is not None and claimed.id == job_id
    with store.engine.begin() as conn:
        conn.execute(
            sa.update(JobRow)
            .where(JobRow.id == job_id)
            .values(heartbeat_at=dt.datetime(2000, 1, 1))
        )
    return claimed


def _trials(storage: str, study: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)


def test_a_job_whose_worker_died_is_requeued_and_completed(storage: str) -> None:
    store = JobStore(storage)
    row = store.create(JobSpec(**(TINY_JOB | {"trials": 2})), owner="me")
    assert _ghost_claims(store, row.id).worker == "ghost"
    assert make_worker(storage, lease_s=30).run_once()
    done = store.get(row.id)
    assert (done.status, done.attempts, done.worker) == ("succeeded", 2, done.worker)
    assert done.worker != "ghost" and not store.heartbeat(row.id, "ghost").owned


def test_stale_jobs_end_when_cancelled_or_out_of_attempts(storage: str) -> None:
    store = JobStore(storage)
    cancelled = store.create(JobSpec(**TINY_JOB), owner="me")
    _ghost_claims(store, cancelled.id)
    store.cancel(cancelled.id)
    exhausted = store.create(JobSpec(**TINY_JOB), owner="me")
    _ghost_claims(store, exhausted.id)
    assert store.requeue_stale(lease_s=30, max_attempts=1) == 2
    assert store.get(cancelled.id).status == "cancelled"
    failed = store.get(exhausted.id)
    assert failed.status == "failed" and "lost 1 times" in (failed.error or "")


def test_a_trial_left_running_is_failed_rerun_and_never_counted(storage: str) -> None:
    store = JobStore(storage)
    row = store.create(JobSpec(**(TINY_JOB | {"trials": 4})), owner="me")
    ghost = _ghost_claims(store, row.id)
    worker = make_worker(storage)
    options = worker.options_for(ghost, JobSpec.of(ghost))
    # The ghost completes two trials, stops, and dies in the middle of a third.
    calls = iter(range(1000))
    checks = _baseline_checks(windows=3) + 2 * 4  # the baselines', then 2 trials' (3 windows)
    with pytest.raises(Stopped):
        run_study(options, should_stop=lambda: next(calls) >= checks)
    optuna.load_study(study_name=row.study, storage=storage).ask()
    before = {
        t.number: t.values for t in _trials(storage, row.study) if t.state == TrialState.COMPLETE
    }
    assert len(before) == 2
    assert worker.run_once()
    done = store.get(row.id)
    assert done.status == "succeeded"
    trials = _trials(storage, row.study)
    counts = trial_counts(trials)
    assert counts.counted == 4 == (done.n_complete + done.n_failed + done.n_pruned)
    assert {t.number: t.values for t in trials if t.number in before} == before
    orphan = trials[2]
    assert orphan.state == TrialState.FAIL and orphan.user_attrs["failure_reason"] == (
        ORPHAN_REASON
    )
    assert len({t.number for t in trials}) == len(trials)
    assert done.recommendation is not None
    assert done.recommendation["trial_counts"]["complete"] == done.n_complete
    assert counts.interrupted >= 1  # the ghost's trial (and the ones its stop cut short)
    _every_reader_counts_alike(storage, row.id, counts)


def _baseline_checks(windows: int) -> int:
    """The stop checks the start baselines make (each: 1 before it, 1 per window, 1 after)."""
    return 2 * (windows + 2)


def _every_reader_counts_alike(storage: str, job_id: str, counts: TrialCounts) -> None:
    """The job row, /v1/jobs/{id}, /best, /v1/studies, `best`, `studies` and the report all
    show the counting rule's figures for a job whose study holds interrupted trials."""
    row = JobStore(storage).get(job_id)
    expected = counts.to_dict()
    assert (row.n_complete, row.n_failed, row.n_pruned, row.n_interrupted) == (
        counts.complete,
        counts.failed,
        counts.pruned,
        counts.interrupted,
    )
    with TestClient(make_app(storage)) as client:
        job = client.get(f"/v1/jobs/{job_id}", headers=ADMIN_AUTH).json()
        best = client.get(f"/v1/jobs/{job_id}/best", headers=ADMIN_AUTH).json()
        study = client.get(f"/v1/studies/{row.study}", headers=ADMIN_AUTH).json()
        study_best = client.get(f"/v1/studies/{row.study}/best", headers=ADMIN_AUTH).json()
        page = client.get(f"/v1/jobs/{job_id}/report", headers=ADMIN_AUTH).text
    assert (job["n_complete"], job["n_failed"], job["n_pruned"], job["n_interrupted"]) == (
        counts.complete,
        counts.failed,
        counts.pruned,
        counts.interrupted,
    )
    assert best["trial_counts"] == study["trials"] == study_best["trial_counts"] == expected
    assert recommendation(storage, row.study).trial_counts == counts
    assert next(r for r in list_studies(storage) if r["study"] == row.study)["trials"] == expected
    assert (
        f"{counts.complete} complete, {counts.failed} failed, {counts.pruned} pruned, "
        f"{counts.interrupted} interrupted"
    ) in page


def test_a_job_killed_after_its_last_trial_only_decides(storage: str) -> None:
    store = JobStore(storage)
    row = store.create(JobSpec(**(TINY_JOB | {"trials": 2})), owner="me")
    ghost = _ghost_claims(store, row.id)
    worker = make_worker(storage)

    class DiesAfterTrials:
        def start(self, study: str, total: int, resumed: bool) -> None: ...
        def phase(self, text: str) -> None: ...

        def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
            if done == total:
                raise KeyboardInterrupt  # killed between the last trial and the final round

    with pytest.raises(Interrupted):
        run_study(worker.options_for(ghost, JobSpec.of(ghost)), progress=DiesAfterTrials())
    assert len(_trials(storage, row.study)) == 2
    assert worker.run_once()
    done = store.get(row.id)
    assert done.status == "succeeded" and done.recommendation is not None
    assert len(_trials(storage, row.study)) == 2  # no trial added


def test_a_job_whose_patience_stops_its_search_decides_then(storage: str) -> None:
    """The patience ends a job's trials as it ends a run's: the worker decides at once, in its
    one session, after the first trial that made the rule hold. Until 2026-11-28 it helped, left
    the job and joined it again, counting its patience afresh, and ran trials until its trials
    or its deadline ran out."""
    store = JobStore(storage)
    asked = 12
    row = store.create(JobSpec(**(TINY_JOB | {"trials": asked, "patience": 1})), owner="me")
    worker = make_worker(storage)
    assert worker.run_once()
    done = store.get(row.id)
    assert done.status == "succeeded" and done.recommendation is not None
    trials = sorted(_trials(storage, row.study), key=lambda t: t.number)
    values = [t.values[0] for t in trials if t.state == TrialState.COMPLETE]
    # The patience counts complete trials; one the pruner stopped at a slow window (CI's loaded
    # machine, 2026-12-06: 6 complete of 11) is not one, and does not end the search.
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert trials[-1].state == TrialState.COMPLETE and len(trials) < asked
    margin = worker.options_for(row, JobSpec.of(row)).tie_margin
    # It stopped on the first trial after which the rule held, not later.
    assert trials_without_gain(values, margin) >= 1
    assert all(trials_without_gain(values[:n], margin) < 1 for n in range(1, len(values)))
    attrs = optuna.load_study(study_name=row.study, storage=storage).user_attrs
    assert len([k for k in attrs if k.startswith("time/")]) == 1  # one session: no rejoin
    assert attrs[JOB_BEGUN] == []  # the claimer's count starts at the job's first trial
    ended = done.recommendation["search"]["ended"]  # the job row's `search_ended`
    assert ended["by"] == "patience"
    assert f"stopped after {len(trials)} trials" in ended["why"]


def test_a_job_whose_budget_runs_out_says_so(storage: str) -> None:
    store = JobStore(storage)
    row = store.create(JobSpec(**(TINY_JOB | {"trials": 12, "timeout_s": 1e-3})), owner="me")
    assert make_worker(storage).run_once()
    done = store.get(row.id)
    assert done.status in ("succeeded", "failed") and done.recommendation is not None
    ended = done.recommendation["search"]["ended"]
    assert ended["by"] == "timeout" and "search budget ran out" in ended["why"], ended


def test_a_job_that_cannot_run_fails_with_the_reason(storage: str) -> None:
    store = JobStore(storage)
    row = store.create(
        JobSpec(workload="transformer", preset="no-such-preset", device="cpu"), owner="me"
    )
    assert make_worker(storage).run_once()
    failed = store.get(row.id)
    assert failed.status == "failed" and "no-such-preset" in (failed.error or "")


def test_a_plug_ins_study_and_best_are_shown_by_the_name_its_job_asked_for(storage: str) -> None:
    """The study's worker ran the factory's path; `/v1/studies` names the registered name, as
    the job does (2026-12-02: it showed the module path, which the API never takes)."""
    workloads = {"mine": "tests.trainers.own_workloads:sized"}
    with TestClient(make_app(storage, workloads=workloads)) as client:
        job = client.post(
            "/v1/jobs", json=TINY_JOB | {"workload": "mine", "trials": 1}, headers=AUTH
        ).json()
        assert make_worker(storage, workloads=workloads).run_once()
        done = client.get(f"/v1/jobs/{job['id']}", headers=AUTH).json()
        assert done["status"] == "succeeded", done
        study = client.get(f"/v1/studies/{done['study']}", headers=AUTH).json()
        listed = client.get("/v1/studies", headers=AUTH).json()["items"]
        best = client.get(f"/v1/jobs/{job['id']}/best", headers=AUTH).json()
        # The study's own /best too (a probe, 2026-12-06: it named the factory's path).
        studys = client.get(f"/v1/studies/{done['study']}/best", headers=AUTH).json()
        # And the HTML report (a probe, 2026-12-06: it showed the factory's path).
        page = client.get(done["links"]["report"], headers=AUTH).text
    assert "mine / tiny" in page
    assert "own_workloads" not in page
    assert study["workload"] == "mine" and [s["workload"] for s in listed] == ["mine"]
    assert best["workload"] == "mine" and studys["workload"] == "mine", (best, studys)
    assert studys["config"] == best["config"], (best, studys)
    assert "own_workloads" not in json.dumps(study) + json.dumps(best) + json.dumps(studys)


def test_a_job_that_recommends_nothing_fails_and_serves_no_best(storage: str) -> None:
    """Every measurement fails (baselines included): the job ends `failed` with why, not
    `succeeded` with a null config (2026-12-02: a client that waited for `succeeded` and read
    `best` got `"config": null`, where `python -m tuner run` exits 1). Its recommendation is
    still stored, with each failure; `best` is a 409 that says why."""
    workloads = {"explodes": "tests.tuner.workloads_for_tests:raises_in_loss"}
    with TestClient(make_app(storage, workloads=workloads)) as client:
        job = client.post(
            "/v1/jobs", json=TINY_JOB | {"workload": "explodes", "trials": 2}, headers=AUTH
        ).json()
        assert make_worker(storage, workloads=workloads).run_once()
        done = client.get(f"/v1/jobs/{job['id']}", headers=AUTH).json()
        assert done["status"] == "failed" and not done["has_recommendation"], done
        assert done["error"].startswith("no config recommended: "), done["error"]
        # Each failure's cause is in the error itself: the row has no failures to "see".
        assert INJECTED in done["error"] and "see failures" not in done["error"], done["error"]
        best = client.get(f"/v1/jobs/{job['id']}/best", headers=AUTH)
        assert best.status_code == 409 and "no config recommended" in best.json()["detail"]
        study = client.get(f"/v1/studies/{done['study']}", headers=AUTH).json()
        assert study["has_recommendation"] is False
        assert client.get(f"/v1/studies/{done['study']}/best", headers=AUTH).status_code == 409
    stored = JobStore(storage).get(job["id"]).recommendation
    assert stored is not None and stored["config"] is None and stored["failures"]


def test_a_job_whose_default_loop_fails_in_the_users_code_fails_before_its_trials(
    storage: str,
) -> None:
    """The user's loss raises at every step: the job fails at its first baseline with where
    and why, and runs no trial (each trial had failed alike, compiled first on a GPU)."""
    workloads = {"mine": "tests.trainers.own_workloads:fails_in_its_loss"}
    with TestClient(make_app(storage, workloads=workloads)) as client:
        job = client.post(
            "/v1/jobs", json=TINY_JOB | {"workload": "mine", "trials": 3}, headers=AUTH
        ).json()
        make_worker(storage, workloads=workloads).run_once()
        done = client.get(f"/v1/jobs/{job['id']}", headers=AUTH).json()
    assert done["status"] == "failed" and done["n_complete"] == 0, done
    assert done["error"].startswith("workload: the PyTorch default loop failed (ValueError at ")
    assert "own_workloads.py:" in done["error"] and "refuses every batch" in done["error"]
    # The file by its name: where the server keeps its code is not the client's to see.
    assert str(Path(own_workloads.__file__).parent) not in done["error"], done["error"]
    assert optuna.load_study(study_name=done["study"], storage=storage).trials == []


def test_a_cpu_job_gets_the_clis_cpu_defaults_where_the_operator_set_none(
    storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same request runs the same way through `python -m tuner run` and the service: on a
    CPU one final round and no profiles (`tuner.cli._cpu_defaults`), unless the operator set
    them (2026-12-02: a CPU job ran three final rounds where the CLI ran one)."""
    row = JobStore(storage).create(JobSpec(**TINY_JOB), owner="me")
    spec = JobSpec.of(row)
    plain = Worker(WorkerSettings(storage=storage)).options_for(row, spec)
    assert (plain.final_rounds, plain.profile) == (1, "none")
    monkeypatch.setenv("TUNER_STORAGE", storage)
    monkeypatch.setenv("TUNER_FINAL_ROUNDS", "3")
    monkeypatch.setenv("TUNER_PROFILE", "baselines")
    operators = Worker(load_settings(WorkerSettings)).options_for(row, spec)
    assert (operators.final_rounds, operators.profile) == (3, "baselines")


def test_a_plug_ins_declared_presets_are_checked_before_the_job_is_queued(storage: str) -> None:
    """A plug-in whose factory declares `presets` has another preset refused by `POST` (422
    naming `preset` and the allowed ones, nothing queued); one that declares none is queued and
    its factory's own refusal names the preset when the worker builds it."""
    own = "tests.trainers.own_workloads"
    workloads = {"declared": f"{own}:sized_and_declared", "undeclared": f"{own}:sized"}
    with TestClient(make_app(storage, workloads=workloads)) as client:
        refused = client.post(
            "/v1/jobs", json=TINY_JOB | {"workload": "declared", "preset": "medium"}, headers=AUTH
        )
        assert refused.status_code == 422, refused.text
        (error,) = refused.json()["detail"]
        assert error["loc"] == ["body", "preset"], error
        assert "allowed tiny, small" in error["msg"], error
        assert client.get("/v1/jobs", headers=AUTH).json()["total"] == 0
        queued = client.post(
            "/v1/jobs", json=TINY_JOB | {"workload": "undeclared", "preset": "medium"}, headers=AUTH
        )
        assert queued.status_code == 201, queued.text
    assert make_worker(storage, workloads=workloads).run_once()
    failed = JobStore(storage).get(queued.json()["id"])
    assert failed.status == "failed" and "preset='medium' is invalid" in (failed.error or "")
    # Named as the job named it, not by the worker's factory path (which the API never takes).
    assert "workload 'undeclared'" in (failed.error or "")
    assert "own_workloads:sized" not in (failed.error or ""), failed.error


# -- run_study's should_stop, on its own ------------------------------------------------------


def test_should_stop_stops_the_running_trial_at_its_next_window(storage: str) -> None:
    store = JobStore(storage)
    row = store.create(JobSpec(**(TINY_JOB | {"trials": 5})), owner="me")
    worker = make_worker(storage, measure_windows=4)
    options = worker.options_for(row, JobSpec.of(row))
    asked: list[int] = []

    def stop_in_the_second_trial() -> bool:
        asked.append(1)
        # per trial: 1 check before it, then 1 per window: the 2nd trial's 2nd window is call 8
        # after the baselines'
        return len(asked) >= _baseline_checks(windows=4) + 8

    with pytest.raises(Stopped, match="stopped on request"):
        run_study(options, should_stop=stop_in_the_second_trial)
    trials = _trials(storage, row.study)
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED]
    stopped = trials[1]
    assert stopped.user_attrs[STOPPED_ATTR] is True and len(stopped.user_attrs["windows"]) == 2
    assert (
        "recommendation" not in optuna.load_study(study_name=row.study, storage=storage).user_attrs
    )


# -- what a worker runs, and the commands' own errors --------------------------------------------


def test_a_cpu_worker_leaves_cuda_jobs_alone(storage: str) -> None:
    store = JobStore(storage)
    store.create(JobSpec(**(TINY_JOB | {"device": "cuda"})), owner="me")
    assert make_worker(storage).devices == ("auto", "cpu")
    assert not make_worker(storage).run_once()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_worker_and_serve_flags_are_checked() -> None:
    from tuner.__main__ import main

    with pytest.raises(TunerError, match="--gpu: 0 is invalid"):
        Worker(WorkerSettings(), gpu=0)
    assert main(["serve", "--workers", "1", "--no-worker"]) == 2
    assert main(["worker", "--gpu", "-1"]) == 2


def test_a_worker_for_a_job_that_is_not_there_is_one_line_naming_the_flag(
    storage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from tuner.__main__ import main

    JobStore(storage).create(JobSpec(**TINY_JOB), owner="me")
    # It had exited 0 at once, as if the job had ended, and the CPU job stayed queued.
    assert main(["worker", "--storage", storage, "--job", "0" * 32]) == 2
    err = capsys.readouterr().err
    assert f"error: --job: no job '{'0' * 32}' in the storage" in err
    assert "Traceback" not in err


def test_a_worker_for_a_job_that_has_ended_says_so_and_exits(
    storage: str, caplog: pytest.LogCaptureFixture
) -> None:
    from tuner.__main__ import main

    job = JobStore(storage).create(JobSpec(**TINY_JOB), owner="me")
    JobStore(storage).cancel(job.id)
    with caplog.at_level(logging.INFO, logger="tuner.worker"):
        assert main(["worker", "--storage", storage, "--job", job.id]) == 0
    # It had exited 0 at once without a word, as if it had run the job.
    assert f"job {job.id} has already ended (cancelled): nothing to run" in caplog.text
    assert JobStore(storage).get(job.id).status == "cancelled"


def test_a_misspelt_or_nan_setting_is_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TUNER_STORGE", "sqlite:///elsewhere.db")
    monkeypatch.setenv("TUNER_CPU_STANDINS", "2")  # read by `run --gpus`, not a near miss
    monkeypatch.setenv("TUNER_API_TOKENS", "alice:x")  # the API's, in one env file with these
    load_settings(WorkerSettings)
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "warning: TUNER_STORGE is not a setting here and is ignored; did you mean TUNER_STORAGE?"
    ]
    monkeypatch.setenv("TUNER_POLL_S", "nan")  # passed "gt 0" and named "<= 3600"
    with pytest.raises(TunerError, match=r"^TUNER_POLL_S: Input should be a finite number$"):
        load_settings(WorkerSettings)


def test_a_worker_leaves_the_window_to_the_job_unless_its_settings_set_one(storage: str) -> None:
    """As `run` without --window-steps: a worker whose TUNER_MEASURE_WINDOW_STEPS is unset lets
    the scale space shorten the windows (`search.measurement_protocol`); one that sets it keeps
    its own length."""
    from tuner.search.proposing.defaults import DEFAULT_WINDOW_STEPS

    row = JobStore(storage).create(JobSpec(**TINY_JOB), owner="me")
    left = make_worker(storage, measure_window_steps=None).options_for(row, JobSpec.of(row))
    assert left.auto_window_steps is True
    assert left.protocol.window_steps == DEFAULT_WINDOW_STEPS
    kept = make_worker(storage, measure_window_steps=7).options_for(row, JobSpec.of(row))
    assert (kept.auto_window_steps, kept.protocol.window_steps) == (False, 7)
    assert WorkerSettings().measure_window_steps is None


def test_a_job_that_asks_to_screen_is_run_screening(storage: str) -> None:
    """The job's `screen` reaches the worker's RunOptions, stored and read back (`JobSpec.of`)."""
    store = JobStore(storage)
    asked = store.create(JobSpec(**(TINY_JOB | {"screen": "on"})), owner="me")
    plain = store.create(JobSpec(**TINY_JOB), owner="me")
    worker = make_worker(storage)
    assert worker.options_for(asked, JobSpec.of(asked)).screen == "on"
    assert worker.options_for(plain, JobSpec.of(plain)).screen == "auto"


def test_a_worker_profiles_as_its_settings_say(
    storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TUNER_PROFILE reaches each job's RunOptions (how `run --gpus N --profile ...` passes its
    flag to the workers it starts); any other value names the setting."""
    row = JobStore(storage).create(JobSpec(**TINY_JOB), owner="me")
    assert make_worker(storage, profile="all").options_for(row, JobSpec.of(row)).profile == "all"
    monkeypatch.setenv("TUNER_PROFILE", "none")
    assert WorkerSettings().profile == "none"
    monkeypatch.setenv("TUNER_PROFILE", "sometimes")
    with pytest.raises(ValueError, match="profile"):
        WorkerSettings()


def test_a_gpus_worker_opens_its_search_while_the_claimer_opens_the_job(storage: str) -> None:
    """A worker of `run --gpus N` (`only_job`) whose job another worker has claimed but not
    opened for trials yet opens its own search of it meanwhile, and runs its trials with that
    search once it joins (`Worker._prepare_only_job`, `JobRun.prepare`)."""
    store = JobStore(storage)
    job = store.create(JobSpec(**(TINY_JOB | {"trials": 2})), owner="me")
    claimer = make_worker(storage)
    claimer.start()
    assert store.claim(claimer.id, devices=("cpu",), job=job.id) is not None
    joiner = Worker(WorkerSettings(**({"storage": storage} | SMALL)), job=job.id)
    try:
        assert not joiner.run_once()  # claimed, not open: nothing to join yet
        ready = joiner._ready
        assert ready is not None and ready.prepared_for == job.id
        prepared = ready._prepared[1] if ready._prepared else None
        assert prepared is not None and prepared.study.study_name == job.study
        assert not joiner.run_once() and joiner._ready is ready  # opened once, not again
        assert joiner._prepared_once
        assert store.open_trials(job.id, claimer.id, hardware="cpu", deadline=None)
        assert joiner.run_once()  # joined: its trials ran on the search it had opened
        assert prepared.done == 2 and joiner._ready is None
    finally:
        joiner.close()
        claimer.close()


def test_a_heartbeat_slower_than_half_the_lease_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    # Healthy workers had taken each other for dead and failed the job as "lost 3 times".
    monkeypatch.setenv("TUNER_LEASE_S", "4")
    monkeypatch.setenv("TUNER_HEARTBEAT_S", "30")
    with pytest.raises(TunerError) as refused:
        load_settings(WorkerSettings)
    assert str(refused.value) == (
        "TUNER_HEARTBEAT_S=30 with TUNER_LEASE_S=4: allowed at most half the lease (2), else "
        "healthy workers are taken for dead"
    )
    monkeypatch.setenv("TUNER_HEARTBEAT_S", "2")  # half the lease: one late beat is covered
    assert load_settings(WorkerSettings).heartbeat_s == 2.0
