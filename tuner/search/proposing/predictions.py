"""What the levers' probes predict a variant saves a step (`Predictions`), and how the stages
ask for them (`Predict`: `tuner.search.proposing.levers.Prober`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any, Protocol

from optuna.trial import FrozenTrial

import trainers


def unpredicted(chosen: Mapping[str, Any]) -> str:
    return f"{moved(chosen)}: no probe predicted it"


def moved(chosen: Mapping[str, Any]) -> str:
    return "float8 with " + ", ".join(f"{n}={v}" for n, v in chosen.items())


class Predict(Protocol):
    """What the second stage asks the probes (`Prober`): the predictions for a leader in a
    precision, from the probes of `names` (None: the levers the space offers)."""

    def __call__(
        self, leader: FrozenTrial, precision: str | None, names: Collection[str] | None = None
    ) -> Predictions | None: ...


@dataclasses.dataclass(frozen=True)
class Predictions:
    """What the levers' probes predict for one leader (`trainers.probe_levers`): each probed
    lever's milliseconds per step by value (or why a value cannot run), and the least gain
    worth a trial, the tie margin of the leader's step (a smaller gain cannot make a leader
    beyond the tie, `Staged.wants`)."""

    ms: Mapping[str, Mapping[Any, float | str]]
    floor_ms: float

    def gain(self, name: str, current: Any, value: Any) -> float | str | None:
        """The milliseconds a step saves with `value` for `current` (a float: kept); why the
        stage leaves it out (a str); None where the lever has no probe (kept, unordered)."""
        if name not in self.ms:
            return None
        figures = self.ms[name]
        if not figures:
            return f"{name}={value}: the model does none of the work it changes"
        new = figures.get(value)
        if isinstance(new, str):
            return f"{name}={value}: {new}"
        gain = self.saved_ms(name, current, value)
        if gain is None:
            return None  # the leader's own value not timed: no prediction
        if gain <= self.floor_ms:
            return (
                f"{name}={value}: predicted {gain:+.2f} ms a step against {current}, under the "
                f"{self.floor_ms:.2f} ms a gain must pass"
            )
        return gain

    def saved_ms(self, name: str, current: Any, value: Any) -> float | None:
        """The milliseconds a step saves with lever `name` at `value` instead of `current`: 0.0
        where the model does none of its work; None where not predicted (no probe, or either
        value not timed or unable to run)."""
        figures = self.ms.get(name)
        if figures is None:
            return None
        if not figures:
            return 0.0
        new, old = figures.get(value), figures.get(current)
        if not isinstance(new, float) or not isinstance(old, float):
            return None
        return old - new

    def saved(self, settled: Mapping[str, Any], chosen: Mapping[str, Any]) -> float | str:
        """What a step saves in float8 with `settled` (every float8 lever's value; these
        predictions the probes' in float8) against a bf16 step: each lever's figure at its
        `unconverted` value (what a bf16 step runs) less its figure at the settled one, summed;
        why not predicted (named by `chosen`, the space's levers) where a value cannot run or a
        figure is missing."""
        gain = 0.0
        for name, value in settled.items():
            new = self.ms.get(name, {}).get(value)
            if isinstance(new, str):
                return f"{moved(chosen)}: {name}={value}: {new}"
            # None: no probe (or it failed), or a figure missing; 0.0: none of its work here.
            saved = self.saved_ms(name, trainers.LEVERS[name].unconverted, value)
            if saved is None:
                return unpredicted(chosen)
            gain += saved
        return gain

    def into(self, settled: Mapping[str, Any], chosen: Mapping[str, Any]) -> float | str:
        """What a step saves moved into float8 with `settled` (`saved`); why the stage leaves
        it out where that is not predicted (a move is staged only where predicted) or the sum
        gains too little."""
        gain = self.saved(settled, chosen)
        if isinstance(gain, float) and gain <= self.floor_ms:
            return (
                f"{moved(chosen)}: predicted {gain:+.2f} ms a step against the leader's, under "
                f"the {self.floor_ms:.2f} ms a gain must pass"
            )
        return gain
