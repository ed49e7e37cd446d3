"""A study stored before a lever was offered resumes with the space it stored.

A study resumes only where it was made for the same question, its search space included
(`tuner.store.storage.SAME_QUESTION`): its trials answer that space. A lever module's lever
(`trainers.levers`, `Lever.added` >= 1) offered by the built-in spaces since a study was stored
changes the space a job computes for the same model and flags, and the job would stop on it
("was made with space=..."): on 2026-11-30 the float8 head and then `float8_linears`, on every
float8 study of a model the lever can change; so does a value such a lever offers since
(`float8_linears='none'`, with the note a model's refusal of another value adds). Where the
stored space is the job's own less exactly such levers or values (and the notes that name
them), the job resumes with the stored space instead: its configs hold those levers as every
stored trial ran them, and a new study (another `--study`) searches them. So too a setting the
`scale` space searches by its second stage alone since (`tuner.search.spaces.staged`: the
whole-step CUDA graph, on 2026-12-04) where the stored space fixed it at the value every draw
keeps. Anything else that differs is still the question's own and stops the job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import optuna

from trainers import LEVERS, LoopConfig
from tuner.errors import SpaceError
from tuner.search.spaces.space import Choice, SearchSpace, Spec
from tuner.search.spaces.staged import STAGED_ONLY, staged_fields
from tuner.store.keys import META


def offered_since(stored: SearchSpace, current: SearchSpace) -> tuple[str, ...]:
    """The lever modules' levers `current` searches and `stored` does not, or searches with
    values `stored` lacks (all of its own kept), where `stored` is `current` less exactly those
    (its name, fixed settings, every other searched setting and the notes that name none of
    them the same): a space stored before they were offered as now. Empty otherwise."""
    extra = tuple(n for n, spec in current.params.items() if stored.params.get(n) != spec)
    fields = {field.name for field in dataclasses.fields(LoopConfig)}
    # Fixed then at the value the sampler keeps it at now: its trials ran it as a draw runs it.
    staged = {
        n for n in staged_fields(current) if n in extra and stored.fixed.get(n) == STAGED_ONLY[n]
    }
    levers = [n for n in extra if n not in staged]
    if not extra or any(n not in LEVERS or n in fields or LEVERS[n].added < 1 for n in levers):
        return ()
    if not all(_grown(n, stored.params.get(n), current.params[n]) for n in levers):
        return ()

    def notes(space: SearchSpace) -> tuple[str, ...]:
        return tuple(note for note in space.notes if note.split(" ", 1)[0] not in extra)

    same = (
        stored.name == current.name
        and {k: v for k, v in stored.fixed.items() if k not in staged} == dict(current.fixed)
        and notes(stored) == notes(current)
        and set(stored.params) <= set(current.params)
        and all(stored.params[n] == s for n, s in current.params.items() if n not in extra)
    )
    return extra if same else ()


def _grown(name: str, stored: Spec | None, current: Spec) -> bool:
    """Whether `current` is lever `name`'s search offered since `stored` (None: not searched
    then): new, or the same choices and more, each of them one the lever offers (a value a
    space of one's own adds is the user's new question)."""
    if stored is None:
        return True
    if not isinstance(stored, Choice) or not isinstance(current, Choice):
        return False
    offered = set(LEVERS[name].offered)
    return set(stored.values) < set(current.values) and set(current.values) <= offered


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
