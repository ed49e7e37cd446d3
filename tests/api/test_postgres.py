"""The job table on PostgreSQL: claims with FOR UPDATE SKIP LOCKED, and a whole job.

Needs PostgreSQL on 127.0.0.1:5432 (trust auth, database `test`); skipped when nothing listens.
Each test works in a schema of its own (the `pg_url` fixture of tests/api/conftest.py).
"""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.api.conftest import make_app, make_worker
from tests.api.helpers import AUTH, TINY_JOB
from tuner.jobs import JobSpec, JobStore

pytestmark = pytest.mark.postgres


def test_concurrent_claims_take_each_job_once(pg_url: str) -> None:
    store = JobStore(pg_url)
    ids = {store.create(JobSpec(**TINY_JOB), owner="me").id for _ in range(12)}
    claimed: list[str] = []
    lock = threading.Lock()

    def claim_all(name: str) -> None:
        mine = JobStore(pg_url)
        while (job := mine.claim(name, devices=("cpu", "auto"))) is not None:
            with lock:
                claimed.append(job.id)
        mine.close()

    threads = [threading.Thread(target=claim_all, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(claimed) == sorted(ids)  # every job once: none twice, none missed


def test_the_claim_skips_locked_rows(pg_url: str) -> None:
    store = JobStore(pg_url)
    store.create(JobSpec(**TINY_JOB), owner="me")
    statements: list[str] = []
    sa.event.listen(store.engine, "before_cursor_execute",
                    lambda _c, _r, statement, *_: statements.append(statement))
    assert store.claim("w", devices=("cpu",)) is not None
    claim = next(s for s in statements if s.lstrip().upper().startswith("UPDATE"))
    assert "FOR UPDATE SKIP LOCKED" in claim and "RETURNING" in claim


def test_a_job_runs_end_to_end_on_postgres(pg_url: str) -> None:
    with TestClient(make_app(pg_url)) as client:
        job = client.post("/v1/jobs", json=TINY_JOB | {"n_trials": 2}, headers=AUTH).json()
        assert make_worker(pg_url).run_once()
        done = client.get(job["links"]["self"], headers=AUTH).json()
        assert done["status"] == "succeeded" and done["n_complete"] == 2
        assert client.get(job["links"]["best"], headers=AUTH).status_code == 200
        studies = client.get("/v1/studies", headers=AUTH).json()
        assert [s["name"] for s in studies["items"]] == [job["study"]]
