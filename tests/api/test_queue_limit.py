"""The per-token queue limit holds under concurrent POSTs (issue 27): 50 POSTs from one token at
once accept exactly `TUNER_MAX_QUEUED_PER_TOKEN` jobs and refuse the rest with 429, on SQLite and
on PostgreSQL (where the count and the insert are serialised per owner by an advisory lock), over
real HTTP to a uvicorn server on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from tests.api.conftest import make_app
from tests.api.helpers import AUTH, OTHER_AUTH, TINY_JOB, free_port, wait_for
from tuner.errors import TooManyQueued
from tuner.service.jobstore import JobStore
from tuner.service.spec import JobSpec

LIMIT = 20
POSTS = 50


def _at_once(count: int, call: object) -> list[object]:
    """`call()` from `count` threads released together; what each returned (or refused)."""
    assert callable(call)
    start = threading.Barrier(count)
    results: list[object] = [None] * count

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = call()
        except TooManyQueued as exc:  # the store's refusal is this call's result
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


@pytest.fixture
def live(any_storage: str) -> Iterator[str]:
    app = make_app(any_storage, max_queued_per_token=LIMIT, access_log=False)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout_s=30, what="uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_fifty_concurrent_posts_of_one_token_accept_exactly_the_limit(live: str) -> None:
    with httpx.Client(base_url=live, headers=AUTH, timeout=60) as http:
        codes = _at_once(POSTS, lambda: http.post("/v1/jobs", json=TINY_JOB).status_code)
        assert sorted(codes) == [201] * LIMIT + [429] * (POSTS - LIMIT)  # type: ignore[type-var]
        queued = http.get("/v1/jobs", params={"status": "queued"}).json()
        assert queued["total"] == LIMIT
        # Another token has a limit of its own.
        assert http.post("/v1/jobs", json=TINY_JOB, headers=OTHER_AUTH).status_code == 201


def test_the_store_holds_the_limit_under_concurrent_creates(any_storage: str) -> None:
    store = JobStore(any_storage)
    spec = JobSpec(**TINY_JOB)
    results = _at_once(POSTS, lambda: store.create(spec, owner="one", max_queued=LIMIT).id)
    refused = [r for r in results if isinstance(r, TooManyQueued)]
    assert len(refused) == POSTS - LIMIT, [r for r in results if isinstance(r, Exception)][:3]
    assert store.list(status="queued", limit=200)[1] == LIMIT
