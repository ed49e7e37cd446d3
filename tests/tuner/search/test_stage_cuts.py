"""What the second stage leaves out on evidence (tuner.search.proposing.cuts): of a lever's
predicted values all but the first, and a value trials measured behind beside other levers
alone; real Optuna on SQLite."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState, create_trial

from tests.tuner.search.test_lever_stage import FLOAT8_SPACE
from tests.tuner.tiny import sqlite_url
from tuner.search.proposing.cuts import measured
from tuner.search.proposing.levers import Staged, second_stage, waiting
from tuner.search.proposing.predictions import Predictions
from tuner.search.proposing.screen import Incumbent, screen_record
from tuner.search.spaces.space import Choice, SearchSpace
from tuner.store import keys

# The float8 probes of the Llama-3.2-1B job, in outline: the head gains, 8M is ranked first of
# the linears' values, `none` second.
PROBES = {
    "float8_head": {"bf16": 10.0, "float8": 6.0},
    "float8_linears": {"all": 30.0, "8M": 27.0, "none": 28.5},
}
PLAIN = {"compile_scope": "model", "float8_head": "bf16", "float8_linears": "all"}
HEAD = PLAIN | {"float8_head": "float8"}


def _predict(leader: FrozenTrial, precision: str | None, names: Any = None) -> Predictions:
    return Predictions(ms=PROBES, floor_ms=1.0)


def _trial(study: optuna.Study, params: dict[str, Any], rate: float, *, screened: bool) -> None:
    """A complete trial at `rate` samples/s, or one screened out there (against trial 0)."""
    attrs: dict[str, Any] = {keys.PRECISION: "float8"}
    if screened:
        against = Incumbent(trial=0, throughput=38.4)
        attrs[keys.SCREEN] = screen_record("screen", [rate - 0.5, rate], against, 0.01)
    study.add_trial(
        create_trial(
            params=params,
            distributions=FLOAT8_SPACE.distributions(),
            value=None if screened else rate,
            state=TrialState.PRUNED if screened else TrialState.COMPLETE,
            user_attrs=attrs,
        )
    )


def _stage(study: optuna.Study) -> str | None:
    leader = max(
        (t for t in study.trials if t.state == TrialState.COMPLETE), key=lambda t: t.values[0]
    )
    return second_stage(
        study,
        FLOAT8_SPACE,
        leader,
        device_type="cuda",
        precision="float8",
        staged=Staged(margin=0.01),
        predict=_predict,
    )


def _study(folder: Path) -> optuna.Study:
    folder.mkdir()
    return optuna.create_study(storage=sqlite_url(folder), direction="maximize")


def _queued(study: optuna.Study) -> list[str]:
    waiting_ = study.get_trials(states=(TrialState.WAITING,))
    return [t.system_attrs["fixed_params"]["float8_linears"] for t in waiting_]


def test_a_float8_leader_stages_the_linears_value_its_probe_ranks_first_alone(
    tmp_path: Path,
) -> None:
    """`float8_linears`' values share one probe: the stage enqueues the one it predicts to gain
    most (8M, 3 ms against `all`) and says why `none` (1.5 ms) is left to the sampler; from 8M,
    once it leads, the same figures predict `none` slower, so it is not staged there either."""
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    _trial(study, HEAD, 10.0, screened=False)
    said = _stage(study)
    assert _queued(study) == ["8M"]
    assert said is not None
    assert "(float8_linears=8M predicted +3.00 ms a step): 1 enqueued" in said, said
    assert (
        "float8_linears=none: predicted +1.50 ms a step, behind float8_linears=8M's +3.00 ms: "
        "left to the sampler" in said
    )
    # The head back in bf16 is predicted to lose 4 ms: left out on its own prediction.
    assert "float8_head=bf16: predicted -4.00 ms" in said
    for _ in range(waiting(study)):
        study.tell(study.ask(FLOAT8_SPACE.distributions()), 12.0)  # 8M leads
    said = _stage(study)
    # From 8M: `all` is predicted 3 ms slower, `none` 1.5 ms: neither is staged.
    assert _queued(study) == [] and said is not None
    assert "float8_linears=none: predicted -1.50 ms a step against 8M" in said, said
    assert "float8_linears=all: predicted -3.00 ms a step against 8M" in said, said


def test_a_value_that_lost_beside_other_levers_alone_is_not_staged_again(tmp_path: Path) -> None:
    """The Llama-3.2-1B job's trials 3, 12 and 13: 8M screened out at 37.5 from plain float8
    (38.4), then the head in float8 led at 41.3. From it, 8M is not staged again, and `none`,
    ranked behind 8M, is left to the sampler: nothing is enqueued."""
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    _trial(study, PLAIN, 38.4, screened=False)
    _trial(study, PLAIN | {"float8_linears": "8M"}, 37.5, screened=True)
    _trial(study, HEAD, 41.3, screened=False)
    assert measured(study.trials[1]) == 37.5 and measured(study.trials[2]) == 41.3
    said = _stage(study)
    assert _queued(study) == [] and waiting(study) == 0
    assert said is not None
    assert (
        "float8_linears=8M: trial 1 measured it at 37.5 samples/s against trial 0's 38.4 with "
        "float8_linears=all" in said
    ), said
    assert "float8_linears=none: predicted +1.50 ms a step, behind float8_linears=8M's" in said


def test_a_value_ahead_of_its_base_or_measured_beside_another_setting_is_staged(
    tmp_path: Path,
) -> None:
    # 8M ahead of its base by more than the margin: no evidence against it.
    study = _study(tmp_path / "ahead")
    _trial(study, PLAIN, 38.4, screened=False)
    _trial(study, PLAIN | {"float8_linears": "8M"}, 39.5, screened=False)
    _trial(study, HEAD, 41.3, screened=False)
    _stage(study)
    assert _queued(study) == ["8M"]
    # 8M lost where each block was compiled, a setting the leader does not share: staged.
    study = _study(tmp_path / "blocks")
    blocks = PLAIN | {"compile_scope": "blocks"}
    _trial(study, blocks, 38.4, screened=False)
    _trial(study, blocks | {"float8_linears": "8M"}, 37.5, screened=True)
    _trial(study, HEAD, 41.3, screened=False)
    _stage(study)
    assert _queued(study) == ["8M"]


def test_a_trial_skipped_on_its_prediction_is_no_measurement(tmp_path: Path) -> None:
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    _trial(study, PLAIN, 38.4, screened=False)
    skipped = {keys.PRECISION: "float8", keys.PREDICTION: {"skip": "slower"}}
    study.add_trial(
        create_trial(
            params=PLAIN | {"float8_linears": "8M"},
            distributions=FLOAT8_SPACE.distributions(),
            state=TrialState.PRUNED,
            user_attrs=skipped,
        )
    )
    assert measured(study.trials[1]) is None
    _trial(study, HEAD, 41.3, screened=False)
    said = _stage(study)
    assert _queued(study) == ["8M"] and said is not None and "measured it" not in said


def test_pairs_that_disagree_leave_a_trial_to_decide(tmp_path: Path) -> None:
    """8M behind plain float8 with the whole model compiled, ahead where the attention is cuDNN
    (another lever the space offers): the measurements disagree, so 8M is staged. A lead inside
    the tie margin is no lead: with that pair alone, 8M is cut."""
    space_levers = FLOAT8_SPACE.params | {"attention": Choice(values=("default", "cudnn"))}
    space = dataclasses.replace(FLOAT8_SPACE, params=space_levers)
    plain, cudnn = PLAIN | {"attention": "default"}, PLAIN | {"attention": "cudnn"}
    trials = [(plain, 38.4), (plain | {"float8_linears": "8M"}, 37.5)]
    trials += [(cudnn, 38.0), (cudnn | {"float8_linears": "8M"}, 39.0)]
    leader = HEAD | {"attention": "default"}
    # (The other value staged is `attention=cudnn`, with `float8_linears=all`.)
    assert _staged_from(tmp_path / "both", space, trials, leader) == ["8M", "all"]
    # 38.6 is 0.5 % ahead of 38.4: inside the 1 % margin, a tie.
    tie = [(plain, 38.4), (plain | {"float8_linears": "8M"}, 38.6)]
    assert _staged_from(tmp_path / "tie", space, tie, leader) == ["all"]


def test_a_copied_trial_or_a_study_of_two_objectives_cuts_nothing(tmp_path: Path) -> None:
    trials = [(PLAIN, 38.4), (PLAIN | {"float8_linears": "8M"}, 37.5)]
    copied = {keys.COPIED_FROM: {"study": "earlier", "trial": 1}}
    assert _staged_from(tmp_path / "copied", FLOAT8_SPACE, trials, HEAD, attrs=copied) == ["8M"]
    two = _staged_from(tmp_path / "two", FLOAT8_SPACE, trials, HEAD, objectives=2)
    assert two == ["8M"]


def _staged_from(
    folder: Path,
    space: SearchSpace,
    trials: list[tuple[dict[str, Any], float]],
    leader: dict[str, Any],
    *,
    attrs: dict[str, Any] | None = None,
    objectives: int = 1,
) -> list[str]:
    """The float8_linears values a stage from `leader` (measured 41.3) enqueues after `trials`
    (params, samples/s; complete, `attrs` on each but the first)."""
    folder.mkdir()
    study = optuna.create_study(
        storage=sqlite_url(folder), directions=["maximize", "minimize"][:objectives]
    )
    for number, (params, rate) in enumerate([*trials, (leader, 41.3)]):
        extra = attrs if attrs and 0 < number < len(trials) else {}
        study.add_trial(
            create_trial(
                params=params,
                distributions=space.distributions(),
                values=[rate, 1.0][:objectives],
                user_attrs={keys.PRECISION: "float8"} | extra,
            )
        )
    second_stage(
        study,
        space,
        study.trials[-1],
        device_type="cuda",
        precision="float8",
        staged=Staged(margin=0.01),
        predict=_predict,
    )
    return _queued(study)
