"""Turns in a parallel test run (pytest-xdist, the README's `-n 2`): a test marked `alone` runs
with no other test beside it. `tests/conftest.py` imports the hook."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def _turn(alone: bool) -> Iterator[None]:
    """One test's turn in a parallel run (pytest-xdist; the README's `-n 2`): every test holds
    a shared lock while it runs, and a test marked `alone` holds it exclusively, so that no
    other worker's test runs beside it. The turnstile (`.gate`) is held while the lock is taken:
    an `alone` test waiting for it closes the turnstile, so the other workers' next tests wait
    rather than keep the lock shared for ever. Outside xdist there is one test at a time anyway.
    """
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one per parallel run, its workers' own
    if run is None:
        yield
        return
    base = Path(tempfile.gettempdir()) / f"streamtune-tests-{run}"
    with open(f"{base}.gate", "a") as gate, open(f"{base}.run", "a") as held:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(held, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """The whole protocol (setup, call, teardown), so that a module or session fixture set up
    or torn down for this test runs in its turn too."""
    with _turn(item.get_closest_marker("alone") is not None):
        return (yield)
