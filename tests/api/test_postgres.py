"""The job table on PostgreSQL: claims with FOR UPDATE SKIP LOCKED, and a whole job.

Needs PostgreSQL on 127.0.0.1:5432 (trust auth, database `test`); skipped when nothing listens.
Each test works in a schema of its own (the `pg_url` fixture of tests/api/conftest.py).
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import make_app, make_worker
from tests.api.helpers import AUTH, TINY_JOB

pytestmark = pytest.mark.postgres


def test_a_job_runs_end_to_end_on_postgres(pg_url: str) -> None:
    with TestClient(make_app(pg_url)) as client:
        job = client.post("/v1/jobs", json=TINY_JOB | {"trials": 2}, headers=AUTH).json()
        assert make_worker(pg_url).run_once()
        done = client.get(job["links"]["self"], headers=AUTH).json()
        assert done["status"] == "succeeded" and done["n_complete"] == 2
        assert client.get(job["links"]["best"], headers=AUTH).status_code == 200
        studies = client.get("/v1/studies", headers=AUTH).json()
        assert [s["name"] for s in studies["items"]] == [job["study"]]
