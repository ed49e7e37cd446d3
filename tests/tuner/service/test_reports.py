"""The service's report cache (issue 27): a report is built once per study state and served from
memory, concurrent readers of one state wait for one build, and a change to the study (a trial
told, an attribute set) is a new state and a new page. Real Optuna studies on SQLite."""

from __future__ import annotations

import threading
from pathlib import Path

import optuna
import pytest

from tuner.errors import StudyNotFound
from tuner.service.reports import Page, ReportCache
from tuner.store import keys
from tuner.store import storage as studies


def _study(tmp_path: Path) -> tuple[optuna.storages.BaseStorage, optuna.Study]:
    storage = studies.open_storage(f"sqlite:///{tmp_path}/reports.db")
    study = optuna.create_study(study_name="s", storage=storage)
    study.set_user_attr(keys.META, {"workload": "mlp", "preset": "tiny"})  # streamtune's
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    return storage, study


def test_a_report_is_built_once_per_study_state(tmp_path: Path) -> None:
    storage, study = _study(tmp_path)
    cache = ReportCache(storage)
    first = cache.page("s")
    assert cache.page("s") is first and cache.built == 1
    assert first.html.startswith(b"<!DOCTYPE html>") and b"streamtune report: s" in first.html
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)  # a trial told
    second = cache.page("s")
    assert cache.built == 2 and second.etag != first.etag and second.html != first.html
    study.set_user_attr("note", "seen")  # an attribute set
    assert cache.page("s").etag not in (first.etag, second.etag) and cache.built == 3
    assert cache.page("s") is cache.page("s") and cache.built == 3


def test_concurrent_readers_of_one_state_wait_for_one_build(tmp_path: Path) -> None:
    storage, _ = _study(tmp_path)
    cache = ReportCache(storage)
    pages: list[Page] = []
    start = threading.Barrier(8)

    def read() -> None:
        start.wait()
        pages.append(cache.page("s"))

    threads = [threading.Thread(target=read) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(pages) == 8 and all(page is pages[0] for page in pages)
    assert cache.built == 1


def test_the_cache_keeps_the_latest_pages_only(tmp_path: Path) -> None:
    storage, _ = _study(tmp_path)
    for name in ("a", "b", "c"):
        optuna.create_study(study_name=name, storage=storage)
    cache = ReportCache(storage, pages=2)
    for name in ("a", "b", "c", "c", "b"):
        cache.page(name)
    assert cache.built == 3  # c and b were still kept
    cache.page("a")  # a was dropped for c
    assert cache.built == 4


def test_an_unknown_study_has_no_report(tmp_path: Path) -> None:
    storage, _ = _study(tmp_path)
    with pytest.raises(StudyNotFound, match="no study named 'nope'"):
        ReportCache(storage).page("nope")


def test_another_optuna_programs_study_has_no_report(tmp_path: Path) -> None:
    """A study with trials and no `keys.META` is not streamtune's: its page had been served."""
    storage, _ = _study(tmp_path)
    foreign = optuna.create_study(study_name="foreign", storage=storage)
    foreign.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    with pytest.raises(StudyNotFound, match="'foreign' is not a streamtune study"):
        ReportCache(storage).page("foreign")
