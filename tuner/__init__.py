"""The tuner: Optuna searches over the harness's settings with short real training runs.

Three sub-packages, each importing only those before it (a test pins the order):

- `tuner.store`: where a study lives and what is stored on it (storage, attribute keys, the one
  trial-counting rule, database retries);
- `tuner.evidence`: reading and explaining a study (profiles and their verdicts, the typed
  `Recommendation`, readers, the HTML report, console output);
- `tuner.search`: one study in one process (options, search space, measurement, parity in a
  child process, statistics, the decision, the search loop);
- `tuner.service`: the multi-worker tuning service (tables, job store, trial slots, GPU leases,
  settings, workers, the worker pool).

`tuner.cli` (`python -m tuner`) sits on top. `tuner` never imports `api`, the HTTP layer beside it.
"""

import importlib
from typing import TYPE_CHECKING, Any

from tuner.errors import (
    GpuBusy,
    Interrupted,
    JobConflict,
    JobNotFound,
    NoRecommendation,
    SpaceError,
    SpecError,
    Stopped,
    StudyNotFound,
    TooManyQueued,
    TunerError,
)

# The rest is imported on first use (PEP 562): `python -m tuner` runs this file before its
# command, and importing torch, Optuna and scipy here took 3-7 s on this project's 2-core machine
# (by its load), all before `run` could print its first progress line (issue 29).
_LAZY = {
    "StudyReader": "tuner.evidence.reader",
    "list_studies": "tuner.evidence.reader",
    "load_config": "tuner.evidence.reader",
    "load_precision": "tuner.evidence.reader",
    "recommendation": "tuner.evidence.reader",
    "Recommendation": "tuner.evidence.recommendation",
    "BASELINES": "tuner.search.options",
    "RunOptions": "tuner.search.options",
    "run_study": "tuner.search.study",
    "SearchSpace": "tuner.search.spaces.space",
    "load_space": "tuner.search.spaces.named",
    "space_from_mapping": "tuner.search.spaces.own",
    "JobStore": "tuner.service.jobstore",
    "WorkerSettings": "tuner.service.settings",
    "JobSpec": "tuner.request",
    "WorkloadRegistry": "tuner.service.spec",
    "Worker": "tuner.service.worker",
    "TrialCounts": "tuner.store.counting",
    "count_trials": "tuner.store.counting",
}

if TYPE_CHECKING:
    from tuner.evidence.reader import (
        StudyReader,
        list_studies,
        load_config,
        load_precision,
        recommendation,
    )
    from tuner.evidence.recommendation import Recommendation
    from tuner.request import JobSpec
    from tuner.search.options import BASELINES, RunOptions
    from tuner.search.spaces.named import load_space
    from tuner.search.spaces.own import space_from_mapping
    from tuner.search.spaces.space import SearchSpace
    from tuner.search.study import run_study
    from tuner.service.jobstore import JobStore
    from tuner.service.settings import WorkerSettings
    from tuner.service.spec import WorkloadRegistry
    from tuner.service.worker import Worker
    from tuner.store.counting import TrialCounts, count_trials


def __getattr__(name: str) -> Any:
    """A public name of `_LAZY`, imported from its module on first use."""
    if name not in _LAZY:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BASELINES",
    "GpuBusy",
    "Interrupted",
    "JobConflict",
    "JobNotFound",
    "JobSpec",
    "JobStore",
    "NoRecommendation",
    "Recommendation",
    "RunOptions",
    "SearchSpace",
    "SpaceError",
    "SpecError",
    "Stopped",
    "StudyNotFound",
    "StudyReader",
    "TooManyQueued",
    "TrialCounts",
    "TunerError",
    "Worker",
    "WorkerSettings",
    "WorkloadRegistry",
    "count_trials",
    "list_studies",
    "load_config",
    "load_precision",
    "load_space",
    "recommendation",
    "run_study",
    "space_from_mapping",
]
