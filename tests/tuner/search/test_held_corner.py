"""The float8 corner of the whole model, held until the probes pick its float8 levers
(tuner/search/proposing/held.py): which corners are held, what the probes' figures pick, and
the release on a real study (Optuna on SQLite). The probes' figures are given, the second stage
tests' (`IN_FLOAT8`: in float8 the head gains 4 ms, every linear loses 5 ms against none): float8
runs on a GPU only."""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState, create_trial

from tests.tuner.search.test_lever_stage import BOTH, IN_FLOAT8
from tests.tuner.search.test_lever_stage import FLOAT8_SPACE as SPACE
from tests.tuner.service.test_gatehelp import _job, claims_of
from tests.tuner.tiny import sqlite_url
from tuner.search.proposing.held import (
    _CLAIM,
    CLAIM_STALE_S,
    RELEASE_KEY,
    hold,
    picked,
    release,
)
from tuner.search.proposing.levers import unconverted_levers
from tuner.search.proposing.predictions import Predictions
from tuner.search.proposing.stages import first_trials
from tuner.search.spaces.space import SearchSpace
from tuner.store import keys


def _distributions() -> dict[str, Any]:
    precision = optuna.distributions.CategoricalDistribution(list(BOTH))
    return SPACE.distributions() | {keys.PRECISION: precision}


def _corners() -> list[dict[str, Any]]:
    return first_trials(SPACE, "cuda", None, BOTH)


def test_the_float8_corner_of_the_whole_model_is_held_where_the_probes_can_pick() -> None:
    corners = _corners()
    scopes = [(c["compile_scope"], c[keys.PRECISION]) for c in corners]
    assert scopes == [
        ("blocks", "bf16-autocast"),
        ("blocks", "float8"),
        ("model", "bf16-autocast"),
        ("model", "float8"),
    ]
    now, held = hold(corners, SPACE, BOTH, probes=True)
    assert held == [corners[3]] and now == corners[:3]
    # No probes here (a program, a data-parallel study), one precision, no float8 lever, or no
    # float8 corner to run first: nothing held.
    assert hold(corners, SPACE, BOTH, probes=False) == (corners, [])
    assert hold(corners, SPACE, (), probes=True) == (corners, [])
    plain = SearchSpace(name="s", params={"compile_scope": SPACE.params["compile_scope"]}, fixed={})
    assert hold(corners, plain, BOTH, probes=True) == (corners, [])
    assert hold([corners[3]], SPACE, BOTH, probes=True) == ([corners[3]], [])
    # A space that compiles the whole model only (no float8 corner of each block runs first).
    whole = SearchSpace(name="w", params={"float8_head": SPACE.params["float8_head"]}, fixed={})
    only = first_trials(whole, "cuda", None, BOTH)
    assert only and hold(only, whole, BOTH, probes=True) == (only, [])
    # A repeat job: where a trial copied from the earlier job ran float8 with the whole model
    # compiled, the corner is neither held nor enqueued; one of each block's changes nothing.
    ran = [create_trial(params=corners[1], distributions=_distributions(), value=1.0)]
    assert hold(corners, SPACE, BOTH, probes=True, ran=ran) == (corners[:3], [corners[3]])
    ran.append(create_trial(params=corners[3], distributions=_distributions(), value=1.0))
    assert hold(corners, SPACE, BOTH, probes=True, ran=ran) == (corners[:3], [])


def test_the_probes_move_only_what_the_corner_leaves_unconverted() -> None:
    """The head (in bf16 in the corner, as a bf16 step runs it) is moved where its probe
    predicts a gain; the linears (every one in float8 in the corner, which measures that) stay,
    though their probe ranks `none` first: the second stage measures their other values."""
    corner = _corners()[3]
    found, said = picked(SPACE, corner, Predictions(ms=IN_FLOAT8, floor_ms=1.0), "cuda")
    assert found == corner | {"float8_head": "float8"} and found["float8_linears"] == "all"
    assert said == "with float8_head=float8 (predicted +4.00 ms a step)"
    # A floor at that gain, no probes, or a probe's figure missing: the corner as it was.
    kept, said = picked(SPACE, corner, Predictions(ms=IN_FLOAT8, floor_ms=4.0), "cuda")
    assert kept == corner and said == (
        "as it was: no other value of float8_head predicted to save more than 4.00 ms a step"
    )
    assert picked(SPACE, corner, None, "cuda")[0] == corner
    head_only = Predictions(ms={"float8_head": IN_FLOAT8["float8_head"]}, floor_ms=1.0)
    kept, said = picked(SPACE, corner, head_only, "cuda")
    assert kept == corner and said.endswith("no probe predicted it")
    # A head slower in float8: nothing moves.
    slower = {**IN_FLOAT8, "float8_head": {"bf16": 6.0, "float8": 10.0}}
    assert picked(SPACE, corner, Predictions(ms=slower, floor_ms=1.0), "cuda")[0] == corner


class _Probes:
    """The search's `Prober` in outline: what it was asked, and the figures it gives."""

    def __init__(self, figures: dict[str, dict[Any, float | str]] | None) -> None:
        self.figures, self.asked = figures, []

    def __call__(
        self, leader: FrozenTrial, precision: str | None, names: Collection[str] | None = None
    ) -> Predictions | None:
        self.asked.append((leader.number, precision, tuple(names or ())))
        return None if self.figures is None else Predictions(ms=self.figures, floor_ms=1.0)


def _study(tmp_path: Path) -> tuple[optuna.Study, list[dict[str, Any]]]:
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    now, held = hold(_corners(), SPACE, BOTH, probes=True)
    for params in now:
        study.enqueue_trial(params)
    study.set_user_attr(keys.HELD_CORNERS, held)
    return study, held


