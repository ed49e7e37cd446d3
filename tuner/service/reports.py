"""The studies' HTML reports as the service serves them: built once per study state, then served
from memory.

A report (`tuner.evidence.report.build_report`) is one self-contained page, plotly.js inlined
(about 5 MB), and building it reads every trial and draws every plot: seconds for a study of a
few dozen trials. Readers ask for the same page again and again while nothing changes, so the
cache keys a page by the study's state: a hash of the study's attributes and of each trial's
number, state, values, attributes, intermediate values and times. Any change (a trial told, a
recommendation stored) is a new state and so a new page; concurrent requests for a state being
built wait for that one build. The page is also kept gzipped (about a quarter of the bytes), and
its state hash is its ETag.
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import hashlib
import json
import threading
from collections.abc import Callable

import optuna

from tuner.errors import StudyNotFound, named
from tuner.evidence.report import build_report
from tuner.store.storage import made_by_streamtune, not_streamtune

PAGES = 8  # reports kept, the most recently asked for (each ~5 MB, plus ~1.3 MB gzipped)


@dataclasses.dataclass(frozen=True)
class Page:
    html: bytes
    gzipped: bytes
    # The study state's hash as a weak HTTP entity tag: two builds of one state differ in the
    # time the page says it was generated, so a strong tag had named different bytes.
    etag: str


class ReportCache:
    """Reports of the studies in `storage`, built once per study state (module doc)."""

    def __init__(
        self,
        storage: optuna.storages.BaseStorage,
        *,
        pages: int = PAGES,
        build: Callable[..., str] = build_report,
    ) -> None:
        self.storage = storage
        self.pages = pages
        self._build = build
        self._cache: collections.OrderedDict[tuple[str, str], Page] = collections.OrderedDict()
        self._building: dict[tuple[str, str], threading.Lock] = {}
        self._lock = threading.Lock()  # guards the two dicts, never held while building
        self.built = 0  # pages built so far (the rest were served from the cache)

    def state(self, name: str) -> str:
        """The hash of everything the report of study `name` reads; StudyNotFound if none."""
        try:
            study_id = self.storage.get_study_id_from_name(name)
        except KeyError:
            raise StudyNotFound(f"no study named {named(name)} in this storage") from None
        trials = [
            (
                t.number,
                t.state.name,
                t.values,
                t.params,
                t.user_attrs,
                t.intermediate_values,
                t.datetime_start,
                t.datetime_complete,
            )
            for t in self.storage.get_all_trials(study_id, deepcopy=False)
        ]
        attrs = self.storage.get_study_user_attrs(study_id)
        if not made_by_streamtune(attrs, len(trials)):
            raise StudyNotFound(not_streamtune(name))
        text = json.dumps([name, attrs, trials], sort_keys=True, default=repr)
        return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:32]

    def page(self, name: str, *, workload: str | None = None) -> Page:
        """The report of study `name` in its present state; `workload`: the name it shows for
        the workload (a job's, as asked: one study is one job's, so the cache's key holds)."""
        key = (name, self.state(name))
        with self._lock:
            found = self._cached(key)
            if found is not None:
                return found
            building = self._building.setdefault(key, threading.Lock())
        with building:  # one build per state; the others wait for it and take its page
            with self._lock:
                found = self._cached(key)
            if found is not None:
                return found
            study = optuna.load_study(study_name=name, storage=self.storage)
            html = self._build(study, workload=workload)
            data = html.encode("utf-8")
            page = Page(html=data, gzipped=gzip.compress(data, 6), etag=f'W/"{key[1]}"')
            with self._lock:
                self.built += 1
                self._cache[key] = page
                while len(self._cache) > self.pages:
                    self._cache.popitem(last=False)
                self._building.pop(key, None)
        return page

    def _cached(self, key: tuple[str, str]) -> Page | None:
        page = self._cache.get(key)
        if page is not None:
            self._cache.move_to_end(key)
        return page
