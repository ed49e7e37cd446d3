"""A workload's data in its space (`tuner/search/spaces/data.py`): an IterableDataset, which each
DataLoader worker copies whole, has `num_workers` fixed at 0 with a note where the space searches
it, and kept where the user pinned it; on a real study (Optuna on SQLite) of a user's factory
whose stream yields dicts."""

from __future__ import annotations

from pathlib import Path

import optuna

from tests.tuner.tiny import options, run_json, sqlite_url
from tuner.search.spaces.data import STREAM_NOTE
from tuner.store import storage as studies

STREAM = "tests.trainers.own_workloads:streamed_dicts"


def test_a_streamed_dataset_is_searched_without_workers(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    run_json(options(storage, "stream", workload=STREAM, fix=(), trials=3))
    study = optuna.load_study(study_name="stream", storage=storage)
    space = studies.meta(study)["space"]
    assert "num_workers" not in space["params"] and space["fixed"]["num_workers"] == 0
    assert STREAM_NOTE in space["notes"]
    trials = [t for t in study.trials if t.state.is_finished()]
    assert trials and all("num_workers" not in t.params for t in trials)
    # The same space for a map-style dataset searches it (mlp's, in this run's options).
    run_json(options(storage, "map", fix=(), trials=1))
    searched = studies.meta(optuna.load_study(study_name="map", storage=storage))["space"]
    assert "num_workers" in searched["params"] and STREAM_NOTE not in searched["notes"]


def test_a_pinned_worker_count_is_kept_for_a_stream(tmp_path: Path) -> None:
    """A dataset that shards by get_worker_info() may run with workers: the user's pin stays."""
    storage = sqlite_url(tmp_path)
    run_json(options(storage, "pinned", workload=STREAM, fix=("num_workers=1",), trials=2))
    study = optuna.load_study(study_name="pinned", storage=storage)
    configs = [t.user_attrs.get("config", {}) for t in study.trials if t.state.is_finished()]
    assert configs and all(c.get("num_workers") == 1 for c in configs), configs
