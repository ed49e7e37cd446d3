"""A run into PostgreSQL (`postgresql+psycopg://`), as a team shares one storage.

Needs PostgreSQL on 127.0.0.1:5432 (trust auth, database `test`); skipped when nothing listens
there. Each run uses its own study name and deletes the study at the end.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator

import optuna
import pytest

from tests.tuner.tiny import counts, options, run_json
from trainers import LoopConfig
from tuner.evidence import export, reader
from tuner.evidence.recommendation import Recommendation
from tuner.store import storage as studies

URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"

pytestmark = pytest.mark.postgres


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


@pytest.fixture
def study_name() -> Iterator[str]:
    if not _listening("127.0.0.1", 5432):
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    name = f"streamtune-test-{uuid.uuid4().hex[:12]}"
    yield name
    storage = studies.open_storage(URL)
    if name in optuna.get_all_study_names(storage):
        optuna.delete_study(study_name=name, storage=storage)


def test_a_run_into_postgres_completes_and_reads_back(study_name: str) -> None:
    rec = run_json(options(URL, study_name, trials=2))
    assert rec["trial_counts"] == counts(2, 0, 0)
    assert reader.recommendation(URL, study_name).to_dict() == rec
    assert LoopConfig.from_dict(rec["config"]) == export.config_from_env(
        dict(
            line.split("=", 1)
            for line in export.export(Recommendation.from_dict(rec), "env").splitlines()
        )
    )
    rows = {row["study"]: row for row in reader.list_studies(URL)}
    assert rows[study_name]["trials"]["complete"] == 2
    assert rows[study_name]["recommended"] == rec["config"]
    # Resuming through the same server adds trials.
    assert run_json(options(URL, study_name, trials=1))["trial_counts"]["complete"] == 3
