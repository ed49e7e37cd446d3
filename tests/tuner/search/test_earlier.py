"""A new study begins with an earlier study's trials of the same inputs (`tuner.search.earlier`),
through the real search: real Optuna on SQLite and PostgreSQL, real CPU runs of the tiny MLP."""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from tests.tuner.tiny import PROTOCOL, load, options, run_json, sqlite_url
from tuner.evidence.render import search_text
from tuner.search import earlier
from tuner.search.gating.memo import MEMO_ENV
from tuner.search.options import Quiet
from tuner.search.trials import trials_without_gain
from tuner.store import keys


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request: pytest.FixtureRequest, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(MEMO_ENV, "on")
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return str(request.getfixturevalue("pg_url"))


def _finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.trials if t.state.is_finished()]


def test_a_second_study_of_the_same_inputs_begins_with_the_first_ones_trials(
    storage: str,
) -> None:
    first_rec = run_json(options(storage, "first", trials=3))
    second_rec = run_json(options(storage, "second", trials=3))
    first, second = load(storage, "first"), load(storage, "second")
    originals = _finished(first)
    assert first_rec["search"]["trials_copied"] is None
    assert second_rec["search"]["trials_copied"] == {"from": "first", "trials": len(originals)}
    assert "trials copied from the earlier study first" in (search_text(second_rec["search"]) or "")
    copies = [t for t in second.trials if keys.COPIED_FROM in t.user_attrs]
    assert len(copies) == len(originals)
    for copy, original in zip(copies, originals, strict=True):
        assert copy.user_attrs[keys.COPIED_FROM] == {"study": "first", "trial": original.number}
        assert (copy.state, copy.values, copy.params) == (
            original.state,
            original.values,
            original.params,
        )
        assert copy.user_attrs[keys.CONFIG_KEY] == original.user_attrs[keys.CONFIG_KEY]
        # This job did not spend the earlier job's time.
        assert keys.TIME not in copy.user_attrs and keys.TIME in original.user_attrs
    # The trial budget was met by the copies: the second job measured no trial of its own, and
    # still decided in a final round of its own.
    assert all(keys.COPIED_FROM in t.user_attrs for t in _finished(second))
    assert second_rec["config"] is not None
    assert second_rec["final_round"]


def test_copies_count_toward_the_patience_as_this_jobs_own(storage: str) -> None:
    # The patience is set to the first study's own count of trials since its last gain, so the
    # copies alone use it up: a repeat with room for 10 runs none (without the copies counted as
    # its own it would run that many before its patience could stop it). Counted from the values
    # measured, not assumed: under a loaded CI a later trial can run 2x the first.
    run_json(options(storage, "first", trials=3, tie_margin=0.9))
    values = [t.values[0] for t in _finished(load(storage, "first")) if t.values]
    since = trials_without_gain(values, 0.9)
    assert since >= 1, f"the last of {values} beat the rest by 90 %: CPU noise beyond this test"
    said = Said()
    run_json(options(storage, "second", trials=10, patience=since, tie_margin=0.9), progress=said)
    second = load(storage, "second")
    assert len(_finished(second)) == 3
    assert all(keys.COPIED_FROM in t.user_attrs for t in _finished(second))
    # Said as it happens: the copies, then the patience over them.
    lines = said.lines
    assert any(line.startswith("trials: 3 measured by the earlier study first") for line in lines)
    assert any(line.endswith("stopped after 0 trials (and 3 copied)") for line in lines)


