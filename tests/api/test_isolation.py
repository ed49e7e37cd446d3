"""The queue limit and the service under PostgreSQL servers whose default isolation level is not
READ COMMITTED.

Each test gets a database of its own whose default (`ALTER DATABASE ... SET
default_transaction_isolation`) is REPEATABLE READ or SERIALIZABLE, as an operator's server may
have it. The engines pin READ COMMITTED (`tuner.store.retry.POSTGRES_ISOLATION`), so 50 concurrent
POSTs of one token over real HTTP accept exactly the limit and nothing is a 5xx; a store given an
engine that does not pin it (a SERIALIZABLE session) still holds the limit, its lost races
(serialization failures) run again.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from tests.api.conftest import make_app
from tests.api.helpers import AUTH, TINY_JOB, at_once, served, shared_client
from tests.conftest import PG_SERVER, pg_listening
from tuner.errors import TooManyQueued
from tuner.service.spec import JobSpec
from tuner.service.submissions import Submissions
from tuner.service.tables import make_engine
from tuner.store.storage import open_storage

pytestmark = pytest.mark.postgres

LIMIT = 20
POSTS = 50
LEVELS = ["repeatable read", "serializable"]


@pytest.fixture(params=LEVELS)
def strict_db(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(URL, level): a fresh database whose sessions default to `level`."""
    if not pg_listening():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    level = str(request.param)
    name = f"streamtune_iso_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_SERVER, isolation_level="AUTOCOMMIT")  # CREATE DATABASE needs it
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        conn.execute(
            sa.text(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = '{level}'")
        )
    try:
        yield PG_SERVER.rsplit("/", 1)[0] + f"/{name}", level
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        admin.dispose()


def _isolation(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        return str(conn.scalar(sa.text("SHOW transaction_isolation")))


def test_the_database_defaults_to_the_level_and_our_engines_pin_read_committed(
    strict_db: tuple[str, str],
) -> None:
    url, level = strict_db
    plain = sa.create_engine(url)
    try:
        assert _isolation(plain) == level  # the server's default is in force for others
    finally:
        plain.dispose()
    ours = make_engine(url)
    try:
        assert _isolation(ours) == "read committed"
    finally:
        ours.dispose()
    optuna_engine = open_storage(url).engine  # type: ignore[attr-defined]
    assert _isolation(optuna_engine) == "read committed"


def test_concurrent_posts_hold_the_limit_exactly_with_no_5xx(strict_db: tuple[str, str]) -> None:
    url, _ = strict_db
    app = make_app(url, max_queued_per_token=LIMIT, access_log=False)
    with (
        served(app) as port,
        shared_client(f"http://127.0.0.1:{port}", POSTS, headers=AUTH, timeout=60) as http,
    ):
        created = []
        for _ in range(2):  # a second round: the limit is still held with 20 queued
            answers = at_once(POSTS, lambda: http.post("/v1/jobs", json=TINY_JOB))
            assert not [a for a in answers if isinstance(a, Exception)], answers[:3]
            codes = sorted(a.status_code for a in answers)  # type: ignore[attr-defined]
            assert all(c < 500 for c in codes), [
                a.text  # type: ignore[attr-defined]
                for a in answers
                if a.status_code >= 500  # type: ignore[attr-defined]
            ][:3]
            created.append(codes.count(201))
            assert created[-1] + codes.count(429) == POSTS
            queued = http.get("/v1/jobs", params={"status": "queued"}).json()["total"]
            assert queued == LIMIT
        assert created == [LIMIT, 0]  # the first round took exactly the limit, the second none
        job = http.get("/v1/jobs", params={"limit": 1}).json()["items"][0]
        cancelled = http.post(f"/v1/jobs/{job['id']}/cancel")
        assert cancelled.status_code == 200, cancelled.text


# REPEATABLE READ fails no transaction here (it counts in a stale snapshot): nothing to retry.
@pytest.mark.parametrize("strict_db", ["serializable"], indirect=True)
def test_a_store_on_an_unpinned_serializable_engine_retries_its_lost_races(
    strict_db: tuple[str, str],
) -> None:
    url, _ = strict_db
    # Not make_engine: this engine keeps the server's SERIALIZABLE, so concurrent creates conflict.
    engine = sa.create_engine(url, pool_size=POSTS, max_overflow=0)
    store = Submissions(url, engine=engine)
    try:
        spec = JobSpec(**TINY_JOB)
        results = at_once(POSTS, lambda: store.create(spec, owner="one", max_queued=LIMIT).id)
        errors = [r for r in results if isinstance(r, Exception)]
        assert all(isinstance(e, TooManyQueued) for e in errors), errors[:3]
        assert store.list(status="queued", limit=200)[1] == LIMIT
    finally:
        store.close()
