"""What opens the database gives its connections back when it is done, not when the garbage
collector runs: a process that reads studies in a loop (the API, a user's script calling
`load_config`, a test suite) otherwise runs PostgreSQL out of clients (CI at 44e4d31 failed so).

Real PostgreSQL (`pg_url`): the server's own `pg_stat_activity` counts the connections under the
test's application name. The collector is off during each test, so a connection held only by a
reference cycle (Optuna's RDBStorage keeps its engine in one) counts as open.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from fastapi.testclient import TestClient

import trainers
from api.app import create_app
from api.settings import ApiSettings
from tests.conftest import connections_left, open_connections
from tests.tuner.tiny import options
from tuner.errors import StudyNotFound
from tuner.evidence import reader, report
from tuner.search.study import run_study
from tuner.store import reading
from tuner.store import storage as studies

pytestmark = pytest.mark.postgres


@pytest.fixture(autouse=True)
def _no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_the_storage_helpers_close_what_they_open(pg_url: str) -> None:
    storage = studies.open_storage(pg_url)
    optuna.create_study(study_name="plain", storage=storage)
    assert open_connections(pg_url) > 0  # the count sees an open storage
    studies.close_storage(storage)
    assert connections_left(pg_url) == 0

    with reading.opened_storage(pg_url) as storage:
        assert [s.study_name for s in optuna.get_all_study_summaries(storage)] == ["plain"]
    assert connections_left(pg_url) == 0


def test_reading_a_study_leaves_no_connection_open(pg_url: str, tmp_path: Path) -> None:
    rec = run_study(options(pg_url, "read-me", trials=2))
    assert connections_left(pg_url) == 0  # the search closed the storage it opened

    assert reader.recommendation(pg_url, "read-me").config == rec.config
    assert reader.load_config(pg_url, "read-me") == trainers.load_config(rec.config)
    assert [row["study"] for row in reader.list_studies(pg_url)] == ["read-me"]
    assert report.write_report(pg_url, "read-me", tmp_path / "r.html").stat().st_size > 0
    with pytest.raises(StudyNotFound):
        reader.recommendation(pg_url, "absent")  # an error gives them back too
    assert connections_left(pg_url) == 0


def test_a_stopped_app_gives_its_connections_back(pg_url: str) -> None:
    app = create_app(ApiSettings(storage=pg_url, api_tokens="token-of-this-test-0123"))
    with TestClient(app) as client:
        listed = client.get("/v1/jobs", headers={"Authorization": "Bearer token-of-this-test-0123"})
        assert listed.status_code == 200
        assert open_connections(pg_url) > 0
    assert connections_left(pg_url) == 0
