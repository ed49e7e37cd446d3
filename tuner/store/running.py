"""RUNNING trials whose process is gone: failed as interrupted, so that they are run again.

A service worker's trials carry its id (`keys.OWNER`) and its heartbeat tells a live worker from a
dead one (`tuner.service.slots.fail_orphans`). `python -m tuner run` has no heartbeat: a run
killed by SIGKILL or by the kernel's out-of-memory killer cannot fail its own trial, which stayed
RUNNING in the study for good (2026-12-07), shown as running and never run again. Each trial of
such a run carries its process (`keys.PROCESS`: host, pid and the pid's start time, so that a
recycled pid is not taken for it), and a resume on the same host fails those whose process is no
longer there. A trial of another host is left as it is: nothing here can see that host's
processes.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.store import keys

DEAD_PROCESS_REASON = (
    f"{keys.INTERRUPTED_PREFIX}: its process ended without finishing it (killed, or out of "
    "memory); the trial is run again"
)


def study_id(storage: optuna.storages.BaseStorage, name: str) -> int | None:
    try:
        return storage.get_study_id_from_name(name)
    except KeyError:
        return None


def fail_running(
    storage: optuna.storages.BaseStorage,
    study: str,
    which: Callable[[FrozenTrial], bool],
    reason: str,
) -> list[int]:
    """Fail the study's RUNNING trials that `which` picks, as interrupted; their numbers."""
    found = study_id(storage, study)
    if found is None:
        return []
    failed = []
    for trial in storage.get_all_trials(found, deepcopy=False, states=(TrialState.RUNNING,)):
        if not which(trial):
            continue
        try:
            storage.set_trial_user_attr(trial._trial_id, keys.FAILURE_REASON, reason)
            storage.set_trial_user_attr(trial._trial_id, keys.FAILURE_KIND, "interrupted")
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # its worker told it meanwhile: it was alive after all
        failed.append(trial.number)
    return failed


def this_process() -> str:
    """`host:pid:start`, what `keys.PROCESS` holds for a trial this process runs."""
    return process_of(os.getpid())


def process_of(pid: int) -> str:
    return f"{socket.gethostname()}:{pid}:{_started(pid)}"


def _started(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux's /proc/PID/stat, field 22);
    '' where it cannot be read (another system, or no such process)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            # The command name (field 2) may hold spaces and parentheses: split after its end.
            return stat.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def is_gone(process: object) -> bool:
    """Whether the process a trial names (`this_process()`'s form) ran on this host and is no
    longer there (its pid is free, or taken by a process started at another time)."""
    if not isinstance(process, str) or process.count(":") < 2:
        return False
    host, pid_text, started = process.rsplit(":", 2)
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the pid exists
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # another user's process holds the pid: compare its start time
    now = _started(pid)
    return bool(started) and bool(now) and now != started


def fail_dead_processes(storage: optuna.storages.BaseStorage, study: str) -> list[int]:
    """Fail the study's RUNNING trials whose process (`keys.PROCESS`) ran on this host and is
    gone; their numbers."""
    return fail_running(
        storage, study, lambda t: is_gone(t.user_attrs.get(keys.PROCESS)), DEAD_PROCESS_REASON
    )


def fail_killed_runs(
    storage: optuna.storages.BaseStorage, study: str, say: Callable[[str], None]
) -> None:
    """`fail_dead_processes`, and what it failed said through `say` (a progress line)."""
    dead = fail_dead_processes(storage, study)
    if dead:
        say(
            f"trial {', '.join(map(str, dead))}: left RUNNING by a run that was killed; failed "
            "as interrupted, run again"
        )


def fail_this_process(storage: optuna.storages.BaseStorage, study: str) -> list[int]:
    """Fail the study's RUNNING trials that this process runs, as interrupted (Ctrl-C, SIGTERM);
    their numbers. A trial asked but not yet inside the loop's own handler (its config being
    drawn) had been left RUNNING by an interrupt (a probe, 2026-12-07)."""
    me = this_process()
    return fail_running(
        storage, study, lambda t: t.user_attrs.get(keys.PROCESS) == me, keys.INTERRUPTED_PREFIX
    )
