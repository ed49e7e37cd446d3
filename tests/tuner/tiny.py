"""Small real inputs for the tuner's tests: a tiny protocol, tiny runs, SQLite under tmp_path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from tuner.search.measuring.measure import Protocol
from tuner.search.options import RunOptions
from tuner.search.study import run_study

PROTOCOL = Protocol(warmup=1, windows=3, window_steps=2)
WORKLOADS = "tests.tuner.workloads_for_tests"

# The same small run as command-line flags (what `options()` builds, for `python -m tuner run`).
RUN_FLAGS = (
    "--workload",
    "mlp",
    "--preset",
    "tiny",
    "--device",
    "cpu",
    "--warmup",
    "1",
    "--windows",
    "3",
    "--window-steps",
    "2",
    "--final-rounds",
    "1",
    "--top-k",
    "2",
    "--parity-steps",
    "4",
    "--sampler",
    "random",
    "--fix",
    "num_workers=0",
    "--profile",
    "none",
    # A search budget far above what these runs need: without it a CPU run gets a 30 s budget
    # (`tuner.search.proposing.defaults.CPU_SEARCH_BUDGET_S`), and on a loaded machine a trial
    # counted by a test may never start (CI: a bf16 ResNet-18 study ended after 1 of its 2 trials).
    "--timeout",
    "600",
)


def sqlite_url(directory: Path, name: str = "t.db") -> str:
    return f"sqlite:///{directory}/{name}"


def options(storage: str, study: str, **changes: Any) -> RunOptions:
    """A run of the `mlp` `tiny` workload that takes about half a second; `changes` override."""
    base: dict[str, Any] = {
        "workload": "mlp",
        "preset": "tiny",
        "trials": 3,
        "storage": storage,
        "study": study,
        "device": "cpu",
        "top_k": 2,
        "final_rounds": 1,
        "parity_steps": 4,
        "sampler": "random",
        "protocol": PROTOCOL,
        "fix": ("num_workers=0",),
        "profile": "none",
    }
    return RunOptions(**(base | changes))


def run_json(opts: RunOptions, **kwargs: Any) -> dict[str, Any]:
    """`run_study`, and its recommendation as the JSON the study stores and the API serves."""
    return run_study(opts, **kwargs).to_dict()


def counts(complete: int, failed: int, pruned: int, interrupted: int = 0) -> dict[str, int]:
    """A finished study's `trial_counts` (nothing running or waiting)."""
    return {
        "complete": complete,
        "failed": failed,
        "pruned": pruned,
        "interrupted": interrupted,
        "running": 0,
        "waiting": 0,
    }


def load(storage: str, study: str) -> optuna.Study:
    return optuna.load_study(study_name=study, storage=storage)


def baseline_entries(study: optuna.Study) -> dict[str, dict[str, Any]]:
    """`baseline/<name>/<id>` study attrs, keyed by `<name>/<id>`."""
    return {
        k.removeprefix("baseline/"): v
        for k, v in study.user_attrs.items()
        if k.startswith("baseline/")
    }
