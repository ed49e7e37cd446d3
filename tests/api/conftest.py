"""The service's fixtures: an app on a fresh SQLite file, a client with a token, a real worker."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import ApiSettings
from tests.api.helpers import ADMIN_TOKEN, AUTH, OTHER_TOKEN, SMALL, TINY_JOB, TOKEN, sqlite_url
from tuner.search.options import RunOptions
from tuner.search.study import run_study
from tuner.service.settings import WorkerSettings
from tuner.service.worker import Worker

# Settings come from each test, never from TUNER_* variables of the shell running the suite;
# but the gate memo stays as tests/conftest.py set it (off: each test's studies run their own
# gate and profiles), whichever test module imports this one first.
for _name in [k for k in os.environ if k.startswith("TUNER_") and k != "TUNER_GATE_MEMO"]:
    del os.environ[_name]


def make_app(storage: str, **settings: Any) -> FastAPI:
    values: dict[str, Any] = {
        "storage": storage,
        "api_tokens": f"{TOKEN},{OTHER_TOKEN}",
        "api_admin_tokens": f"ops:{ADMIN_TOKEN}",
    }
    return create_app(ApiSettings(**(values | settings)))


def make_worker(storage: str, **settings: Any) -> Worker:
    values: dict[str, Any] = {"storage": storage} | SMALL
    return Worker(WorkerSettings(**(values | settings)))


@pytest.fixture
def storage(tmp_path: Path) -> str:
    return sqlite_url(tmp_path)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_storage(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database on each backend: an SQLite file, and a PostgreSQL schema (`pg_url`,
    skipped when nothing listens on 127.0.0.1:5432)."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path)
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def client(storage: str) -> Iterator[TestClient]:
    with TestClient(make_app(storage)) as test_client:
        yield test_client


@dataclasses.dataclass(frozen=True)
class Finished:
    """A storage holding one finished job (explicit space) and one study made by `tuner run`."""

    storage: str
    client: TestClient
    job: dict[str, Any]
    local_study: str
    local_rec: dict[str, Any]


EXPLICIT_SPACE = {
    "num_streams": [1, 2],
    "sync_interval": {"low": 1, "high": 4},
    "sync_mode": ["synchronize", "event"],
    "num_workers": 0,
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Finished]:
    storage = sqlite_url(tmp_path_factory.mktemp("finished"))
    local = run_study(
        RunOptions(
            workload="mlp",
            preset="tiny",
            trials=2,
            storage=storage,
            study="local-mlp",
            device="cpu",
            top_k=1,
            final_rounds=1,
            parity_steps=4,
            sampler="random",
            fix=("num_workers=0",),
            protocol=make_worker(storage).settings.protocol(),
        )
    )
    with TestClient(make_app(storage)) as test_client:
        body = TINY_JOB | {"space": EXPLICIT_SPACE, "fix": {"pin_memory": True}}
        created = test_client.post("/v1/jobs", json=body, headers=AUTH)
        assert created.status_code == 201, created.text
        # Profiled as the operator set it: a CPU job's default is none (as `tuner run`'s).
        assert make_worker(storage, profile="baselines").run_once()
        job = test_client.get(created.headers["Location"], headers=AUTH).json()
        assert job["status"] == "succeeded", job
        yield Finished(
            storage=storage,
            client=test_client,
            job=job,
            local_study="local-mlp",
            local_rec=local.to_dict(),
        )
