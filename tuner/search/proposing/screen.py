"""Screen, then gate: what a trial must show before it earns the full measurement and the gate.

At 1B parameters a trial costs minutes and the gate is most of it: on the `llama-1b` preset a
default job gated every trial, also the two that ran 6 % and 4 % slower than the first, at about
57 s each (H100, commit 419ed56). The rule here, applied to every trial of a study that screens
(`screening`: by default the scale space, where that cost is):

1. **Screen.** The trial's first SCREEN_WINDOWS timed windows (after its compile and warm-up) are
   its screen. If the best of them is slower than the incumbent (the fastest complete trial so
   far) by more than the tie margin, the trial stops there: PRUNED, with the screen's figures in
   its record (`keys.SCREEN`). It can neither win nor tie, so it is never gated.
2. **Measure.** A trial that passes its screen runs its remaining windows. If its median then
   falls behind the incumbent by more than the tie margin, it is pruned the same way.
3. **Gate later.** A contender (faster than the incumbent, or tying it) is complete and its gate
   is deferred to the final round, which gates the fastest finalists first and only those that
   could still tie (`tuner.search.deciding.recommend._eligible`). A config that is beaten later in
   the search is then never gated at all.

The best of the screen windows, not their median, is held against the incumbent's median: a
window that met a one-off stall (a late recompile, the allocator growing) must not prune a
config whose steady state ties. The full measurement's median is the stricter second test.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.store import keys

SCREEN_WINDOWS = 2
"""Timed windows in a screen. Two: the first window after warm-up is the one most often hit by a
one-off cost; on the scale space a window is 10 steps (2-4 s at 1B), so a screen adds 4-8 s to a
compile of 15-110 s."""
SCREEN_MODES = ("auto", "on", "off")


def screening(mode: str, space_name: str, *, multi_objective: bool, nproc: int = 1) -> bool:
    """Whether a study screens: `on`, `off`, or `auto` (the scale space, or any space with
    `nproc` > 1 processes per trial; single objective). A study with two objectives does not: a
    slower config can be on the Pareto front.

    Data-parallel trials screen too: each is a torchrun launch, and its gate another (the
    data-parallel gate, `tuner.search.gating.dpgate`); a default job of 2 processes on transformer
    medium (2 H100s) spent its 200 s budget gating its first trials and never reached the
    compiled ones (docs GPU-FACTS)."""
    if multi_objective or mode == "off":
        return False
    if mode == "on":
        return True
    from tuner.search.spaces.named import (
        SCALE_SPACE,  # spaces imports the lever tables, this does not
    )

    return space_name == SCALE_SPACE or nproc > 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Incumbent:
    """The fastest complete trial when a trial starts: what its screen is held against."""

    trial: int
    throughput: float

    def lost(self, throughput: float, margin: float) -> bool:
        """Slower than the incumbent by more than `margin` (a fraction): it cannot tie."""
        return throughput < self.throughput * (1.0 - margin)

    def to_dict(self) -> dict[str, Any]:
        return {"trial": self.trial, "throughput": self.throughput}


def recommendable(
    trials: Iterable[optuna.trial.FrozenTrial],
    *,
    failed: Collection[str] = (),
    cap: int | None = None,
) -> list[optuna.trial.FrozenTrial]:
    """The complete trials that can still be recommended, fastest first (the earlier of two
    equal ones first): not a config the gate failed (`failed`: their config keys) nor one over
    the memory cap."""
    complete = [
        t
        for t in trials
        if t.state == TrialState.COMPLETE
        and t.values
        and t.user_attrs.get(keys.CONFIG_KEY) not in failed
        and not over_cap(t, cap)
    ]
    return sorted(complete, key=lambda t: (-t.values[0], t.number))


def incumbent(
    trials: Iterable[optuna.trial.FrozenTrial],
    *,
    failed: Collection[str] = (),
    cap: int | None = None,
) -> Incumbent | None:
    """The complete trial of highest throughput that can still be recommended (None before
    any; `recommendable`). A trial judged against an incumbent that later fails the gate is run
    again (`tuner.search.search.Search.revive`)."""
    ranked = recommendable(trials, failed=failed, cap=cap)
    if not ranked:
        return None
    best = ranked[0]
    return Incumbent(trial=best.number, throughput=float(best.values[0]))


def screen_record(
    stage: str,
    throughputs: Sequence[float],
    against: Incumbent | None,
    margin: float,
) -> dict[str, Any]:
    """What a trial's screen showed, as stored (`keys.SCREEN`): `stage` is `screen` (its first
    windows) or `measured` (all of them); `value` the figure held against the incumbent."""
    value = max(throughputs) if stage == "screen" else float(statistics.median(throughputs))
    lost = against is not None and against.lost(value, margin)
    return {
        "stage": stage,
        "value": value,
        "windows": len(throughputs),
        "incumbent": None if against is None else against.to_dict(),
        "margin": margin,
        "outcome": "lost" if lost else "contender",
    }


def over_cap(trial: optuna.trial.FrozenTrial, cap: int | None) -> bool:
    """Whether the trial's measured peak is over the memory cap (`--max-memory`)."""
    peak = trial.user_attrs.get(keys.PEAK_MEMORY)
    return cap is not None and isinstance(peak, int | float) and peak > cap


