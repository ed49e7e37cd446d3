"""Several worker processes on one job in PostgreSQL: trials spread, a worker killed, a shutdown,
the database restarted.

Needs PostgreSQL on 127.0.0.1:5432 (the `pg_url` fixture); the restart test also needs to be
allowed to run `pg_ctlcluster` (root, a Debian-style cluster), and skips otherwise.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.api.helpers import TINY_JOB, wait_for
from tests.tuner.service.workers import (
    Workers,
    assert_exactly_counted,
    pid_of,
    running_trial,
    trials,
    wait_finished,
)
from tuner.service.jobstore import JobStore
from tuner.service.slots import ORPHAN_REASON
from tuner.service.spec import JobSpec
from tuner.store.counting import is_rerun
from tuner.store.keys import OWNER as OWNER_ATTR
from tuner.store.keys import STOPPED as STOPPED_ATTR

pytestmark = pytest.mark.postgres

# A trial of this long enough (5 windows of 20 steps) to be caught while it runs.
LONG_TRIALS = {"measure_windows": 5, "measure_window_steps": 20}


@pytest.fixture
def workers(pg_url: str, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(pg_url, tmp_path)
    yield started
    started.stop()


def test_four_workers_share_one_job_of_40_trials(pg_url: str, workers: Workers) -> None:
    store = JobStore(pg_url)
    job = store.create(JobSpec(**(TINY_JOB | {"trials": 40})), owner="me")
    workers.start(4)
    done = wait_finished(store, job.id, workers, timeout_s=240)
    assert done.status == "succeeded", (done.error, workers.output())
    found = assert_exactly_counted(store, done, pg_url)
    assert len(found) == 40  # no trial was cut short and run again
    assert {t.state for t in found} <= {TrialState.COMPLETE, TrialState.PRUNED}
    owners = {t.user_attrs[OWNER_ATTR] for t in found}
    assert len(owners) > 1, owners  # spread over workers
    study = optuna.load_study(study_name=done.study, storage=pg_url)
    finals = [k for k in study.user_attrs if k.startswith("final/")]
    assert len(finals) == 1  # one final round, on one worker
    assert done.recommendation is not None and done.recommendation["config"] is not None
    # The start baselines were measured once, by the claimer, before any trial.
    starts = [
        v
        for k, v in study.user_attrs.items()
        if k.startswith("baseline/") and v["phase"] == "start"
    ]
    assert len(starts) == 2 and {v["at_trial"] for v in starts} == {0}


def test_a_worker_killed_mid_trial_loses_its_trial_and_one_stopped_exits_0(
    pg_url: str, workers: Workers
) -> None:
    lease_s, heartbeat_s = workers.settings["lease_s"], workers.settings["heartbeat_s"]
    workers.settings |= LONG_TRIALS
    store = JobStore(pg_url)
    job = store.create(
        JobSpec(**(TINY_JOB | {"workload": "transformer", "trials": 12})), owner="me"
    )
    workers.start(3)
    victim = wait_for(
        lambda: running_trial(pg_url, job.study), timeout_s=120, what="a running trial"
    )
    killed_pid = pid_of(victim.user_attrs[OWNER_ATTR])
    os.kill(killed_pid, signal.SIGKILL)
    killed_at = dt.datetime.now()
    # SIGTERM another worker while it measures: it stops its trial and exits 0.
    other = wait_for(
        lambda: (
            (t := running_trial(pg_url, job.study))
            and pid_of(t.user_attrs[OWNER_ATTR]) != killed_pid
            and t
        ),
        timeout_s=60,
        what="another trial",
    )
    stopped = workers.by_pid(pid_of(other.user_attrs[OWNER_ATTR]))
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(timeout=60) == 0, workers.output()

    done = wait_finished(store, job.id, workers, timeout_s=240)
    assert done.status == "succeeded", (done.error, workers.output())
    found = assert_exactly_counted(store, done, pg_url)
    lost = found[victim.number]
    assert lost.state == TrialState.FAIL and lost.user_attrs["failure_reason"] == ORPHAN_REASON
    assert lost.datetime_complete is not None
    # Failed within the grace period: lease + one heartbeat after the dead worker's last beat
    # (which came before the kill), plus a second for the machine's load.
    assert (lost.datetime_complete - killed_at).total_seconds() <= lease_s + heartbeat_s + 1.0
    mine = found[other.number]  # stopped at its next window unless it had just ended
    assert mine.state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert is_rerun(mine) == bool(mine.user_attrs.get(STOPPED_ATTR))
    assert len(found) > done.trials  # the lost trial (and a stopped one) were run again
    assert not store.live_workers(lease_s) & {other.user_attrs[OWNER_ATTR]}  # it left


def _pg_ctl(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        capture_output=True,
        timeout=120,
    )


def _pg_ready() -> bool:
    return (
        subprocess.run(
            ["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"], check=False
        ).returncode
        == 0
    )


@pytest.mark.skipif(
    shutil.which("pg_ctlcluster") is None
    or not os.path.isdir("/etc/postgresql")
    or os.geteuid() != 0,
    reason="needs root and pg_ctlcluster",
)
@pytest.mark.alone  # every other test's PostgreSQL goes down with it
def test_a_job_survives_a_database_restart(pg_url: str, workers: Workers) -> None:
    store = JobStore(pg_url)
    job = store.create(
        JobSpec(**(TINY_JOB | {"workload": "transformer", "trials": 12})), owner="me"
    )
    workers.settings |= LONG_TRIALS
    workers.start(2)
    wait_for(lambda: store.get(job.id).n_complete >= 2, timeout_s=120, what="2 trials")
    try:
        _pg_ctl("stop")
        time.sleep(3.0)  # as long as a lease: the workers' heartbeats go stale meanwhile
    finally:
        _pg_ctl("start")
        wait_for(_pg_ready, timeout_s=60, what="PostgreSQL to accept connections again")
    done = wait_finished(store, job.id, workers, timeout_s=240)
    assert done.status == "succeeded", (done.error, workers.output())
    found = assert_exactly_counted(store, done, pg_url)
    # They did lose it; the whole logs, since the job's later lines push it out of the tails.
    assert workers.logged("database unavailable"), workers.output()
    assert all(p.poll() is None for p in workers), workers.output()  # and carried on
    assert len(trials(pg_url, job.study)) == len(found)
