"""The per-token queue limit holds under concurrent POSTs (issue 27): 50 POSTs from one token at
once accept exactly `TUNER_MAX_QUEUED_PER_TOKEN` jobs and refuse the rest with 429, on SQLite and
on PostgreSQL (where the count and the insert are serialised per owner by an advisory lock), over
real HTTP to a uvicorn server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api.conftest import make_app
from tests.api.helpers import AUTH, OTHER_AUTH, TINY_JOB, at_once, served, shared_client
from tuner.errors import TooManyQueued
from tuner.service.jobstore import JobStore
from tuner.service.spec import JobSpec

LIMIT = 20
POSTS = 50


@pytest.fixture
def live(any_storage: str) -> Iterator[str]:
    app = make_app(any_storage, max_queued_per_token=LIMIT, access_log=False)
    with served(app) as port:
        yield f"http://127.0.0.1:{port}"


def test_fifty_concurrent_posts_of_one_token_accept_exactly_the_limit(live: str) -> None:
    with shared_client(live, POSTS, headers=AUTH, timeout=60) as http:
        codes = at_once(
            POSTS, lambda: http.post("/v1/jobs", json=TINY_JOB).status_code, refused=TooManyQueued
        )
        assert sorted(codes) == [201] * LIMIT + [429] * (POSTS - LIMIT)  # type: ignore[type-var]
        queued = http.get("/v1/jobs", params={"status": "queued"}).json()
        assert queued["total"] == LIMIT
        # Another token has a limit of its own.
        assert http.post("/v1/jobs", json=TINY_JOB, headers=OTHER_AUTH).status_code == 201


def test_the_store_holds_the_limit_under_concurrent_creates(any_storage: str) -> None:
    store = JobStore(any_storage)
    spec = JobSpec(**TINY_JOB)
    results = at_once(
        POSTS, lambda: store.create(spec, owner="one", max_queued=LIMIT).id, refused=TooManyQueued
    )
    refused = [r for r in results if isinstance(r, TooManyQueued)]
    assert len(refused) == POSTS - LIMIT, [r for r in results if isinstance(r, Exception)][:3]
    assert store.list(status="queued", limit=200)[1] == LIMIT
