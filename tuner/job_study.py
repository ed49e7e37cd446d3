"""A job's study: which of its trials count toward `n_trials`, and the read side of every
study in the storage (jobs' `job-<id>` and `python -m tuner run`'s alike)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner import profile as profiling
from tuner import study as studies
from tuner.errors import NoRecommendation, StudyNotFound
from tuner.jobs import STUDY_PREFIX, json_safe
from tuner.report import build_report
from tuner.search import STOPPED_ATTR

INTERRUPTED_PREFIX = "interrupted"


def is_rerun(trial: optuna.trial.FrozenTrial) -> bool:
    """A trial the service cut short: it is re-run on resume and never counts toward n_trials.

    Those are the trials failed as `interrupted...` (Ctrl-C, or left RUNNING by a worker that
    died and failed by the next one) and those stopped on request (`STOPPED_ATTR`: a cancel or a
    worker's shutdown). What they measured stays in the study.
    """
    if trial.user_attrs.get(STOPPED_ATTR):
        return True
    reason = trial.user_attrs.get("failure_reason")
    return (trial.state == TrialState.FAIL and isinstance(reason, str)
            and reason.startswith(INTERRUPTED_PREFIX))


def trial_counts(trials: Iterable[optuna.trial.FrozenTrial]) -> dict[str, int]:
    """complete / failed / pruned (those count toward n_trials), interrupted, running."""
    counts = {"complete": 0, "failed": 0, "pruned": 0, "interrupted": 0, "running": 0}
    for trial in trials:
        if trial.state == TrialState.RUNNING:
            counts["running"] += 1
        elif not trial.state.is_finished():
            continue
        elif is_rerun(trial):
            counts["interrupted"] += 1
        elif trial.state == TrialState.COMPLETE:
            counts["complete"] += 1
        elif trial.state == TrialState.PRUNED:
            counts["pruned"] += 1
        else:
            counts["failed"] += 1
    return counts


def best_trial(trials: Iterable[optuna.trial.FrozenTrial]) -> dict[str, Any] | None:
    """The complete trial of highest throughput (its pooled median), as the API shows it."""
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values]
    if not complete:
        return None
    best = max(complete, key=lambda t: t.values[0])
    return json_safe({"trial": best.number, "throughput": best.values[0],
                      "ci95": best.user_attrs.get("ci95"), "config": best.user_attrs.get("config")})


class StudyReader:
    """Reads any study of the Optuna storage (jobs' and `python -m tuner run`'s alike)."""

    def __init__(self, storage: optuna.storages.BaseStorage) -> None:
        self.storage = storage

    def _study_id(self, name: str) -> int:
        try:
            return self.storage.get_study_id_from_name(name)
        except KeyError:
            raise StudyNotFound(f"no study named {name!r} in this storage") from None

    def exists(self, name: str) -> bool:
        try:
            self._study_id(name)
        except StudyNotFound:
            return False
        return True

    def report(self, name: str) -> str:
        """The study's self-contained HTML report (`tuner.report.build_report`)."""
        self._study_id(name)  # StudyNotFound when it does not exist
        return build_report(optuna.load_study(study_name=name, storage=self.storage))

    def names(self) -> list[str]:
        return sorted(s.study_name for s in self.storage.get_all_studies())

    def summary(self, name: str) -> dict[str, Any]:
        study_id = self._study_id(name)
        attrs = self.storage.get_study_user_attrs(study_id)
        found = attrs.get(studies.META)
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        rec = attrs.get(studies.RECOMMENDATION)
        rec = rec if isinstance(rec, dict) else None
        trials = self.storage.get_all_trials(study_id, deepcopy=False)
        counts = {state.name.lower(): 0 for state in TrialState}
        for trial in trials:
            counts[trial.state.name.lower()] += 1
        return json_safe({
            "name": name,
            "workload": meta.get("workload"),
            "preset": meta.get("preset"),
            "hardware": meta.get("hardware"),
            "fingerprint": meta.get("fingerprint"),
            "created": meta.get("created"),
            "trials": counts,
            "best": best_trial(trials),
            "has_recommendation": rec is not None,
            "recommended": None if rec is None else rec.get("config"),
            "job_id": name.removeprefix(STUDY_PREFIX) if name.startswith(STUDY_PREFIX) else None,
        })

    def recommendation(self, name: str) -> dict[str, Any]:
        attrs = self.storage.get_study_user_attrs(self._study_id(name))
        rec = attrs.get(studies.RECOMMENDATION)
        if not isinstance(rec, dict):
            raise NoRecommendation(f"study {name!r} has no recommendation yet")
        return json_safe(profiling.reread(rec, attrs))

    def trials(self, name: str, *, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
        """A page of a study's trials in trial order, and how many there are; none if no study."""
        if not self.exists(name):
            return [], 0
        trials = self.storage.get_all_trials(self._study_id(name), deepcopy=False)
        return [_trial_row(t) for t in trials[offset:offset + limit]], len(trials)


def _trial_row(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    attrs = trial.user_attrs
    # Optuna stores naive local times; the API shows UTC with its offset.
    started = None if trial.datetime_start is None else trial.datetime_start.astimezone(dt.UTC)
    finished = (None if trial.datetime_complete is None else
                trial.datetime_complete.astimezone(dt.UTC))
    return json_safe({
        "number": trial.number,
        "state": trial.state.name.lower(),
        "counted": trial.state.is_finished() and not is_rerun(trial),
        "config": attrs.get("config"),
        "params": dict(trial.params),
        "throughput": None if not trial.values else trial.values[0],
        "ci95": attrs.get("ci95"),
        "windows": attrs.get("windows"),
        "peak_memory_bytes": attrs.get("peak_memory_bytes"),
        "failure_reason": attrs.get("failure_reason"),
        "failure_kind": attrs.get("failure_kind"),
        "stopped": bool(attrs.get(STOPPED_ATTR)),
        "duplicate_of": attrs.get("duplicate_of"),
        "started_at": started,
        "completed_at": finished,
        "duration_s": None if started is None or finished is None else (
            finished - started).total_seconds(),
    })
