"""A study stored before a lever module's lever was offered resumes with the space it stored
(`tuner.search.spaces.resume`): a real CPU study in SQLite, then the same job with a test's own
lever offered by the built-in spaces, as a lever added in a later version would be."""

from __future__ import annotations

import contextlib
import dataclasses
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


def test_offered_since_names_a_lever_that_offers_more_values_now() -> None:
    """`float8_linears='none'`, offered since 8M: the stored choices kept and more, with the
    note a model's refusal of another value adds now (the lever then left with two values, no
    longer dropped). Fewer or other values, or a note about another setting, stop the job."""
    current = load_space("full")
    assert current.params["float8_linears"] == Choice(values=("all", "8M", "none"))
    params = dict(current.params) | {"float8_linears": Choice(values=("all", "8M"))}
    stored = SearchSpace(name="full", params=params, fixed=current.fixed, notes=current.notes)
    assert offered_since(stored, current) == ("float8_linears",)
    assert offered_since(current, stored) == ()  # a value fewer
    other = dict(params) | {"float8_linears": Choice(values=("all", "4M"))}
    assert offered_since(dataclasses.replace(stored, params=other), current) == ()
    # A value the lever does not offer, added to a space of one's own, is a new question.
    more = dict(current.params) | {"float8_linears": Choice(values=("all", "8M", "none", "4M"))}
    assert offered_since(current, dataclasses.replace(current, params=more)) == ()
    # Stored before the lever at all (the model refused 8M, its default alone then dropped).
    dropped = {n: s for n, s in params.items() if n != "float8_linears"}
    narrowed = {n: s for n, s in current.params.items()} | {
        "float8_linears": Choice(values=("all", "none"))
    }
    note = "float8_linears 8M left out: Sequential cannot take it"
    now = SearchSpace(name="full", params=narrowed, fixed=current.fixed, notes=(note,))
    before = SearchSpace(name="full", params=dropped, fixed=current.fixed)
    assert offered_since(before, now) == ("float8_linears",)
    elsewhere = dataclasses.replace(now, notes=(note, "loss compiled left out: no loss"))
    assert offered_since(before, elsewhere) == ()


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
        f"study s was stored before {NAME} was offered as now: resumed with the space it "
        "stored, each as its trials ran it (another --study searches them)"
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
