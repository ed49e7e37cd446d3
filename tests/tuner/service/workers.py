"""Worker processes for the tests that share one job among several: start, watch, kill.

Each worker is a real `python -m tuner worker` (on the CPU, one torch thread) run from this
checkout, with its settings as `TUNER_*` variables; its output goes to a log file under the
test's tmp_path, shown when a test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tests.api.helpers import clean_env, env_of, wait_for
from tuner.service.jobstore import FINISHED, JobStore
from tuner.service.tables import JobRow
from tuner.store import reading
from tuner.store.counting import count_trials as trial_counts
from tuner.store.counting import is_rerun
from tuner.store.keys import OWNER as OWNER_ATTR

ROOT = Path(__file__).resolve().parents[3]
# Children find this checkout first, and whatever else this process was given (a --target site).
CHILD_PYTHONPATH = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))

# Short leases and polls, so that a dead worker is noticed in seconds; parallel TPE.
SHARED: dict[str, Any] = {
    "measure_warmup": 1,
    "measure_windows": 3,
    "measure_window_steps": 2,
    "final_rounds": 1,
    "top_k": 2,
    "parity_steps": 4,
    "sampler": "tpe",
    "heartbeat_s": 0.3,
    "poll_s": 0.3,
    "lease_s": 3.0,
    "torch_threads": 1,
    "retry_base_s": 0.2,
    "retry_max_s": 2.0,
}


class Workers:
    """`python -m tuner worker` processes on one storage."""

    def __init__(self, storage: str, logs: Path, **settings: Any) -> None:
        self.storage = storage
        self.logs = logs
        self.settings = SHARED | settings
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, count: int) -> None:
        env = clean_env() | env_of(self.settings) | {"PYTHONPATH": CHILD_PYTHONPATH}
        for _ in range(count):
            log = (self.logs / f"worker-{len(self.procs)}.log").open("wb")
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "tuner", "worker", "--storage", self.storage],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )

    def by_pid(self, pid: int) -> subprocess.Popen[bytes]:
        return next(p for p in self.procs if p.pid == pid)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def logged(self, text: str) -> bool:
        """Whether any worker's whole log holds `text` (`output` shows only each log's tail)."""
        return any(
            text in path.read_text(errors="replace") for path in self.logs.glob("worker-*.log")
        )

    def output(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.logs.glob("worker-*.log"))
        )

    def __iter__(self) -> Iterator[subprocess.Popen[bytes]]:
        return iter(self.procs)


def pid_of(worker_id: str) -> int:
    """Worker ids are `<host>-<pid>-<random>`."""
    return int(worker_id.rsplit("-", 2)[1])


def trials(storage: str, study: str) -> list[FrozenTrial]:
    # Polled: each read's connections go back at once (a read a poll held 44 of PostgreSQL's
    # 100 until a garbage collection, beside three workers').
    with reading.opened_storage(storage) as opened:
        return optuna.load_study(study_name=study, storage=opened).get_trials(deepcopy=False)


def running_trial(storage: str, study: str) -> FrozenTrial | None:
    """A RUNNING trial that has its worker's id (and has measured for a moment), if any."""
    try:
        found = trials(storage, study)
    except KeyError:
        return None
    return next(
        (
            t
            for t in found
            if t.state == TrialState.RUNNING
            and t.user_attrs.get(OWNER_ATTR)
            and t.user_attrs.get("config")
        ),
        None,
    )


def wait_finished(store: JobStore, job_id: str, workers: Workers, timeout_s: float) -> JobRow:
    try:
        return wait_for(
            lambda: (row := store.get(job_id)).status in FINISHED and row,
            timeout_s=timeout_s,
            what=f"job {job_id} to finish",
            every_s=0.5,
        )
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}; job: {store.get(job_id).__dict__}\n{workers.output()}"
        ) from None


def assert_exactly_counted(store: JobStore, job: JobRow, storage: str) -> list[FrozenTrial]:
    """The job's promise: its trials counted, each trial number once, each trial measured by one
    worker (its id on the trial) and recorded once; returns the study's trials."""
    found = trials(storage, job.study)
    counts = trial_counts(found)
    assert counts.counted == job.trials, counts
    assert counts.running == 0
    numbers = [t.number for t in found]
    assert sorted(numbers) == list(range(len(found)))  # distinct, none missing
    for trial in found:  # one worker measured it; a trial asked as the database went away
        # may have no worker written on it, and then it was failed as interrupted, uncounted
        assert isinstance(trial.user_attrs.get(OWNER_ATTR), str) or is_rerun(trial), trial
    recorded = store.recorded_trials(job.id)
    assert recorded == set(numbers), (sorted(recorded), numbers)
    assert (job.n_complete, job.n_failed, job.n_pruned) == (
        counts.complete,
        counts.failed,
        counts.pruned,
    )
    assert sum(not is_rerun(t) for t in found) == job.trials
    return found


def no_pid(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
