"""The first stage of a compile search: the lever corners, adapted to the space and device."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

import trainers
from tests.tuner.tiny import sqlite_url
from tuner.search.options import RunOptions
from tuner.search.proposing.stages import CORNERS, FEED, first_stage
from tuner.search.spaces.named import load_space
from tuner.search.spaces.space import Choice, IntRange
from tuner.search.study import open_search


def configs(space_name: str, *, cuda: bool, fix: tuple[str, ...] = ()) -> list[dict[str, object]]:
    space = load_space(space_name, fix=fix, cuda=cuda)
    return [
        space.fixed | params for params in first_stage(space, device_type="cuda" if cuda else "cpu")
    ]


def test_on_a_gpu_every_corner_runs_on_the_fixed_feed_in_order() -> None:
    found = configs("compile", cuda=True)
    levers = [(c["compile"], c["optimizer"], c["cuda_graph"]) for c in found]
    assert levers == [(c["compile"], c["optimizer"], c["cuda_graph"]) for c in CORNERS]
    for config in found:
        assert {k: config[k] for k in FEED} == FEED
        trainers.LoopConfig.from_dict(config)  # every corner is a valid config


def test_on_a_cpu_the_cuda_corners_collapse_into_the_valid_ones() -> None:
    found = configs("compile", cuda=False)
    # No graphs and no reduce-overhead on a CPU: the four corners become two distinct configs.
    assert [(c["compile"], c["cuda_graph"]) for c in found] == [("none", False), ("default", False)]
    for config in found:
        assert trainers.invalid_reason(config, device_type="cpu") is None


def test_a_pin_and_a_narrower_space_are_respected() -> None:
    found = configs("compile", cuda=True, fix=("compile=default",))
    assert {c["compile"] for c in found} == {"default"}
    assert [c["cuda_graph"] for c in found] == [True, False]  # corners 1 and 2 became one
    space = load_space("compile")
    space.params["optimizer"] = Choice(values=("as-built", "foreach"))
    space.params["sync_interval"] = IntRange(low=20, high=50)
    found = [space.fixed | p for p in first_stage(space, device_type="cuda")]
    assert {c["optimizer"] for c in found} == {"foreach"}  # fused not offered: the next best
    assert {c["sync_interval"] for c in found} == {20}  # clamped into the range


def test_spaces_without_the_levers_get_no_first_stage() -> None:
    assert configs("full", cuda=True) == []
    assert configs("streams", cuda=True) == []


def test_a_new_study_enqueues_the_corners_and_a_resumed_one_does_not(tmp_path: Path) -> None:
    opts = RunOptions(
        workload="mlp",
        preset="tiny",
        storage=sqlite_url(tmp_path),
        study="staged",
        space="compile",
        device="cpu",
        trials=2,
    )
    for _ in range(2):
        open_search(opts).close()
    study = optuna.load_study(study_name="staged", storage=opts.storage)
    waiting = [t for t in study.trials if t.state == TrialState.WAITING]
    # An enqueued trial holds its params as fixed params until a worker asks for it.
    fixed = [t.system_attrs["fixed_params"] for t in waiting]
    assert [p["compile"] for p in fixed] == ["none", "default"]
    assert all(p["prefetch_depth"] == FEED["prefetch_depth"] for p in fixed)
