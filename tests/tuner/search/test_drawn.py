"""A trial the second stage would leave out is not run when the sampler draws it or an earlier
stage enqueued it (`tuner.search.proposing.drawn`): real Optuna on SQLite, and a real search of
a tiny model on this CPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState, create_trial

import trainers
from tests.tuner.search.test_lever_stage import OWN_LOSS, _space_file
from tests.tuner.tiny import load, options, sqlite_url
from trainers import LoopConfig
from trainers.levers.loss import LOSS
from tuner.evidence.render import search_text
from tuner.evidence.unrun import pruned_reason
from tuner.search.options import LocalSlots
from tuner.search.proposing.drawn import judged, lever_tie
from tuner.search.proposing.predict import Prediction, tally
from tuner.search.proposing.predictions import Predictions
from tuner.search.proposing.screen import Incumbent, judged_against
from tuner.search.spaces.space import candidate_key
from tuner.search.study import open_search
from tuner.store import keys

# The float8 probes of the Qwen2-style job, in outline (ms a step by value).
PROBES: dict[str, dict[Any, float | str]] = {
    "float8_head": {"bf16": 10.0, "float8": 6.0},
    "float8_linears": {"all": 30.0, "none": 28.9, "8M": "no linear of 8M or more"},
    "attention": {"default": 2.0, "cudnn": 1.5},
}
LEADER = LoopConfig.from_dict({"compile": "default", "float8_head": "float8"})


def _leader(config: LoopConfig = LEADER, precision: str | None = "float8") -> FrozenTrial:
    attrs: dict[str, Any] = {keys.CONFIG: config.to_dict()}
    if precision is not None:
        attrs[keys.PRECISION] = precision
    return create_trial(value=67.4, user_attrs=attrs)


def _tie(precision: str | None = "float8", floor: float = 1.19, **changes: Any) -> str | None:
    drawn = LEADER.replace(**changes).to_dict()
    return lever_tie(drawn, precision, _leader(), Predictions(ms=PROBES, floor_ms=floor))


def test_a_lever_change_predicted_under_the_floor_is_not_run() -> None:
    why = _tie(float8_linears="none")
    assert why is not None
    assert "float8_linears=none: predicted +1.10 ms a step, under the 1.19 ms" in why
    # Above the floor it runs: a gain the stage would have staged.
    assert _tie(float8_linears="none", floor=1.0) is None
    # A change that loses (the head back in bf16, 4 ms slower) is under the floor too.
    assert "predicted -4.00 ms" in (_tie(float8_head="bf16") or "")


def test_the_changed_levers_gains_are_summed() -> None:
    # Each alone is under the floor (+1.10, +0.50); together they pass it and run.
    assert _tie(attention="cudnn") is not None
    assert _tie(attention="cudnn", float8_linears="none") is None
    both = _tie(attention="cudnn", float8_linears="none", floor=2.0)
    assert both is not None and "attention=cudnn, float8_linears=none: predicted +1.60" in both


@pytest.mark.parametrize(
    "changes",
    [
        {"compile_scope": "blocks"},  # no probe times it
        {"micro_batches": 2, "float8_linears": "none"},  # one of the changes no probe times
        {"float8_linears": "8M"},  # a value its probe could not time
        {},  # the leader's own config: measured again as any repeat
    ],
)
def test_a_change_no_probe_predicts_runs(changes: dict[str, Any]) -> None:
    assert _tie(**changes) is None


GRAPHED = LEADER.replace(cuda_graph=True)
"""An incumbent the second stage made: the leader with a whole-step graph, which beat it."""
DRAWS_HOLD = {"cuda_graph": False}  # the scale space's sampler (`spaces.staged.draws_hold`)


def _against_graph(staged: dict[str, Any] | None = DRAWS_HOLD, **changes: Any) -> str | None:
    drawn = LEADER.replace(**changes).to_dict()
    leader = _leader(GRAPHED)
    return lever_tie(drawn, "float8", leader, Predictions(ms=PROBES, floor_ms=1.19), staged)


def test_a_draw_against_a_staged_graph_is_held_against_the_graphs_own_leader() -> None:
    """A draw holds the graph off (the sampler never draws it), so it always differs from a
    graph incumbent there; it is the graph's leader with the levers changed and goes without
    the graph's gain: predicted under the floor against that leader, it is not run."""
    why = _against_graph(float8_linears="none")
    assert why is not None
    assert "float8_linears=none and cuda_graph=False: the leader that trial's cuda_graph" in why
    assert "predicted +1.10 ms a step beside it, under the 1.19 ms" in why
    # The graph's leader itself, beaten by the graph: not run again.
    again = _against_graph()
    assert again is not None and "predicted +0.00 ms" in again
    # A lever change predicted above the floor against the leader still runs, and so does a
    # change no probe times.
    assert _against_graph(attention="cudnn", float8_linears="none") is None
    assert _against_graph(compile_scope="blocks", float8_linears="none") is None


def test_where_the_sampler_draws_the_graph_itself_a_draw_without_it_runs() -> None:
    """In a space whose sampler draws `cuda_graph` (not `scale`), a draw without it is the
    sampler's choice and nothing says the graph beat its own leader: no probe prices it, so it
    runs, as before."""
    assert _against_graph(None, float8_linears="none") is None
    assert _against_graph({}, float8_linears="none") is None
    assert _against_graph(None) is None


