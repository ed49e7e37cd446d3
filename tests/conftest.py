"""Shared test set-up: keep torch small and quiet on the 2-core CI machine."""

from __future__ import annotations

import gc
import os
import socket
import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
import torch

from tests.turns import pytest_runtest_protocol  # noqa: F401  (the hook, by its name)

torch.set_num_threads(1)


PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def pg_listening() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=1.0):
            return True
    except OSError:
        return False


# Ends a test's connections still open at its end (`pg_url`), the admin's own excepted.
_END_LEFTOVERS = sa.text(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE application_name = :name AND pid <> pg_backend_pid()"
)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """PostgreSQL on 127.0.0.1:5432, in a schema of this test's own (through `search_path`).

    Skipped when nothing listens there; the schema is dropped at the end (the server may have
    been restarted by the test meanwhile: the admin engine pings its connections first). Every
    connection of the URL carries the schema's name as its `application_name`, so that what a
    test left open can be told apart and ended: the server takes 100 clients, and one suite's
    leftovers, held until a garbage collection or for good, ran it out (CI at 44e4d31).
    """
    if not pg_listening():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    schema = f"streamtune_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_SERVER, pool_pre_ping=True)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{PG_SERVER}?application_name={schema}&options=-csearch_path%3D{schema}"
    finally:
        gc.collect()  # engines only cycles still hold give their connections back first
        with admin.begin() as conn:
            conn.execute(_END_LEFTOVERS, {"name": schema})
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def connections_left(url: str, within_s: float = 5.0) -> int:
    """The connections still open under `url`'s application name once they have had `within_s`
    to go: a client's close returns before the server's backend process exits and leaves
    `pg_stat_activity`, so a count taken at once can still see a connection that is already
    closed (CI at 6a1c4bd saw 1 so, under load). A connection that is kept open stays counted."""
    deadline = time.monotonic() + within_s
    while (left := open_connections(url)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def open_connections(url: str) -> int:
    """The connections open on the server under `url`'s application name (a `pg_url`)."""
    name = sa.engine.make_url(url).query["application_name"]
    admin = sa.create_engine(PG_SERVER)
    try:
        with admin.connect() as conn:
            query = "SELECT count(*) FROM pg_stat_activity WHERE application_name = :name"
            return int(conn.execute(sa.text(query), {"name": name}).scalar_one())
    finally:
        admin.dispose()


# Each test's studies run their own gate, as a first study on a machine does: many tests run one
# workload's studies on one storage and count what the gate ran. Set at import, before any
# fixture of any scope and for every process a test starts; the memo's own tests
# (tests/tuner/search/test_memo.py) turn it back on.
os.environ["TUNER_GATE_MEMO"] = "off"


@pytest.fixture(autouse=True)
def _fresh_dynamo_per_test() -> Iterator[None]:
    """Each test's first compiling run starts with a fresh Dynamo, as in a new process: a run
    keeps the last compiling run's code where the two share a model build and arithmetic
    (`trainers.compilation.reuse_key`), which must not reach from one test into another."""
    from trainers.kept_code import forget_compiled

    forget_compiled()
    yield
