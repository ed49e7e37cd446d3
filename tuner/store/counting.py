"""The one rule that counts a study's trials, and the best trial so far.

Every reader counts with `count_trials`: the job row (`/v1/jobs/{id}`), the recommendation
(`/best`, `python -m tuner best`), the study list (`studies`, `/v1/studies`) and the report. A
trial counts toward a job's `trials` when it finished (complete, failed or pruned) and was not cut
short by the service or by Ctrl-C (`is_rerun`: failed as `interrupted...`, or stopped on request);
those are run again and counted as `interrupted`. RUNNING and WAITING trials are counted as such.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.store import keys
from tuner.store.jsonsafe import json_safe_dict


@dataclasses.dataclass(frozen=True, slots=True)
class TrialCounts:
    complete: int = 0
    failed: int = 0
    pruned: int = 0
    interrupted: int = 0
    running: int = 0
    waiting: int = 0

    @property
    def counted(self) -> int:
        """Trials that count toward a job's `trials`."""
        return self.complete + self.failed + self.pruned

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialCounts:
        return cls(**{f.name: int(data.get(f.name, 0) or 0) for f in dataclasses.fields(cls)})


def is_rerun(trial: FrozenTrial) -> bool:
    """A trial cut short (failed as `interrupted...`, or stopped on request): it is run again
    and never counts toward the job's trials. What it measured stays in the study."""
    if trial.user_attrs.get(keys.STOPPED):
        return True
    reason = trial.user_attrs.get(keys.FAILURE_REASON)
    return (
        trial.state == TrialState.FAIL
        and isinstance(reason, str)
        and reason.startswith(keys.INTERRUPTED_PREFIX)
    )


def finished_state(trial: FrozenTrial) -> str:
    """A finished trial's state as the counts name it: complete, pruned, interrupted (cut short
    and run again: `is_rerun`) or failed. `/metrics` counts trials by it, so that its counts and
    the job's (`count_trials`) agree."""
    if is_rerun(trial):
        return "interrupted"
    return {"COMPLETE": "complete", "PRUNED": "pruned"}.get(trial.state.name, "failed")


def count_trials(trials: Iterable[FrozenTrial]) -> TrialCounts:
    tally = dict.fromkeys((f.name for f in dataclasses.fields(TrialCounts)), 0)
    for trial in trials:
        if trial.state == TrialState.RUNNING:
            tally["running"] += 1
        elif trial.state == TrialState.WAITING:
            tally["waiting"] += 1
        elif is_rerun(trial):
            tally["interrupted"] += 1
        elif trial.state == TrialState.COMPLETE:
            tally["complete"] += 1
        elif trial.state == TrialState.PRUNED:
            tally["pruned"] += 1
        else:
            tally["failed"] += 1
    return TrialCounts(**tally)


def best_trial(trials: Iterable[FrozenTrial]) -> dict[str, Any] | None:
    """The complete trial of highest throughput (its pooled median), as readers show it."""
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.values]
    if not complete:
        return None
    best = max(complete, key=lambda t: t.values[0])
    return json_safe_dict(
        {
            "trial": best.number,
            "throughput": best.values[0],
            "ci95": best.user_attrs.get(keys.CI95),
            "config": best.user_attrs.get(keys.CONFIG),
        }
    )


def gpu_seconds(trials: Iterable[FrozenTrial], study_attrs: Mapping[str, Any]) -> float:
    """Device time spent on a study: trials, baselines, parity checks and final rounds."""
    total = sum(float(t.user_attrs.get(keys.SECONDS, 0.0) or 0.0) for t in trials)
    for key, entry in study_attrs.items():
        if key.startswith(
            (keys.BASELINE_PREFIX, keys.PARITY_PREFIX, keys.PARITY_RUN_PREFIX, keys.FINAL_PREFIX)
        ) and isinstance(entry, dict):
            total += float(entry.get(keys.SECONDS, 0.0) or 0.0)
    return total


def begun(study: optuna.Study) -> frozenset[int]:
    """The numbers of the study's trials begun so far (every state but WAITING). A run's
    patience counts the trials begun after these (`tuner.search.trials.TrialRunner.
    _since_joined`): a resumed study's earlier trials do not count; a job's other workers' do,
    and so do trials enqueued before the run but begun after it joined."""
    return frozenset(
        t.number for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING
    )
