"""One finished study of the tiny transformer, shared by the tests that only read it."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest

from tests.tuner.tiny import options, sqlite_url
from tuner.evidence.recommendation import Recommendation
from tuner.search.options import RunOptions
from tuner.search.study import run_study


@dataclasses.dataclass(frozen=True)
class Finished:
    storage: str
    study: str
    options: RunOptions
    recommendation: Recommendation

    @property
    def rec(self) -> dict[str, Any]:
        """The recommendation's JSON, as stored and served."""
        return self.recommendation.to_dict()


@pytest.fixture(scope="session")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """`run` of the transformer `tiny` over the full space: 4 trials, baselines every 2."""
    storage = sqlite_url(tmp_path_factory.mktemp("finished"))
    opts = options(
        storage,
        "tiny-full",
        workload="transformer",
        trials=4,
        baseline_every=2,
        final_rounds=2,
        sampler="tpe",
        fix=(),
    )
    with warnings.catch_warnings():
        # The full space tries up to 4 DataLoader workers; torch warns about that on 2 cores.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        rec = run_study(opts)
    return Finished(storage=storage, study="tiny-full", options=opts, recommendation=rec)
