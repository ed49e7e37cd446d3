"""The whole-step CUDA graph of the scale space (tuner.search.spaces.staged): the sampler never
draws it, the second stage tries it once from a leader that can be captured, and a benchmark's
ablation sets it back; real Optuna on SQLite."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from benchmarks.peers_compare import ablations
from tests.tuner.tiny import sqlite_url
from trainers import LoopConfig
from tuner.search.options import make_sampler
from tuner.search.proposing.levers import Staged, lever_stage, second_stage
from tuner.search.spaces.named import load_space, scale_space
from tuner.search.spaces.processes import for_processes
from tuner.search.spaces.resume import as_stored, offered_since
from tuner.search.spaces.space import Choice, SearchSpace
from tuner.search.spaces.staged import draws_hold, staged_fields
from tuner.store import keys
from tuner.store.keys import META

SPACE = scale_space()
# The first value of each searched setting, the whole model compiled: a leader the stage may
# capture (no recomputation, one micro-batch).
LEADER: dict[str, Any] = {f: s.values[0] for f, s in SPACE.params.items() if isinstance(s, Choice)}
LEADER["compile_scope"] = "model"


def _changed(staged: list[dict[str, Any]], leader: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in params.items() if leader.get(k) != v} for params in staged]


def test_the_scale_space_searches_the_graph_on_a_gpu_and_pins_it_off_on_a_cpu() -> None:
    assert SPACE.params["cuda_graph"] == Choice(values=(False, True))
    assert staged_fields(SPACE) == {"cuda_graph": (False, True)}
    assert draws_hold(SPACE) == {"cuda_graph": False}  # what a draw holds it at
    cpu = load_space("scale", cuda=False)
    assert cpu.fixed["cuda_graph"] is False and staged_fields(cpu) == {} == draws_hold(cpu)
    # A space that lists it otherwise is searched as the user listed it.
    assert staged_fields(load_space("compile")) == {} == draws_hold(load_space("compile"))
    assert "cuda_graph" in load_space("compile").params


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_no_draw_takes_the_graph_but_an_enqueued_trial_does(tmp_path: Path, sampler: str) -> None:
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    study.enqueue_trial(LEADER | {"cuda_graph": True})
    graphs = []
    for number in range(16):
        study.sampler = make_sampler(sampler, number, 16, SPACE)
        trial = study.ask()
        graphs.append(SPACE.suggest(trial).cuda_graph)
        study.tell(trial, float(number))
    assert graphs[0] is True and not any(graphs[1:])
    # The same samplers draw it in a space that is not the scale space.
    own = SearchSpace(
        name="own",
        params={"cuda_graph": Choice(values=(False, True)), "num_streams": Choice(values=(1, 2))},
        fixed={"compile": "default"},
    )
    other = optuna.create_study(direction="maximize")
    drawn = set()
    for number in range(16):
        other.sampler = make_sampler(sampler, number, 16, own)
        trial = other.ask()
        drawn.add(own.suggest(trial).cuda_graph)
        other.tell(trial, float(number))
    assert drawn == {False, True}


def test_the_stage_tries_the_graph_from_a_leader_that_can_be_captured() -> None:
    staged = lever_stage(SPACE, LEADER, device_type="cuda", precision="bf16-autocast")
    assert _changed(staged, LEADER) == [{"cuda_graph": True}]
    # Recomputation cannot be captured (`trainers.invalid_reason`); a CPU has no graphs.
    recomputes = LEADER | {"activation_checkpointing": "blocks"}
    staged = lever_stage(SPACE, recomputes, device_type="cuda", precision="bf16-autocast")
    assert not any(p["cuda_graph"] for p in staged)
    assert lever_stage(SPACE, LEADER, device_type="cpu", precision="bf16-autocast") == []
    # A leader under a graph is not tried back without it: that is the config it came from.
    graphed = LEADER | {"cuda_graph": True}
    staged = lever_stage(SPACE, graphed, device_type="cuda", precision="bf16-autocast")
    assert all(p["cuda_graph"] for p in staged)


def _trial(study: optuna.Study, params: dict[str, Any], value: float) -> None:
    study.add_trial(
        create_trial(
            params=params,
            distributions=SPACE.distributions(),
            value=value,
            user_attrs={keys.PRECISION: "float8"},
        )
    )


def test_a_graph_measured_behind_is_not_staged_again_from_the_next_leader(tmp_path: Path) -> None:
    study = optuna.create_study(storage=sqlite_url(tmp_path), direction="maximize")
    staged = Staged(margin=0.01)
    first = LEADER | {"float8_linears": "all"}
    _trial(study, first, 10.0)
    said = second_stage(
        study, SPACE, study.trials[-1], device_type="cuda", precision="float8", staged=staged
    )
    assert said is not None and "cuda_graph=True" in said, said
    queued = study.get_trials(states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"]["cuda_graph"] for t in queued].count(True) == 1
    # Each enqueued trial runs behind the leader, the graph among them.
    for _ in queued:
        trial = study.ask(SPACE.distributions())
        study.tell(trial, 9.0)
    # A new leader apart from the first in the float8 head alone: the graph measured behind the
    # same config without it, so it is left out, saying so.
    _trial(study, first | {"float8_head": "float8"}, 11.0)
    said = second_stage(
        study, SPACE, study.trials[-1], device_type="cuda", precision="float8", staged=staged
    )
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert not any(t.system_attrs["fixed_params"]["cuda_graph"] for t in waiting)
    assert said is not None and "cuda_graph=True: trial" in said, said


def test_the_ablation_sets_the_graph_back_where_the_recommendation_has_it() -> None:
    graphed = LoopConfig(compile="default", optimizer="fused", cuda_graph=True)
    assert ablations(graphed)["without-cuda_graph"] == graphed.replace(cuda_graph=False)
    assert "without-cuda_graph" not in ablations(graphed.replace(cuda_graph=False))


# The scale space as stored before the second stage tried the graph: fixed off, not searched.
BEFORE = SearchSpace(
    name="scale",
    params={f: s for f, s in SPACE.params.items() if f != "cuda_graph"},
    fixed=SPACE.fixed | {"cuda_graph": False},
)


def test_on_a_cpu_the_scale_space_is_the_one_stored_before() -> None:
    """No draw took the graph there before either: fixed off without a note, so a CPU study
    stored before resumes as the same question."""
    cpu = load_space("scale", cuda=False)
    assert cpu.fixed["cuda_graph"] is False and "cuda_graph" not in cpu.params
    assert not any("cuda_graph" in note for note in cpu.notes)
    # Elsewhere a graph that draws could take is fixed with the note that says why.
    assert "cuda_graph fixed to false: no CUDA device" in load_space("compile", cuda=False).notes


def test_under_several_processes_the_graph_is_fixed_off_as_in_the_space_stored_before() -> None:
    two = for_processes(SPACE, 2)
    assert two.fixed["cuda_graph"] is False and "cuda_graph" not in two.params
    assert two == for_processes(BEFORE, 2)  # no note: the same question as before
    assert any(
        n.startswith("cuda_graph fixed") for n in for_processes(load_space("compile"), 2).notes
    )


def test_a_study_stored_before_the_graph_was_staged_resumes_with_its_space(tmp_path: Path) -> None:
    assert offered_since(BEFORE, SPACE) == ("cuda_graph",)
    # One that pinned the graph on asked another question: it stops the job, as before.
    pinned = dataclasses.replace(BEFORE, fixed=BEFORE.fixed | {"cuda_graph": True})
    assert offered_since(pinned, SPACE) == ()
    storage = optuna.storages.RDBStorage(sqlite_url(tmp_path))
    study = optuna.create_study(storage=storage, study_name="s")
    study.set_user_attr(META, {"space": BEFORE.to_dict()})
    space, added = as_stored(storage, "s", {"space": SPACE.to_dict()}, SPACE)
    assert (space, added) == (BEFORE, ("cuda_graph",))
    # Its sampler then has nothing to keep off, and its stage no graph to try.
    assert staged_fields(space) == {}
    assert lever_stage(space, LEADER, device_type="cuda", precision="bf16-autocast") == []