def test_another_precision_runs() -> None:
    assert _tie(precision="bf16-autocast", float8_linears="none") is None


def test_a_lever_whose_model_does_none_of_its_work_saves_nothing() -> None:
    """An empty figure (the model makes no SDPA call): the change is predicted to save 0 ms."""
    drawn = LEADER.replace(attention="cudnn").to_dict()
    none = Predictions(ms=PROBES | {"attention": {}}, floor_ms=0.5)
    why = lever_tie(drawn, "float8", _leader(), none)
    assert why is not None and "predicted +0.00 ms" in why


def test_judged_marks_the_prediction_and_the_record_says_why() -> None:
    leader = _leader()
    trials = [leader]
    against = Incumbent(trial=leader.number, throughput=67.4)
    drawn = LEADER.replace(float8_linears="none").to_dict()

    def known(throughput: float, precision: str | None) -> Predictions | None:
        assert (throughput, precision) == (67.4, "float8")
        return Predictions(ms=PROBES, floor_ms=1.19)

    plain = Prediction()
    found = judged(plain, drawn, "float8", trials, against, known, None)
    assert found.skip == "tie" and "under the 1.19 ms" in found.reason
    # Nothing to hold it against, or no probes run yet: it runs.
    assert judged(plain, drawn, "float8", trials, None, known, None) is plain
    assert judged(plain, drawn, "float8", trials, against, lambda *_: None, None) is plain
    # A prediction that already skips it keeps its own reason.
    slower = Prediction(skip="slower", reason="predicted slower")
    assert judged(slower, drawn, "float8", trials, against, known, None) is slower
    # Stored, its row and the search's record say why, and it counts as judged against the
    # incumbent (run again if that one fails its gate: `Search.revive`).
    skipped = create_trial(state=TrialState.PRUNED, user_attrs={keys.PREDICTION: found.to_dict()})
    assert pruned_reason(skipped.user_attrs) == f"not run: {found.reason}"
    assert judged_against(skipped) is None  # no incumbent_trial on a bare Prediction
    counted = tally([skipped])
    assert counted["skipped_tie"] == 1 and counted["predicted"] == 1
    assert "1 not run: a lever change predicted to tie" in (
        search_text(counted | {"screening": True}) or ""
    )


def test_a_search_does_not_run_a_draw_its_stage_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real search of a model with its own loss function: the loss lever's probe predicts no
    gain (fixed here: a CPU's timing of a 4 x 3 cross-entropy is noise), so the leader's second
    stage leaves `loss=compiled` out. The same config enqueued after it (as the sampler may
    draw it) is not run; a config that also changes a setting no probe times runs."""
    monkeypatch.setitem(
        trainers.LEVERS,
        "loss",
        dataclasses.replace(LOSS, probe=lambda where: {"model": 1.0, "compiled": 1.0}),
    )
    storage = sqlite_url(tmp_path)
    opts = options(
        storage,
        "drawn",
        trials=4,
        space=_space_file(tmp_path),
        patience=0,
        workload=OWN_LOSS,
        screen="on",
        tie_margin=0.5,
    )
    search = open_search(opts)
    try:
        # The leader, planted at a speed no CPU run reaches, so that it stays the incumbent
        # whatever the draws measure (as a worker sharing the study would have told it).
        params = {"num_streams": 1, "loss": "model"}
        config = search.space.config_from_params(params)
        search.study.add_trial(
            create_trial(
                params=params,
                distributions=search.space.distributions(),
                value=1e12,
                user_attrs={
                    keys.CONFIG: config.to_dict(),
                    keys.CONFIG_KEY: candidate_key(config, None, None),
                    "median": 1e12,
                },
            )
        )
        # Two draws: the stage (and its probe) runs after the first, while a trial remains.
        search.run_trials(LocalSlots(2))
        search.study.enqueue_trial({"num_streams": 1, "loss": "compiled"})
        search.study.enqueue_trial({"num_streams": 2, "loss": "compiled"})
        search.run_trials(LocalSlots(2))
    finally:
        search.close()
    *_, tie, other = load(storage, "drawn").get_trials()
    assert tie.state == TrialState.PRUNED and keys.WINDOWS not in tie.user_attrs
    prediction = tie.user_attrs[keys.PREDICTION]
    assert prediction["skip"] == "tie"
    assert prediction["reason"].startswith("trial 0 with loss=compiled: predicted +0.00 ms")
    assert judged_against(tie) == 0
    # Another setting changed beside it (num_streams): no probe predicts that, so it is not
    # a tie (it runs and loses its screen, or is skipped on what a draw of its family measured).
    assert other.user_attrs[keys.PREDICTION].get("skip") != "tie"


def test_a_study_trial_list_without_the_incumbent_runs(tmp_path: Path) -> None:
    """The incumbent's number not among the trials read (a race with another worker): run."""
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    drawn = LEADER.replace(float8_linears="none").to_dict()
    found = judged(
        Prediction(),
        drawn,
        "float8",
        study.get_trials(),
        Incumbent(trial=7, throughput=67.4),
        lambda *_: Predictions(ms=PROBES, floor_ms=1.19),
        None,
    )
    assert found.skip is None
