"""A study stored before a lever was offered resumes with the space it stored.

A study resumes only where it was made for the same question, its search space included
(`tuner.store.storage.SAME_QUESTION`): its trials answer that space. A lever module's lever
(`trainers.levers`, `Lever.added` >= 1) offered by the built-in spaces since a study was stored
changes the space a job computes for the same model and flags, and the job would stop on it
("was made with space=..."): on 2026-11-30 the float8 head and then `float8_linears`, on every
float8 study of a model the lever can change. Where the stored space is the job's own less
exactly such levers, the job resumes with the stored space instead: its configs hold those levers
at their defaults, as every stored trial ran them, and a new study (another `--study`) searches
them. Anything else that differs is still the question's own and stops the job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import optuna

from trainers import LEVERS, LoopConfig
from tuner.errors import SpaceError
from tuner.search.spaces.space import SearchSpace
from tuner.store.keys import META


def offered_since(stored: SearchSpace, current: SearchSpace) -> tuple[str, ...]:
    """The lever modules' levers `current` searches and `stored` does not, where `stored` is
    `current` less exactly those (its name, fixed settings, notes and every other searched
    setting the same): a space stored before they were offered. Empty otherwise."""
    extra = tuple(name for name in current.params if name not in stored.params)
    fields = {field.name for field in dataclasses.fields(LoopConfig)}
    if not extra or any(n not in LEVERS or n in fields or LEVERS[n].added < 1 for n in extra):
        return ()
    same = (
        stored.name == current.name
        and dict(stored.fixed) == dict(current.fixed)
        and tuple(stored.notes) == tuple(current.notes)
        and dict(stored.params) == {n: s for n, s in current.params.items() if n not in extra}
    )
    return extra if same else ()


def as_stored(
    storage: optuna.storages.BaseStorage,
    name: str,
    info: Mapping[str, Any],
    space: SearchSpace,
) -> tuple[SearchSpace, tuple[str, ...]]:
    """The space to open study `name` with (`info`: the job's META, `space`: its own): the one
    the study stored where that is `space` less levers offered since (`offered_since`), `space`
    otherwise; with the levers it leaves out (empty: none). Whether the study measured this
    model is `tuner.search.identity`'s question, asked after."""
    try:
        attrs = storage.get_study_user_attrs(storage.get_study_id_from_name(name))
    except KeyError:  # no such study yet
        return space, ()
    meta = attrs.get(META)
    if not isinstance(meta, dict) or meta.get("space") == info.get("space"):
        return space, ()
    try:
        stored = SearchSpace.from_dict(meta["space"])
    except (SpaceError, KeyError, TypeError, ValueError):
        return space, ()
    added = offered_since(stored, space)
    return (stored, added) if added else (space, ())
