"""A study stored before a lever module's lever was offered resumes with the space it stored
(`tuner.search.spaces.resume`): a real CPU study in SQLite, then the same job with a test's own
lever offered by the built-in spaces, as a lever added in a later version would be."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tuner.search.test_search import _Phases
from tests.tuner.tiny import load, options, run_json, sqlite_url
from trainers.levers import Lever, ranked, registered
from tuner.errors import TunerError
from tuner.search.spaces.named import load_space
from tuner.search.spaces.resume import offered_since
from tuner.search.spaces.space import Choice, SearchSpace

NAME = "later_lever"

LATER = Lever(
    name=NAME,
    label="a lever a later version offers (a test's own)",
    kind="str",
    default="off",
    added=99,
    options=ranked(("off", "none", "exact", 0), ("on", "none", "exact", 1)),
    offered=("off", "on"),
)


@contextlib.contextmanager
def _offered() -> Iterator[None]:
    with registered(LATER):
        yield


def test_offered_since_names_only_lever_modules_levers_missing_from_an_otherwise_equal_space() -> (
    None
):
    stored = load_space("full")
    with _offered():
        current = load_space("full")
        assert current.params[NAME] == Choice(values=("off", "on"))
        assert offered_since(stored, current) == (NAME,)
        assert offered_since(current, current) == ()
        # A LoopConfig field missing is another question, not a lever offered since.
        params = dict(current.params)
        del params["num_workers"]
        fewer = SearchSpace(name="full", params=params, fixed=current.fixed)
        assert offered_since(fewer, current) == ()
        # So is any other difference beside the new lever.
        fixed = dict(stored.fixed) | {"non_blocking": False}
        other = SearchSpace(name="full", params=stored.params, fixed=fixed)
        assert offered_since(other, current) == ()
    # Without it in the table, nothing is a lever offered since.
    assert offered_since(stored, current) == ()


def test_a_study_stored_before_a_lever_was_offered_resumes_with_its_space(
    tmp_path: Path,
) -> None:
    storage = sqlite_url(tmp_path)
    run_json(options(storage, "s", trials=2))
    before = load(storage, "s").user_attrs["streamtune"]["space"]
    phases = _Phases()
    with _offered():
        assert NAME in load_space("full").params
        result = run_json(options(storage, "s", trials=2), progress=phases)
    assert result["trial_counts"]["complete"] >= 2
    said = [line for line in phases.lines if "was stored before" in line]
    assert said == [
        f"study s was stored before {NAME} was offered: resumed with the space it stored, at "
        "the default of each (another --study searches them)"
    ]
    study = load(storage, "s")
    assert study.user_attrs["streamtune"]["space"] == before  # stored as it was
    assert all(NAME not in t.params for t in study.trials)
    # A new study of the same job searches the lever.
    with _offered():
        run_json(options(storage, "t", trials=1))
    assert NAME in load(storage, "t").user_attrs["streamtune"]["space"]["params"]


def test_a_stored_space_that_differs_otherwise_still_stops_the_job(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    run_json(options(storage, "s", trials=1))
    with _offered(), pytest.raises(TunerError, match="was made with space="):
        run_json(options(storage, "s", trials=1, fix=("num_workers=0", "sync_mode=event")))
