"""What the second stage leaves out on the evidence it has (`tuner.search.proposing.levers`).

Two cuts, each naming its reason in the stage's progress line:

- **One value per lever** (`first_of_each_lever`): of one lever's values the probes predict,
  only the first in the stage's order is staged. One probe ranks them all, so where its first
  loses a whole step the probe overstated the lever there, and the values it ranks lower rest on
  the same figures; from the first's own stage those figures predict them slower, so only the
  sampler draws them. On the Llama-3.2-1B shape (one H200, two default jobs) `float8_linears=none`
  was enqueued behind `8M` both times, and only the search budget kept it from running.
- **A value measured behind already** (`lost_before`): a lever's value is not staged again from
  a leader where trials measured it behind the same config with the leader's value, in a config
  that differs from the leader only in other levers the space offers. The probes' predictions add
  those levers' gains up (`Predictions.into`), and a measurement stands above a prediction. In
  both of those jobs `8M` lost from the plain float8 leader (36.8 and 37.5 samples/s against
  37.5 and 38.4), was staged again from that leader with its head in float8, and lost again
  (39.2 against 40.0, 40.4 against 41.3): 83 s and 73 s of float8 compile and screen.

A move into float8 (the lever `levers.FLOAT8`, a combination of several) is cut by neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from optuna.trial import FrozenTrial, TrialState

from tuner.search.proposing.screen import screen_value
from tuner.store import keys

if TYPE_CHECKING:
    from tuner.search.proposing.levers import Variant

MOVE = "float8"
"""The lever name of a move into float8 (`levers.FLOAT8`)."""


def first_of_each_lever(found: Sequence[Variant]) -> list[Variant]:
    """`found` (in the stage's order) with each lever's predicted values after its first left
    out, naming that first."""
    first: dict[str, Variant] = {}
    kept: list[Variant] = []
    for variant in found:
        lead, name = variant, variant.lever
        if variant.left_out is None and variant.gain is not None and name != MOVE:
            lead = first.setdefault(name, variant)
        if lead is not variant:
            variant = variant._replace(
                left_out=f"{name}={variant.params[name]}: predicted {variant.gain:+.2f} ms a "
                f"step, behind {name}={lead.params[name]}'s {lead.gain:+.2f} ms: left to the "
                "sampler"
            )
        kept.append(variant)
    return kept


def measured(trial: FrozenTrial) -> float | None:
    """The throughput a trial of this job measured: a complete one's value, a screened-out one's
    screen (None: a trial skipped on its prediction, failed, still running, or copied from an
    earlier study, whose figures another process took: every config of the Llama-3.2-1B row ran
    3 % faster in one job than in the one before)."""
    if trial.user_attrs.get(keys.COPIED_FROM) is not None:
        return None
    if trial.state == TrialState.COMPLETE and trial.values:
        return float(trial.values[0])
    return screen_value(trial) if trial.state == TrialState.PRUNED else None


def lost_before(
    found: Sequence[Variant],
    leader: Mapping[str, Any],
    trials: Iterable[FrozenTrial],
    *,
    levers: Iterable[str],
    runs: Callable[[Mapping[str, Any]], Mapping[str, Any]],
    margin: float,
) -> list[Variant]:
    """`found` with each variant of the `leader`'s own levers (params) left out where `trials`
    hold measured pairs, each one with the variant's value and one with the leader's and every
    other setting the same, that differs from the leader only in other `levers` (not at all: the
    variant's own config, which Optuna's `skip_if_exists` leaves out), and in every such pair
    the first is behind (not ahead by more than `margin`; a config measured more than once by
    its best against the other's worst). `runs(params)`: the settings a trial's params run,
    precision included (`trainers.canonical`), so that a setting left unused does not tell two
    apart. A study of one objective only: with two, a slower config may hold less memory."""
    rates: dict[_Key, list[tuple[int, float]]] = {}
    for trial in trials:
        rate = measured(trial)
        if rate is not None:
            rates.setdefault(_key(runs(trial.params)), []).append((trial.number, rate))
    offered = set(levers)
    led = runs(leader)
    kept: list[Variant] = []
    for variant in found:
        name = variant.lever
        if variant.left_out is None and name != MOVE:
            why = _lost(name, variant.params[name], led, rates, offered - {name}, margin)
            variant = variant._replace(left_out=why) if why else variant
        kept.append(variant)
    return kept


_Key = tuple[tuple[str, str], ...]


def _key(settings: Mapping[str, Any]) -> _Key:
    """Settings as a key: each value by its repr (a float and an int stay apart, as in Optuna)."""
    return tuple(sorted((k, repr(v)) for k, v in settings.items()))


def _lost(
    name: str,
    value: Any,
    led: Mapping[str, Any],
    rates: Mapping[_Key, list[tuple[int, float]]],
    others: set[str],
    margin: float,
) -> str | None:
    """Why `name=value` is not staged from `led` (None: no pair, or one that is not behind)."""
    leader = dict(_key(led))
    said = None
    for key, tried_rates in rates.items():
        tried = dict(key)
        if tried.get(name) != repr(value) or tried.keys() != leader.keys():
            continue
        base = tried | {name: leader[name]}
        apart = {k for k, v in base.items() if v != leader[k]}
        base_rates = rates.get(tuple(sorted(base.items())))
        if base_rates is None or not apart or not apart <= others:
            continue
        number, rate = max(tried_rates, key=lambda r: r[1])
        base_number, base_rate = min(base_rates, key=lambda r: r[1])
        if rate > base_rate * (1.0 + margin):
            return None  # ahead there: the pairs disagree, and a trial decides
        said = said or (
            f"{name}={value}: trial {number} measured it at {rate:,.1f} samples/s against "
            f"trial {base_number}'s {base_rate:,.1f} with {name}={led.get(name)}, the two "
            f"apart from the leader in {', '.join(sorted(apart))} alone"
        )
    return said
