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
from tuner.evidence.reader import StudyReader, list_studies, load_config, recommendation
from tuner.evidence.recommendation import Recommendation
from tuner.search.options import BASELINES, RunOptions
from tuner.search.search import run_study
from tuner.search.space import SearchSpace
from tuner.search.spaces import load_space, space_from_mapping
from tuner.service.jobstore import JobStore
from tuner.service.settings import WorkerSettings
from tuner.service.spec import JobSpec, WorkloadRegistry
from tuner.service.worker import Worker
from tuner.store.counting import TrialCounts, count_trials

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
    "load_space",
    "recommendation",
    "run_study",
    "space_from_mapping",
]
