"""Waiting out a database that is away: which errors are transient, and exponential backoff.

A worker that loses PostgreSQL (a restart, a fail-over, a network cut) keeps its process, its
GPU and what it measured: each database call of its loop is retried (`Backoff.call`) until the
database answers again. The n-th wait is drawn uniformly from [d/2, d], d = min(max_s,
base_s * 2**n) ("equal jitter": never zero, and workers that lost the database together do not
come back in step). SQLAlchemy's `pool_pre_ping` (`tuner.service.tables.make_engine`,
`tuner.store.storage.open_storage`) replaces the pool's dead connections on the first call that
follows.

Only connection-level errors are retried; anything else (a constraint, a bug) is raised at once.

A serialization failure or a deadlock (PostgreSQL's SQLSTATE 40001, 40P01) is not the database
being away: the transaction lost a race and is run again at once (`retry_conflicts`). The engines
pin READ COMMITTED (`POSTGRES_ISOLATION`), where a single statement rarely meets one, but a server
or a pooler may still raise them and a client must never see one.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import optuna
import sqlalchemy.exc

log = logging.getLogger("tuner.retry")
T = TypeVar("T")

# The isolation level every engine of ours asks PostgreSQL for, whatever the server's default
# (`default_transaction_isolation`): the job store's checks (the queue limit, the claims) count
# rows in the statement that writes, after an advisory lock; under REPEATABLE READ or
# SERIALIZABLE the snapshot is taken before the lock is granted and the count is stale.
POSTGRES_ISOLATION = "READ COMMITTED"
# SQLSTATEs of a transaction that lost a race: serialization_failure, deadlock_detected.
CONFLICT_STATES = frozenset({"40001", "40P01"})
CONFLICT_ATTEMPTS = 50

_CONNECTION_ERRORS = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
)
_LOST_IN_A_TRANSACTION = "8s2b"
"""SQLAlchemy's code of "Can't reconnect until invalid transaction is rolled back": a session
whose connection was lost inside a transaction, used again (Optuna's `get_all_trials` runs its
fallback query on the session its first query failed on). Optuna's storage rolls the session
back as it raises, so the call again runs on a new connection. A PostgreSQL restart raised it
in one of several threads writing to it and failed a service job (CI at a0d8c35). Not the
other `PendingRollbackError`, after a failed flush (7s2a), which may be an error in the data."""


def is_conflict(exc: BaseException | None) -> bool:
    """A serialization failure or a deadlock: the same transaction, run again, may succeed."""
    while exc is not None:
        if (
            getattr(exc, "sqlstate", None) in CONFLICT_STATES
            or getattr(exc, "pgcode", None) in CONFLICT_STATES
        ):
            return True
        orig = getattr(exc, "orig", None)
        exc = orig if orig is not None and orig is not exc else exc.__cause__
    return False


def retry_conflicts(fn: Callable[[], T], *, attempts: int = CONFLICT_ATTEMPTS) -> T:
    """`fn()` (one whole transaction), run again after a serialization failure or a deadlock.

    Each retry waits a few milliseconds, drawn at random, so that the transactions that
    conflicted do not meet again in step; the last attempt's error is raised.
    """
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts - 1 or not is_conflict(exc):
                raise
            time.sleep(random.uniform(0.001, 0.002 * 2 ** min(attempt, 6)))
    raise AssertionError("unreachable")  # the loop returns or raises


def is_transient(exc: BaseException) -> bool:
    """The database could not be reached or dropped the connection (worth waiting for).

    Optuna's RDB storage wraps what SQLAlchemy raised in `StorageInternalError`; its cause says
    which.
    """
    if isinstance(exc, _CONNECTION_ERRORS):
        return True
    if isinstance(exc, sqlalchemy.exc.PendingRollbackError):
        return exc.code == _LOST_IN_A_TRANSACTION
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, optuna.exceptions.StorageInternalError):
        return exc.__cause__ is not None and is_transient(exc.__cause__)
    return False


def lost_create_race(exc: BaseException | None) -> bool:
    """Creating a table (or Alembic's version row) that another process created first: what
    processes started together on an empty database run into; opening again succeeds."""
    return isinstance(exc, sqlalchemy.exc.IntegrityError) or (
        isinstance(exc, sqlalchemy.exc.SQLAlchemyError) and "already exists" in str(exc)
    )


@dataclasses.dataclass(kw_only=True, frozen=True)
class Backoff:
    """Retry policy: first wait about `base_s`, doubling up to `max_s`, until `stop` is set."""

    base_s: float = 0.5
    max_s: float = 30.0
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    def delay(self, attempt: int) -> float:
        ceiling = min(self.max_s, self.base_s * 2 ** min(attempt, 30))
        return random.uniform(ceiling / 2, ceiling)

    def call(self, fn: Callable[[], T], *, what: str) -> T:
        """`fn()`, retried after transient database errors; the last error once `stop` is set."""
        attempt = 0
        while True:
            try:
                return fn()
            except Exception as exc:
                if not is_transient(exc) or self.stop.is_set():
                    raise
                wait = self.delay(attempt)
                log.warning(
                    "%s: database unavailable (%s); retrying in %.1f s",
                    what,
                    type(exc.__cause__ or exc).__name__,
                    wait,
                )
                attempt += 1
                if self.stop.wait(wait):
                    raise