def _ran(study: optuna.Study, params: dict[str, Any], value: float | None) -> None:
    """The next waiting trial, run with `params` (complete with `value`, or pruned)."""
    trial = study.ask(_distributions())
    assert trial.params == params
    study.tell(trial, value, state=TrialState.COMPLETE if value else TrialState.PRUNED)


def test_the_held_corner_is_released_once_a_float8_trial_is_complete(tmp_path: Path) -> None:
    study, (held,) = _study(tmp_path)
    probes = _Probes(IN_FLOAT8)
    kwargs: dict[str, Any] = {"predict": probes, "device_type": "cuda"}
    first, second, third = _corners()[:3]
    _ran(study, first, 50.0)  # bf16: no float8 trial yet, and trials wait
    assert release(study, SPACE, **kwargs) is None and not probes.asked
    _ran(study, second, 55.0)  # the float8 corner of each block
    said = release(study, SPACE, **kwargs)
    assert said == (
        "first stage: the float8 corner of the whole model with float8_head=float8 (predicted "
        "+4.00 ms a step) (probed after trial 1)"
    )
    assert probes.asked == [(1, "float8", unconverted_levers())]
    assert study.user_attrs[keys.HELD_CORNERS] == []
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [
        third,
        held | {"float8_head": "float8"},
    ]
    assert release(study, SPACE, **kwargs) is None  # released once
    assert len(probes.asked) == 1


def test_with_no_float8_trial_complete_it_is_released_as_it_was_once_nothing_waits(
    tmp_path: Path,
) -> None:
    study, (held,) = _study(tmp_path)
    probes = _Probes(IN_FLOAT8)
    kwargs: dict[str, Any] = {"predict": probes, "device_type": "cuda"}
    first, second, third = _corners()[:3]
    _ran(study, first, 50.0)
    _ran(study, second, None)  # the float8 corner screened out: pruned
    assert release(study, SPACE, **kwargs) is None  # the bf16 corner of the model waits
    _ran(study, third, 60.0)
    said = release(study, SPACE, **kwargs)
    assert said == (
        "first stage: the float8 corner of the whole model as it was: no float8 trial "
        "completed, or no probe runs here"
    )
    assert not probes.asked
    (waiting,) = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert waiting.system_attrs["fixed_params"] == held


def test_one_worker_releases_them_and_a_call_again_enqueues_each_once(tmp_path: Path) -> None:
    """Several workers of a job: while a float8 trial runs, nothing is released unprobed; a live
    claim of another worker leaves them to it, a stale one is taken over; a call again after a
    failure (the storage's retry) enqueues nothing twice."""
    study, (held,) = _study(tmp_path)
    probes = _Probes(IN_FLOAT8)
    kwargs: dict[str, Any] = {"predict": probes, "device_type": "cuda"}
    first, second, third = _corners()[:3]
    _ran(study, first, 50.0)
    running = study.ask(_distributions())  # the float8 corner of each block, on another worker
    assert running.params == second
    _ran(study, third, 60.0)  # nothing waits now, but a float8 trial runs
    assert release(study, SPACE, **kwargs) is None
    study.tell(running, 55.0)
    other = {"corners": [held], "by": "another-host:1", "at": time.time()}
    study.set_user_attr(keys.HELD_CORNERS, other)
    assert release(study, SPACE, **kwargs) is None and not probes.asked
    study.set_user_attr(keys.HELD_CORNERS, other | {"at": time.time() - CLAIM_STALE_S - 1})
    assert release(study, SPACE, **kwargs) is not None
    assert study.user_attrs[keys.HELD_CORNERS] == []
    # As if the storage had failed between the enqueue and letting them go: the claim is this
    # process's, and the call again enqueues nothing twice.
    study.set_user_attr(keys.HELD_CORNERS, {"corners": [held], "by": _CLAIM, "at": time.time()})
    assert release(study, SPACE, **kwargs) is not None
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [held | {"float8_head": "float8"}]


def test_where_the_job_has_claims_they_decide_which_worker_releases_them(tmp_path: Path) -> None:
    """The service's workers of one job (`JobClaims`, real job rows): while one worker holds the
    release, another neither probes nor enqueues, though the study's attribute is a plain list
    that either could have claimed and read back as its own; once given back, the other
    releases them once, and the claim is given back after it too."""
    store, job, study = _job(f"sqlite:///{tmp_path}/jobs.db", "a", "b")
    _, held = hold(_corners(), SPACE, BOTH, probes=True)
    for params in _corners():
        if params not in held:
            study.enqueue_trial(params)
    study.set_user_attr(keys.HELD_CORNERS, held)
    first, second, third = _corners()[:3]
    _ran(study, first, 50.0)
    _ran(study, second, 55.0)  # the float8 corner of each block: they may be released now

    a, b = claims_of(store, job, study, "a"), claims_of(store, job, study, "b")
    probes = _Probes(IN_FLOAT8)
    kwargs: dict[str, Any] = {"predict": probes, "device_type": "cuda"}
    assert a.take(RELEASE_KEY)  # a is releasing them (it probes, say)
    assert release(study, SPACE, claims=b, **kwargs) is None
    assert not probes.asked and study.user_attrs[keys.HELD_CORNERS] == held
    a.release(RELEASE_KEY)
    said = release(study, SPACE, claims=b, **kwargs)
    assert said is not None and said.endswith("(probed after trial 1)")
    assert len(probes.asked) == 1 and study.user_attrs[keys.HELD_CORNERS] == []
    assert a.take(RELEASE_KEY)  # b gave its claim back
    a.release(RELEASE_KEY)
    assert release(study, SPACE, claims=a, **kwargs) is None  # released once
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"] for t in waiting] == [
        third,
        held[0] | {"float8_head": "float8"},
    ]
