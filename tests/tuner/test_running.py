"""`tuner.store.running`: which RUNNING trial's process is gone, on real processes and a real
SQLite study."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import optuna

from tuner.store import keys
from tuner.store.running import fail_dead_processes, is_gone, process_of, this_process


def _ended_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_process_is_gone_only_when_it_ran_here_and_its_pid_is_free_or_taken() -> None:
    assert not is_gone(this_process())
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert not is_gone(process_of(sleeper.pid))  # alive
        host, pid, started = process_of(sleeper.pid).rsplit(":", 2)
        assert started  # Linux: the start time is read
        # The same pid started at another time: a recycled pid, not the trial's process.
        assert is_gone(f"{host}:{pid}:{int(started) + 1}")
    finally:
        sleeper.kill()
        sleeper.wait()
    ended = _ended_pid()
    assert is_gone(f"{socket.gethostname()}:{ended}:1")
    # Another host's process cannot be seen from here; a value of another form is left alone.
    assert not is_gone(f"not-{socket.gethostname()}:{ended}:1")
    for odd in (None, 7, "", "host", f"{socket.gethostname()}:x:1"):
        assert not is_gone(odd)


def test_only_the_running_trials_of_gone_processes_fail(tmp_path: Path) -> None:
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 's.db'}")
    study = optuna.create_study(storage=storage, study_name="s")
    gone = f"{socket.gethostname()}:{_ended_pid()}:1"
    kinds = {"dead": gone, "alive": this_process(), "other host": f"elsewhere:{os.getpid()}:1"}
    numbers = {}
    for kind, process in kinds.items():
        trial = study.ask()
        trial.set_user_attr(keys.PROCESS, process)
        numbers[kind] = trial.number
    done = study.ask()
    done.set_user_attr(keys.PROCESS, gone)
    study.tell(done, 1.0)  # finished: not touched
    unnamed = study.ask()  # a service worker's, or a study from before the key
    assert fail_dead_processes(storage, "s") == [numbers["dead"]]
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states == {
        numbers["dead"]: "FAIL",
        numbers["alive"]: "RUNNING",
        numbers["other host"]: "RUNNING",
        done.number: "COMPLETE",
        unnamed.number: "RUNNING",
    }
    assert fail_dead_processes(storage, "no such study") == []
