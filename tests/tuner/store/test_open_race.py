"""Processes opening one database and one study at once (the workers of one `run --gpus N` job):
those that lose the creation of the tables open them again, and the one that finds the study
just created waits for its creator's META rather than call it someone else's study. On real
Optuna over a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.errors import TunerError
from tuner.store import storage as studies
from tuner.store.keys import META

INFO = {
    "workload": "mlp",
    "preset": "tiny",
    "space": "full",
    "objectives": ["throughput"],
    "hardware": "cpu",
    "shape": "mlp-tiny",
    "precision": "fp32",
    "precisions": None,
}


_OPENED: list[optuna.storages.RDBStorage] = []


def _storage(url: str) -> optuna.storages.RDBStorage:
    storage = studies.open_storage(url)
    _OPENED.append(storage)
    return storage


@pytest.fixture(autouse=True)
def _closed() -> Iterator[None]:
    """Each storage's connections are closed when its test ends: a long suite on one PostgreSQL
    server otherwise runs out of connections (`too many clients`)."""
    yield
    while _OPENED:
        studies.close_storage(_OPENED.pop())


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'race.db'}"
    return str(request.getfixturevalue("pg_url"))


def _open(storage: optuna.storages.BaseStorage, **kw: float) -> tuple[optuna.Study, bool]:
    return studies.open_study(
        storage,
        "job-race",
        info=INFO,
        directions=[optuna.study.StudyDirection.MAXIMIZE],
        sampler=optuna.samplers.RandomSampler(seed=0),
        pruner=optuna.pruners.NopPruner(),
        **kw,
    )


def _created_without_meta(url: str) -> optuna.Study:
    """The creator between its `create_study` and its `set_user_attr(META)`."""
    return optuna.create_study(
        storage=_storage(url),
        study_name="job-race",
        directions=["maximize"],
    )


def test_a_study_whose_creator_has_not_stored_meta_yet_is_waited_for(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    creator = _created_without_meta(url)
    waits: list[float] = []

    def creator_writes_meanwhile(seconds: float) -> None:
        # The creator's `set_user_attr` lands while this process waits: the wait is exercised
        # however long opening the storage took.
        if not waits:
            creator.set_user_attr(META, INFO)
        waits.append(seconds)

    monkeypatch.setattr(studies.time, "sleep", creator_writes_meanwhile)
    study, resumed = _open(_storage(url), meta_wait_s=30.0)
    assert resumed and study.user_attrs[META] == INFO
    assert len(waits) == 1


def test_two_processes_that_both_find_no_study_do_not_both_take_it_for_their_own(
    url: str,
) -> None:
    """Both read "absent", then both create: the storage says which one did. Two threads on
    two engines open the same name at once; exactly one creates it."""
    # The storages first, one after the other: their tables exist before the race, as a job's
    # parent makes them before its workers start.
    storages = [_storage(url) for _ in range(2)]
    barrier = threading.Barrier(2, timeout=60)
    results: list[bool] = []
    errors: list[BaseException] = []

    def open_one(storage: optuna.storages.BaseStorage) -> None:
        try:
            barrier.wait()
            results.append(_open(storage, meta_wait_s=30.0)[1])
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    threads = [threading.Thread(target=open_one, args=(storage,)) for storage in storages]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert sorted(results) == [False, True]  # one created, one resumed


def test_a_study_that_never_gets_meta_is_still_refused_after_the_wait(url: str) -> None:
    _created_without_meta(url)
    with pytest.raises(TunerError, match="was not made by streamtune"):
        _open(_storage(url), meta_wait_s=0.5)


def test_a_study_with_trials_and_no_meta_is_refused_without_waiting(url: str) -> None:
    """Not one being created: something else made it, and it is refused at once."""
    foreign = _created_without_meta(url)
    foreign.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    began = time.monotonic()
    with pytest.raises(TunerError, match="was not made by streamtune"):
        _open(_storage(url), meta_wait_s=20.0)
    assert time.monotonic() - began < 10.0


def test_a_study_made_for_another_question_is_refused_without_waiting(url: str) -> None:
    creator = _created_without_meta(url)
    creator.set_user_attr(META, INFO | {"preset": "small"})
    began = time.monotonic()
    with pytest.raises(TunerError, match="was made with preset='small'"):
        _open(_storage(url), meta_wait_s=20.0)
    assert time.monotonic() - began < 10.0


def _open_and_close(url: str, start: Any, errors: Any) -> None:
    """In a process of its own (a spawned one: `start` and `errors` are its context's)."""
    start.wait()
    try:
        studies.close_storage(studies.open_storage(url))
        errors.put("")
    except Exception as exc:  # noqa: BLE001 - the parent asserts on what any process met
        errors.put(repr(exc))


def test_processes_started_together_on_a_new_database_all_open_it(url: str) -> None:
    """Six processes create Optuna's tables in one new database at once: every one opens it
    (those that lose a step of the creation, the tables or Alembic's version row, try again)."""
    spawn = multiprocessing.get_context("spawn")
    start, errors = spawn.Barrier(6), spawn.Queue()
    procs = [spawn.Process(target=_open_and_close, args=(url, start, errors)) for _ in range(6)]
    for proc in procs:
        proc.start()
    met = [errors.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
    assert [m for m in met if m] == []
    assert all(proc.exitcode == 0 for proc in procs)
