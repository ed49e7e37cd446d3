"""Trials an earlier study of the same inputs measured, copied into a new study.

A repeat job (the service's next job on the same model, `run --study NEW`, or a job on another
machine given the first one's storage) asks the search the same questions as the first. On one
H200 (`llama-1b`, float8 allowed, commit 27dc687,
`docs/benchmarks/time-to-answer-h200-2026-11-28-llama-1b.md`) the repeat job spent 121 s of its
426 s measuring again the four trials the cold job had measured, on the same code, model, shape
and kind of GPU, and reached the same answer.

"The same inputs" are the gate memo's (`tuner.search.gating.memo.memo_inputs`: the code, the
libraries, the environment, the workload and its shape, the precision, the kind of machine, and
in the service the job's owner: another owner's study is never copied nor named) and
what a trial's measurement depends on beside them: the protocol, the space, the precisions
searched, the objectives, the memory cap and the number of processes (`search_inputs`, stored on
every new study under `keys.SEARCH_INPUTS`). A new study copies the finished trials of the
earlier study with the same inputs that finished the most (`copy_earlier`), in their order:
- a copy keeps the trial's params, values, windows, screen record, prediction and verdict
  attributes, and names its origin (`keys.COPIED_FROM`); not its time (`keys.TIME`,
  `keys.SECONDS`: this job did not spend it) nor its worker;
- a trial cut short (stopped, or failed as interrupted) is not a measurement: it is not copied,
  and the search may run it again; nor is one not run because a copy had measured its config
  (`keys.SAME_AS`, `tuner.search.proposing.screen.measured_before`).

The copies count toward the patience as this job's own trials (`Search.joined` leaves them out),
so a repeat of a search that stopped for patience goes straight to the gate (its verdicts from
the memo) and the final round, which measures the leading configs again beside the baselines on
this machine: the recommendation's speed is still this job's measurement. A search that had not
stopped goes on from where the earlier one was.

`TUNER_GATE_MEMO=off` turns this off with the rest of the memo; a resumed study copies nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.store import keys

MEASURED_BY = (
    "precisions",
    "space",
    "objectives",
    "max_memory_bytes",
    "protocol",
    "nproc_per_node",
)
"""The study's metadata (`keys.META`) beside the memo's inputs that a trial's measurement depends
on."""
NOT_COPIED = (keys.TIME, keys.SECONDS, keys.OWNER, keys.PROCESS)
"""Trial attributes of the job that ran the trial, not of its measurement."""


@dataclasses.dataclass(frozen=True, slots=True)
class Copied:
    """The trials a new study began with: from which study, how many, and their numbers here."""

    study: str
    numbers: frozenset[int]

    def line(self) -> str:
        return (
            f"trials: {len(self.numbers)} measured by the earlier study {self.study} of the same "
            "code, model, shape, precision, GPU type, protocol and space, copied, not run again "
            "(TUNER_GATE_MEMO=off measures them again)"
        )


def search_inputs(memo: str, info: Mapping[str, Any]) -> str:
    """The hash of what a study's measurements depend on: its memo's name (which hashes the
    memo's inputs) and the fields of `info` (the study's metadata) named in `MEASURED_BY`."""
    fields = {name: info.get(name) for name in MEASURED_BY}
    text = json.dumps({"memo": memo, **fields}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def copy_earlier(
    storage: optuna.storages.BaseStorage,
    study: optuna.Study,
    inputs: str,
    limit: int | None = None,
) -> Copied | None:
    """Mark `study` (new) with `inputs`, and copy into it the finished trials of the earlier
    study with the same inputs that finished the most (the latest of equals), at most `limit`
    of them (`within`: the job's trials); None where there is none, none of its trials
    completed, or `study` already holds trials (another worker's)."""
    study.set_user_attr(keys.SEARCH_INPUTS, inputs)
    if study.get_trials(deepcopy=False):
        return None
    found = _best_match(storage, study.study_name, inputs)
    if found is None:
        return None
    name, trials = found
    study.add_trials([_copy(trial, name) for trial in within(trials, limit)])
    # Their numbers as the study gave them (read back, not assumed to start at 0).
    numbers = frozenset(
        t.number for t in study.get_trials(deepcopy=False) if keys.COPIED_FROM in t.user_attrs
    )
    study.set_user_attr(keys.TRIALS_COPIED, {"from": name, "trials": len(numbers)})
    return Copied(study=name, numbers=numbers)


def within(trials: list[FrozenTrial], limit: int | None) -> list[FrozenTrial]:
    """At most `limit` of `trials`, in their order: the fastest complete ones (the first
    objective, throughput), then the others by number. A job asked for 1 trial after one of 3
    had ended with 3 counted trials, all copies (a new API client's trial, 2026-12-03): the
    copies take their share of the job's trials, and no more."""
    if limit is None or len(trials) <= limit:
        return trials

    def rank(trial: FrozenTrial) -> tuple[int, float, int]:
        if trial.state == TrialState.COMPLETE and trial.values:
            return (0, -trial.values[0], trial.number)
        return (1, 0.0, trial.number)

    kept = {t.number for t in sorted(trials, key=rank)[: max(0, limit)]}
    return [t for t in trials if t.number in kept]


def _best_match(
    storage: optuna.storages.BaseStorage, own: str, inputs: str
) -> tuple[str, list[FrozenTrial]] | None:
    """The earlier study with `inputs` whose copyable trials are the most, and those trials."""
    best: tuple[int, int, str, list[FrozenTrial]] | None = None
    for summary in storage.get_all_studies():
        if summary.study_name == own or summary.user_attrs.get(keys.SEARCH_INPUTS) != inputs:
            continue
        study_id = storage.get_study_id_from_name(summary.study_name)
        trials = _copyable(storage.get_all_trials(study_id, deepcopy=False))
        if not any(t.state == TrialState.COMPLETE for t in trials):
            continue
        rank = (len(trials), study_id, summary.study_name, trials)
        if best is None or rank[:2] > best[:2]:
            best = rank
    return None if best is None else (best[2], best[3])


def _copyable(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The finished trials that are measurements, in trial order (see the module doc)."""
    kept = []
    for trial in sorted(trials, key=lambda t: t.number):
        if not trial.state.is_finished() or trial.user_attrs.get(keys.STOPPED):
            continue
        if keys.SAME_AS in trial.user_attrs:  # not run: its config's copy is copied
            continue
        reason = str(trial.user_attrs.get(keys.FAILURE_REASON) or "")
        if trial.state == TrialState.FAIL and reason.startswith(keys.INTERRUPTED_PREFIX):
            continue
        kept.append(trial)
    return kept


def _copy(trial: FrozenTrial, study: str) -> FrozenTrial:
    attrs = {k: v for k, v in trial.user_attrs.items() if k not in NOT_COPIED}
    attrs[keys.COPIED_FROM] = {"study": study, "trial": trial.number}
    # An enqueued trial's fixed params: a lever corner enqueued again finds it ran (Optuna's
    # skip_if_exists compares them).
    fixed = trial.system_attrs.get("fixed_params")
    return optuna.trial.create_trial(
        state=trial.state,
        values=trial.values if trial.state == TrialState.COMPLETE else None,
        params=trial.params,
        distributions=trial.distributions,
        user_attrs=attrs,
        system_attrs={} if fixed is None else {"fixed_params": fixed},
        intermediate_values=trial.intermediate_values,
    )
