"""Reading studies back: the recommendation, summaries, trial pages and the report, for every
study in a storage (jobs' `job-<id>` and `python -m tuner run`'s alike).

Every reader derives a study's trial counts with `tuner.store.counting.count_trials` at read time
and reads the recommendation through `Recommendation.from_dict`, with its verdicts read anew from
the stored profile figures (`tuner.evidence.profiles.reread`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import optuna

import trainers
from trainers import LoopConfig
from tuner.errors import StudyNotFound, named
from tuner.evidence.profiles import read_recommendation
from tuner.evidence.recommendation import Recommendation, recommends
from tuner.evidence.report import build_report
from tuner.evidence.unrun import pruned_reason
from tuner.store import keys, reading
from tuner.store import storage as studies
from tuner.store.counting import best_trial, count_trials, is_rerun
from tuner.store.jsonsafe import json_safe_dict
from tuner.store.keys import JOB_STUDY_PREFIX as STUDY_PREFIX
from tuner.store.keys import STOPPED as STOPPED_ATTR
from tuner.store.phases import study_time


def recommendation(storage_url: str, name: str) -> Recommendation:
    """`python -m tuner best`: the recommendation of study `name` in the storage at the URL."""
    with reading.opened_storage(storage_url) as storage:
        study = studies.load_study(storage, name)
        return read_recommendation(study.user_attrs, study.get_trials(deepcopy=False), name)


def load_config(storage_url: str, name: str) -> LoopConfig:
    """The recommended config of study `name`, to train with (`trainers.Trainer`).

    NoRecommendation when no config passed the gate, StudyNotFound for an unknown study.
    """
    return trainers.load_config(recommendation(storage_url, name).to_dict())


def load_precision(storage_url: str, name: str) -> str | None:
    """The precision to train study `name`'s recommended config in (`trainers.Trainer`'s
    `precision`): the one it chose, or the one it was fixed to; it was measured in it.

    StudyNotFound for an unknown study.
    """
    return trainers.load_precision(recommendation(storage_url, name).to_dict())


def list_studies(storage_url: str) -> list[dict[str, Any]]:
    """`python -m tuner studies`: one row per study, counted by the one rule."""
    with reading.opened_storage(storage_url) as storage:
        return [_study_row(storage, summary) for summary in _summaries(storage)]


def _summaries(storage: optuna.storages.BaseStorage) -> list[optuna.study.StudySummary]:
    return [
        summary
        for summary in optuna.get_all_study_summaries(storage, include_best_trial=False)
        # The gate's shared verdicts (tuner.search.gating.memo), not studies of trials; nor
        # another Optuna program's studies, whose values are not throughputs.
        if not summary.study_name.startswith(keys.MEMO_PREFIX)
        and studies.made_by_streamtune(summary.user_attrs, summary.n_trials)
    ]


def _study_row(
    storage: optuna.storages.BaseStorage, summary: optuna.study.StudySummary
) -> dict[str, Any]:
    study = optuna.load_study(study_name=summary.study_name, storage=storage)
    meta = study.user_attrs.get(keys.META, {})
    rec = study.user_attrs.get(keys.RECOMMENDATION)
    trials = study.get_trials(deepcopy=False)
    # Where the figure comes from, said beside it: a finished study's is its final round's
    # median, an unfinished one's a search trial's, from one short measurement.
    best_from: str | None
    if isinstance(rec, dict) and rec.get("throughput"):
        best, best_from = rec["throughput"]["median"], "final round"
    else:
        found = best_trial(trials)
        best = None if found is None else found["throughput"]
        best_from = None if found is None else f"trial {found['trial']}"
    return {
        "study": summary.study_name,
        "workload": meta.get("workload"),
        "preset": meta.get("preset"),
        # Two studies of one library model at other options (`--model-arg`) differ only here.
        "model_args": _model_args(meta),
        "hardware": meta.get("hardware"),
        "trials": count_trials(trials).to_dict(),
        "best_throughput": best,
        "best_from": best_from,
        "recommended": None if not isinstance(rec, dict) else rec.get("config"),
    }


def _model_args(meta: dict[str, Any]) -> dict[str, str]:
    """The options the study's model was given (`--model-arg`, a job's `model_args`); none in a
    study made before they were recorded."""
    found = meta.get("model_args")
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


class StudyReader:
    """Reads any study of the Optuna storage (jobs' and `python -m tuner run`'s alike)."""

    def __init__(self, storage: optuna.storages.BaseStorage) -> None:
        self.storage = storage

    def _study_id(self, name: str) -> int:
        """The id of streamtune's study `name`; StudyNotFound where there is none, or where
        another Optuna program made it (`tuner.store.storage.made_by_streamtune`)."""
        try:
            study_id = self.storage.get_study_id_from_name(name)
        except KeyError:
            raise StudyNotFound(f"no study named {named(name)} in this storage") from None
        if not self._streamtune(name, self.storage.get_study_user_attrs(study_id), study_id):
            raise StudyNotFound(studies.not_streamtune(name))
        return study_id

    def _streamtune(
        self, name: str, user_attrs: dict[str, Any], study_id: int | None = None
    ) -> bool:
        """Whether streamtune made study `name` (`study_id`, where the caller has it, spares
        reading it again)."""
        if isinstance(user_attrs.get(keys.META), dict):
            return True  # its trials left uncounted: a study's are many
        if study_id is None:
            study_id = self.storage.get_study_id_from_name(name)
        trials = self.storage.get_n_trials(study_id)
        return studies.made_by_streamtune(user_attrs, trials)

    def exists(self, name: str) -> bool:
        try:
            self._study_id(name)
        except StudyNotFound:
            return False
        return True

    def report(self, name: str) -> str:
        """The study's self-contained HTML report (`tuner.evidence.report.build_report`)."""
        self._study_id(name)  # StudyNotFound when it does not exist
        return build_report(optuna.load_study(study_name=name, storage=self.storage))

    def names(self) -> list[str]:
        # The gate's shared verdicts (tuner.search.gating.memo) are not a study of trials.
        return sorted(
            s.study_name
            for s in self.storage.get_all_studies()
            if not s.study_name.startswith(keys.MEMO_PREFIX)
            and self._streamtune(s.study_name, s.user_attrs)
        )

    def summary(self, name: str) -> dict[str, Any]:
        study_id = self._study_id(name)
        attrs = self.storage.get_study_user_attrs(study_id)
        found = attrs.get(keys.META)
        meta: dict[str, Any] = found if isinstance(found, dict) else {}
        rec = attrs.get(keys.RECOMMENDATION)
        rec = rec if isinstance(rec, dict) else None
        trials = self.storage.get_all_trials(study_id, deepcopy=False)
        return json_safe_dict(
            {
                "name": name,
                "workload": meta.get("workload"),
                "preset": meta.get("preset"),
                "model_args": _model_args(meta),
                "hardware": meta.get("hardware"),
                "fingerprint": meta.get("fingerprint"),
                "created": meta.get("created"),
                "trials": count_trials(trials).to_dict(),
                "best": best_trial(trials),
                "has_recommendation": recommends(rec),
                "recommended": None if rec is None else rec.get("config"),
                "time": study_time(attrs),
                "job_id": name.removeprefix(STUDY_PREFIX)
                if name.startswith(STUDY_PREFIX)
                else None,
            }
        )

    def recommendation(self, name: str) -> Recommendation:
        study_id = self._study_id(name)
        return read_recommendation(
            self.storage.get_study_user_attrs(study_id),
            self.storage.get_all_trials(study_id, deepcopy=False),
            name,
        )

    def trials(self, name: str, *, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
        """A page of a study's trials in trial order, and how many there are; none if no study."""
        if not self.exists(name):
            return [], 0
        trials = self.storage.get_all_trials(self._study_id(name), deepcopy=False)
        return [_trial_row(t) for t in trials[offset : offset + limit]], len(trials)


def _trial_row(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    attrs = trial.user_attrs
    # Optuna stores naive local times; the API shows UTC with its offset.
    started = None if trial.datetime_start is None else trial.datetime_start.astimezone(dt.UTC)
    finished = (
        None if trial.datetime_complete is None else trial.datetime_complete.astimezone(dt.UTC)
    )
    return json_safe_dict(
        {
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
            "same_as": attrs.get(keys.SAME_AS),
            "copied_from": attrs.get(keys.COPIED_FROM),
            "pruned_reason": pruned_reason(attrs),
            "time": attrs.get(keys.TIME) if isinstance(attrs.get(keys.TIME), dict) else None,
            "started_at": started,
            "completed_at": finished,
            "duration_s": None
            if started is None or finished is None or keys.COPIED_FROM in attrs
            else (finished - started).total_seconds(),
        }
    )