def judged_against(trial: optuna.trial.FrozenTrial) -> int | None:
    """The incumbent trial a screened-out or skipped trial was held against (None: neither)."""
    record = trial.user_attrs.get(keys.SCREEN)
    if isinstance(record, dict) and record.get("outcome") == "lost":
        return (record.get("incumbent") or {}).get("trial")
    found = trial.user_attrs.get(keys.PREDICTION)
    if isinstance(found, dict) and found.get("skip") in ("slower", "tie"):
        number = found.get("incumbent_trial")
        return int(number) if isinstance(number, int) else None
    return None


def screened_out(trial: optuna.trial.FrozenTrial | optuna.Trial) -> bool:
    """A trial pruned by its screen (at either stage)."""
    record = trial.user_attrs.get(keys.SCREEN)
    return isinstance(record, dict) and record.get("outcome") == "lost"


def measured_before(number: int, trials: Sequence[optuna.trial.FrozenTrial]) -> int | None:
    """The trial copied from an earlier study (`tuner.search.earlier`) that measured the config
    of sampled trial `number`, complete or screened out on its measurement (None: run it). A
    repeat job does not measure such a config again: its process keeps none of the copied
    trials' compiled code, so each measurement again is a compile, and the contenders are
    measured side by side on this machine in the final round anyway. TPE over a few categorical
    levers proposes its best again: the repeat job of the Qwen1.5-0.5B shape on an H200
    (2026-12-01) compiled the copied leader and its tie again, 30 s and 58 s of its 196 s before
    the final round. A config this job measured is measured again as before (its windows pooled,
    its code kept); an enqueued trial (a stage's variant, one run again by `Search.revive`:
    Optuna's `fixed_params`) always runs."""
    this = next((t for t in trials if t.number == number), None)
    if this is None or "fixed_params" in this.system_attrs:
        return None
    key = this.user_attrs.get(keys.CONFIG_KEY)
    for other in sorted(trials, key=lambda t: t.number):
        if other.user_attrs.get(keys.CONFIG_KEY) != key or keys.COPIED_FROM not in other.user_attrs:
            continue
        if other.state == TrialState.COMPLETE or screened_out(other):
            return other.number
    return None


def screen_value(trial: optuna.trial.FrozenTrial) -> float | None:
    """The throughput a screened-out trial showed (None for any other trial)."""
    if not screened_out(trial):
        return None
    value = trial.user_attrs[keys.SCREEN].get("value")
    return float(value) if isinstance(value, int | float) else None


def trials_without_gain(values: Sequence[float], margin: float) -> int:
    """How many of `values` (complete trials' throughputs, in trial order) came after the last
    one that beat every earlier value by more than `margin` (a fraction). A gain inside the
    margin raises the best without counting as one: it is run-to-run noise (the tie margin of the
    final round), and a search creeping up by such steps has stopped finding anything."""
    best: float | None = None
    since = 0
    for value in values:
        if best is None or value > best * (1.0 + margin):
            since = 0
        else:
            since += 1
        best = value if best is None else max(best, value)
    return since