class Said(Quiet):
    """The progress lines of a run."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def phase(self, text: str) -> None:
        self.lines.append(text)


def test_other_inputs_copy_nothing(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MEMO_ENV, "on")
    url = sqlite_url(tmp_path)
    run_json(options(url, "first", trials=2))
    # Another protocol measures otherwise: its trials are its own.
    rec = run_json(
        options(url, "other", trials=2, protocol=dataclasses.replace(PROTOCOL, window_steps=3))
    )
    assert rec["search"]["trials_copied"] is None
    assert not [t for t in load(url, "other").trials if keys.COPIED_FROM in t.user_attrs]


def test_with_the_memo_off_a_second_study_measures_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MEMO_ENV, "off")
    url = sqlite_url(tmp_path)
    run_json(options(url, "first", trials=2))
    rec = run_json(options(url, "second", trials=2))
    assert rec["search"]["trials_copied"] is None
    assert all(keys.TIME in t.user_attrs for t in _finished(load(url, "second")))


def _trial(state: TrialState, number: int, **attrs: Any) -> optuna.trial.FrozenTrial:
    trial = optuna.trial.create_trial(
        state=state, value=1.0 if state == TrialState.COMPLETE else None, user_attrs=attrs
    )
    trial.number = number
    return trial


def test_a_trial_cut_short_is_not_a_measurement_and_is_not_copied() -> None:
    trials = [
        _trial(TrialState.PRUNED, 3, **{keys.STOPPED: True}),
        _trial(TrialState.FAIL, 2, **{keys.FAILURE_REASON: "interrupted (worker lost)"}),
        _trial(TrialState.FAIL, 1, **{keys.FAILURE_KIND: "oom", keys.FAILURE_REASON: "oom"}),
        _trial(TrialState.PRUNED, 4, **{keys.SCREEN: {"outcome": "lost"}}),
        _trial(TrialState.COMPLETE, 0),
        _trial(TrialState.PRUNED, 5, **{keys.SAME_AS: 0}),  # not run: trial 0 had measured it
    ]
    kept = earlier._copyable(trials)
    # In trial order; an out-of-memory failure and a screened-out trial are facts of the config.
    assert [t.number for t in kept] == [0, 1, 4]


def test_the_inputs_name_the_measurement_not_the_job() -> None:
    info = {"protocol": {"warmup": 1}, "space": {"name": "scale"}, "created": "today"}
    same = earlier.search_inputs("memo-a", {**info, "created": "tomorrow", "device": "cuda:1"})
    assert earlier.search_inputs("memo-a", info) == same
    assert earlier.search_inputs("memo-b", info) != same
    assert earlier.search_inputs("memo-a", {**info, "protocol": {"warmup": 2}}) != same


def test_a_job_of_fewer_trials_copies_no_more_than_its_own_the_fastest(storage: str) -> None:
    """The copies take their share of the job's trials: a job of 1 after one of 3 ended with 3
    counted trials, all copies (a new API client's trial)."""
    run_json(options(storage, "first", trials=3))
    complete = [t for t in load(storage, "first").trials if t.state == TrialState.COMPLETE]
    rec = run_json(options(storage, "second", trials=1))
    second = load(storage, "second")
    copies = [t for t in second.trials if keys.COPIED_FROM in t.user_attrs]
    assert len(copies) == 1 and len(_finished(second)) == 1
    fastest = max(complete, key=lambda t: t.values[0])
    assert copies[0].user_attrs[keys.COPIED_FROM]["trial"] == fastest.number
    assert rec["search"]["trials_copied"] == {"from": "first", "trials": 1}


def test_within_keeps_the_fastest_complete_trials_in_their_order() -> None:
    trials = [
        _trial(TrialState.FAIL, 0),
        *[
            optuna.trial.create_trial(
                state=TrialState.COMPLETE, value=v, params={}, distributions={}
            )
            for v in (5.0, 9.0, 7.0)
        ],
    ]
    for number, trial in enumerate(trials):
        trial.number = number
    assert [t.number for t in earlier.within(trials, 2)] == [2, 3]
    assert [t.number for t in earlier.within(trials, 4)] == [0, 1, 2, 3]
    assert [t.number for t in earlier.within(trials, None)] == [0, 1, 2, 3]
    assert earlier.within(trials, 0) == []
