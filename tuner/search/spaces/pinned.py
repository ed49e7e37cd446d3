"""A `--fix` pin no run of the study could take, refused before the first trial.

A pinned value is in every config the search draws. Where the study's precisions, its model or
the levers it reads (`Lever.conflicts`) refuse it, every draw was refused one at a time as an
invalid combination, each in a line of its own, and the job ended with no trial run
(`--fix float8_linears=none` with the head left at bf16, as the scale space leaves it in a study
that runs float8 alone). Checked once the space is known, before the first trial, a SpaceError
naming the pin and what it allows where it is:

- refused in every precision the study runs (`Lever.refuse_in`), or by the model
  (`Lever.refuse_for`);
- refused beside the other settings whatever the search draws for the levers its rule reads;
- inert under every value the setting it depends on can take (`trainers.INERT`: a DDP bucket
  size with one process, a recompute share without recomputation), where each draw had reset it
  to its default in silence and no trial kept the pin.

A pin refused beside some draws only is left to those draws' refusals, and the space is not
changed: a study stored with it resumes as it was. A pin inert under some values of a searched
setting only cuts that setting to the others (`live_for_pins`): those draws had reset the pin,
run a config the user had ruled out, and the pin filter never recommended it. A rule that reads
a lever searched over a range, or more combinations than `MAX_COMBINATIONS`, is left to each
draw's refusal too.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trainers import INERT, LEVERS, LoopConfig, one_of
from tuner.errors import SpaceError
from tuner.search.spaces.space import Choice, SearchSpace, Spec

if TYPE_CHECKING:
    from torch import nn

    from trainers import Lever

MAX_COMBINATIONS = 256
"""The most combinations of the searched levers a pin's rule reads that are tried."""


def check_pins(space: SearchSpace, precisions: Sequence[str], model: nn.Module | None) -> None:
    """A SpaceError for a pin of `space` no draw could run (the module doc). `precisions`: those
    the study runs; `model`: None where it is built elsewhere (a program's), and checked there.
    `space`: the study's as it will be searched (after `for_processes` and a program's cut)."""
    for name, value in space.fixed.items():
        inert = _inert_pin(space, name, value)
        if inert is not None:
            raise SpaceError(name, value, inert)
        item = LEVERS.get(name)
        if item is None:
            continue
        refused = [item.precision_refusal(value, p) for p in precisions]
        if refused and refused[0] is not None and all(refused):
            raise SpaceError(name, value, refused[0].allowed)
        found = None if model is None else item.model_refusal(value, model)
        if found is not None:
            raise SpaceError(name, value, found.allowed)
        # Its rule beside every combination the search could draw of the levers it reads.
        beside = None if item.conflicts is None else _combinations(space, item, value)
        if beside is not None and not beside[0]:
            raise SpaceError(name, value, beside[1] or "")


def _inert_pin(space: SearchSpace, name: str, value: Any) -> str | None:
    """What a pin of an `INERT` setting allows where every value its owner can take here makes
    it inert (so `trainers.canonical` resets it in every draw); None where some value keeps it."""
    if name not in INERT:
        return None
    other, inert_at, default = INERT[name]
    if value == default:
        return None
    spec = space.params.get(other)
    if isinstance(spec, Choice):
        possible: tuple[Any, ...] = spec.values
    elif spec is not None:
        return None  # searched over a range: left to the draws
    else:
        possible = (space.fixed.get(other, LEVERS[other].default),)
    if not all(v in inert_at for v in possible):
        return None
    shown = possible[0] if len(possible) == 1 else list(possible)
    live = [v for v in LEVERS[other].values() if v not in inert_at] if other in LEVERS else []
    where = f"{other}={one_of(tuple(map(repr, live)))}" if live else f"another {other}"
    extra = ", nproc_per_node 2 or more," if other == "parallel" else ""
    return f"{default!r} with {other}={shown!r} (it applies with {where}{extra} only)"


def live_for_pins(space: SearchSpace) -> SearchSpace:
    """`space` with each searched setting a pin depends on (`trainers.INERT`: recomputation for
    a pinned `checkpoint_share`, the compile mode for `compile_scope`) cut to the values under
    which the pin holds, with a note; fixed where one value is left. Every value inert: refused
    by `check_pins`, which runs first."""
    params, fixed, notes = dict(space.params), dict(space.fixed), list(space.notes)
    for name, value in space.fixed.items():
        other, inert_at, default = INERT.get(name, ("", (), value))
        spec = params.get(other)
        if value == default or not isinstance(spec, Choice):
            continue
        live = tuple(v for v in spec.values if v not in inert_at)
        if not live or len(live) == len(spec.values):
            continue
        why = f"{name} is pinned to {value!r}, reset to {default!r} under the others"
        if len(live) == 1:
            del params[other]
            fixed[other] = live[0]
            notes.append(f"{other} fixed to {live[0]!r}: {why}")
        else:
            params[other] = Choice(values=live)
            notes.append(f"{other} searched over {list(live)} only: {why}")
    if params == space.params:
        return space
    return dataclasses.replace(space, params=params, fixed=fixed, notes=tuple(notes))


def _combinations(space: SearchSpace, item: Lever, value: Any) -> tuple[bool, str | None] | None:
    """Whether `item`'s rule allows its pin beside some combination of the searched levers it
    reads, and its reason for the first it refuses (None: it refuses none); None where a lever
    it reads is not searched over a list, or they make too many combinations."""
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
        allowed = False
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
                allowed = True
            elif why is None:
                why = refusal
        if not grew:
            return allowed, why


def check_left(asked: Sequence[str], live: SearchSpace, said: int) -> SearchSpace:
    """Refuse a space whose searched settings (`asked`) this model, device and launch all took
    out (`live`, its notes from `said` on saying why): every trial would run one config, and a
    job of `activation_checkpointing: [none, blocks]` on a model without blocks "succeeded"
    with two trials of the default (a probe of the service, 2026-12-05). `live`, noted
    ONE_CONFIG where each of its settings has one value: such a space is measured on purpose
    (to pool one config's windows), so it is said, not refused."""
    if asked and not live.params:
        why = "; ".join(live.notes[said:]) or "none of them applies here"
        raise SpaceError(
            "space", list(asked), f"a space with a setting this model can search ({why})"
        )
    if any(searches(spec) for spec in live.params.values()):
        return live  # (none at all, `{}`, is said too: it had run the default without a word)
    if ONE_CONFIG in live.notes:
        return live
    return dataclasses.replace(live, notes=(*live.notes, ONE_CONFIG))


ONE_CONFIG = (
    "no setting left has two values to search (none, a one-value list, or a range with low == "
    "high): each trial measures the same config again, and their windows pool"
)


def searches(spec: Spec) -> bool:
    """Whether `spec` gives a trial a choice: two values or more."""
    return len(spec.values) > 1 if isinstance(spec, Choice) else spec.low < spec.high
