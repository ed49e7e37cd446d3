"""A `--fix` pin no run of the study could take, refused before the first trial.

A pinned value is in every config the search draws. Where the study's precisions, its model or
the levers it reads (`Lever.conflicts`) refuse it, every draw was refused one at a time as an
invalid combination, each in a line of its own, and the job ended with no trial run. Checked
here instead, once the space is known:

- refused in every precision the study runs (`Lever.refuse_in`), or by the model
  (`Lever.refuse_for`): a SpaceError naming the pin and what it allows;
- refused beside the other settings whatever the search draws for the levers its rule reads: a
  SpaceError; beside some of their values only, where it reads one searched lever, that lever is
  searched over the rest, with a note (`float8_linears=none` pinned keeps `float8_head=float8`:
  the head alone in float8 is what `none` means).

A rule that reads a lever searched over a range, or more combinations than `MAX_COMBINATIONS`,
is left to each draw's refusal, as before.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainers import LEVERS, LoopConfig
from tuner.errors import SpaceError
from tuner.search.spaces.named import leave_out
from tuner.search.spaces.space import Choice, SearchSpace

if TYPE_CHECKING:
    from torch import nn

    from trainers import Lever

MAX_COMBINATIONS = 256
"""The most combinations of the searched levers a pin's rule reads that are tried."""


def with_pins_checked(
    space: SearchSpace, precisions: Sequence[str], model: nn.Module | None
) -> SearchSpace:
    """`space`, its searched levers narrowed where a pin's rule allows only some of their
    values; a SpaceError for a pin no draw could run (the module doc). `precisions`: those the
    study runs; `model`: None where it is built elsewhere (a program's), and checked there."""
    for name, value in space.fixed.items():
        item = LEVERS.get(name)
        if item is None:
            continue
        refused = [item.precision_refusal(value, p) for p in precisions]
        if refused and refused[0] is not None and all(refused):
            raise SpaceError(name, value, refused[0].allowed)
        found = None if model is None else item.model_refusal(value, model)
        if found is not None:
            raise SpaceError(name, value, found.allowed)
        if item.conflicts is not None:
            space = _beside_the_rest(space, item, value)
    return space


def _beside_the_rest(space: SearchSpace, item: Lever, value: Any) -> SearchSpace:
    """`space` with the values its pin `item=value` refuses left out of the one searched lever
    its rule reads; a SpaceError where every combination it reads is refused."""
    found = _combinations(space, item, value)
    if found is None:
        return space
    read, allowed, why = found
    if not allowed:
        raise SpaceError(item.name, value, why or "")
    if len(read) != 1:
        return space
    [other] = read
    spec = space.params[other]
    assert isinstance(spec, Choice)
    kept = tuple(v for v in spec.values if (v,) in allowed)
    if kept == spec.values:
        return space
    params, fixed, notes = dict(space.params), dict(space.fixed), list(space.notes)
    reason = f"{item.name}={value!r} is pinned, and allows {why}"
    leave_out(params, fixed, notes, space.name, LEVERS[other], spec, kept, reason)
    return dataclasses.replace(space, params=params, fixed=fixed, notes=tuple(notes))


def _combinations(
    space: SearchSpace, item: Lever, value: Any
) -> tuple[list[str], set[tuple[Any, ...]], str | None] | None:
    """The searched levers `item`'s rule reads beside its pin, the combinations of their values
    it allows, and its reason for one it refuses (None: it refuses none); None where a lever it
    reads is not searched over a list, or they make too many combinations."""
    assert item.conflicts is not None
    defaults = LoopConfig().to_dict()
    read: list[str] = []
    while True:
        specs = [space.params[name] for name in read]
        if not all(isinstance(s, Choice) for s in specs):
            return None
        combos = list(itertools.product(*(s.values for s in specs if isinstance(s, Choice))))
        if len(combos) > MAX_COMBINATIONS:
            return None
        allowed: set[tuple[Any, ...]] = set()
        why: str | None = None
        grew = False
        for combo in combos:
            drawn = dict(zip(read, combo, strict=True))

            def get(other: str, drawn: dict[str, Any] = drawn) -> Any:
                nonlocal grew
                if other in space.params and other not in read:
                    read.append(other)  # its values are tried on the next pass
                    grew = True
                if other in drawn:
                    return drawn[other]
                if other in space.fixed:
                    return space.fixed[other]
                lever = LEVERS.get(other)
                return lever.default if lever is not None else defaults.get(other)

            refusal = item.conflicts(value, get)
            if grew:
                break
            if refusal is None:
                allowed.add(combo)
            elif why is None:
                why = refusal
        if not grew:
            return read, allowed, why
