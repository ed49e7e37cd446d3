"""The job's time aim on the scale space: what the decision and the profiles after it can do
without is not started where its expected cost would end the job past the aim
(`SCALE_JOB_AIM_S`, 600 s, or a repeat job's `REPEAT_JOB_AIM_S`, 240 s; `profile_cut` for the
profiles, `final_aim` for the final round).

Two parts of the final round are optional, and at 1B each costs minutes:

- the gate of a config that ties with one already gated (`recommend._eligible`): the tie rule
  would choose among them by simplicity, but either may be recommended, within the tie margin;
- a round after the first (`decide._measure_rounds`): more samples for the same entries.

Measured on one H200 (the Qwen1.5-0.5B shape, 4a59f53,
docs/benchmarks/raw/beyond-h200-2026-11-30-4a59f53/): the search's leader (the head alone in
float8) was gated after the search; the final round's first round found the float8 step with the
head in float8 0.6 % ahead, tied; its gate then took 117 s (111 s its eager twin) and a second
round 114 s that left the decision as it was, and the job ended at 1,025 s against the 900 s
it then aimed at. A tied config that is not gated is left out of the decision, with the reason
in the recommendation, and the configs tied with the one now leading are gated in their turn; a
config ahead of every gated one by more than a tie is gated whatever the time, as nothing gated
could stand in for it (with nothing gated yet, the fastest: the decision needs one verdict)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from trainers import LoopConfig
from tuner.search.deciding import profiling
from tuner.search.gating.parity import ParityCache
from tuner.search.measuring.timing import Clock
from tuner.search.options import Retry
from tuner.search.proposing.defaults import (
    PROFILE_CHILD_S,
    PROFILE_COMPILED_S,
    PROFILE_EAGER_S,
    PROFILE_MARGIN_S,
    REPEAT_JOB_AIM_S,
    SCALE_JOB_AIM_S,
)
from tuner.search.spaces.named import SCALE_SPACE
from tuner.search.spaces.space import candidate_key
from tuner.store import keys
from tuner.store.phases import COMPILE, GATE_ENVELOPE, GATE_REFERENCE

GateCost = Callable[[LoopConfig, "str | None"], "float | None"]
"""`(config, its precision or None for the study's)` -> the expected seconds of its gate, or None
where its verdict is already known (no cost)."""


@dataclasses.dataclass
class Aim:
    """The job's clock (`wall`, seconds so far), the seconds it aims to end within (`aim_s`),
    how far inside them the final round ends (`margin_s`: the floor, the profiles' cut, storing
    the recommendation), and each entry's expected gate seconds (`gate_cost`)."""

    wall: Callable[[], float]
    aim_s: float
    gate_cost: GateCost
    margin_s: float = 0.0
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)
    """Entries tied with a gated one and not gated for the aim: why, by name."""
    spent: dict[str, float] = dataclasses.field(default_factory=dict)
    """Each entry's seconds in the last round that measured it (a round's expected cost)."""

    def over(self, expected_s: float, what: str) -> str | None:
        """Why `what` (taking `expected_s`) does not start now, or None where it ends inside."""
        so_far = self.wall()
        if so_far + expected_s + self.margin_s <= self.aim_s:
            return None
        return (
            f"the job had run {so_far:.0f} s and {what} takes about {expected_s:.0f} s; on the "
            f"scale space the final round ends {self.margin_s:.0f} s inside {self.aim_s:.0f} s"
        )

    def gate(self, name: str, config: LoopConfig, precision: str | None) -> str | None:
        """Why `name`'s gate does not start now (None: its verdict is known, or it fits). Its
        expected cost is its trial's (a compile: the eager twin compiles it again), or its last
        final-round run's where that took longer."""
        expected = self.gate_cost(config, precision)
        if expected is None:
            return None
        return self.over(max(expected, self.spent.get(name, 0.0)), "its gate")

    def next_round(self, names: list[str]) -> str | None:
        """Why another round over `names` does not start now (None: it fits)."""
        return self.over(sum(self.spent.get(name, 0.0) for name in names), "another round")


def final_aim(
    space: str, study: optuna.Study, cache: ParityCache, clock: Clock, retry: Retry
) -> Aim | None:
    """On the scale space (`space`): a tied config's gate and a round after the first start only
    where their expected cost ends the job `PROFILE_MARGIN_S` inside `SCALE_JOB_AIM_S`, or for a
    job that started from an earlier study's trials (`tuner.search.earlier`) inside
    `REPEAT_JOB_AIM_S`, as its profiles do (`profile_cut`): a repeat job is asked to answer in 4
    minutes, and a tie its earlier job left ungated for its own aim is a gate it may not afford
    (at 583f50a on one H200 the Qwen1.5-0.5B shape's repeat job began such a gate at 134.5 s,
    docs/benchmarks/README.md, 2026-12-01)."""
    if space != SCALE_SPACE:
        return None

    def cost(config: LoopConfig, precision: str | None) -> float | None:
        """None where the verdict is known, or another process of the job is checking it; else
        the config's slowest trial's seconds, a compile from a cold cache, as its eager twin's is
        (117 s against the trial's 140 s for the float8 step of the Qwen1.5-0.5B shape at
        4a59f53); where the gate makes the config's run where its trial compiled
        (`ParityCache.reuses_trial`: nothing compiles), that trial without its compile, or what
        this job's checks spent on a twin and a run, the larger (the leader's 45 s of a 74 s
        gate on that shape at 4418f03, where the trial's seconds said 146); 0 for a config no
        trial ran (a baseline: its final-round run stands in); and where its precision's
        envelope is not measured yet, what this job's reference and envelope took so far (its
        first check measures one more)."""
        if cache.has(config, precision):
            return None
        envelope = 0.0
        if not cache.envelope_known(precision):
            envelope = clock.seconds[GATE_REFERENCE] + clock.seconds[GATE_ENVELOPE]
        key = cache.key(config, precision).removeprefix(keys.PARITY_PREFIX)
        trials = retry.call(
            lambda: study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), what="trials"
        )
        ran = [t for t in trials if t.user_attrs.get(keys.CONFIG_KEY) == key]
        seconds = [float(t.user_attrs.get(keys.SECONDS) or 0.0) for t in ran]
        if ran and cache.reuses_trial(config, precision):
            compiled = [float((t.user_attrs.get(keys.TIME) or {}).get(COMPILE, 0.0)) for t in ran]
            seconds = [s - c for s, c in zip(seconds, compiled, strict=True)]
            seconds.append(cache.largest_run_s)
        return max(seconds, default=0.0) + envelope

    attrs = retry.call(lambda: study.user_attrs, what="reading the study")
    return Aim(
        wall=lambda: clock.wall_s,
        aim_s=REPEAT_JOB_AIM_S if keys.TRIALS_COPIED in attrs else SCALE_JOB_AIM_S,
        gate_cost=cost,
        margin_s=PROFILE_MARGIN_S,
    )


def profile_cut(
    space: str,
    profile: str,
    clock: Clock,
    *,
    prepared: bool,
    warmed: tuple[LoopConfig, str | None] | None,
    repeat: bool = False,
    compiled: profiling.CompileSeconds | None = None,
) -> profiling.ProfileCut | None:
    """On the scale space with `--profile baselines`: a profile starts only where its expected
    cost ends the job inside `SCALE_JOB_AIM_S`, or for a job that started from an earlier
    study's trials (`repeat`) inside `REPEAT_JOB_AIM_S` (`tuner.search.proposing.defaults`:
    why). `prepared`: the profiles' child was started ahead; `warmed`: the config it compiled;
    `compiled`: what a config's trials compiled (`trial_compile`), which its profile compiles
    again."""
    if space != SCALE_SPACE or profile == "all":
        return None
    return profiling.time_cut(
        lambda: clock.wall_s,
        REPEAT_JOB_AIM_S if repeat else SCALE_JOB_AIM_S,
        child_s=0.0 if prepared else PROFILE_CHILD_S,
        eager_s=PROFILE_EAGER_S,
        compiled_s=PROFILE_COMPILED_S,
        warmed=warmed,
        margin_s=PROFILE_MARGIN_S,
        compiled_for=compiled,
    )


def trial_compile(
    study: optuna.Study, reference: str | None, retry: Retry
) -> profiling.CompileSeconds:
    """`(config, precision)` -> the longest compile (`keys.TIME`'s `compile`) of the study's
    complete trials of that config in that precision (`reference`: the study's), 0 where none
    ran or none compiled. Read once, when asked first: the profiles come after every trial."""

    @functools.cache
    def compiles() -> dict[str, float]:
        trials = retry.call(
            lambda: study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), what="trials"
        )
        longest: dict[str, float] = {}
        for t in trials:
            key = t.user_attrs.get(keys.CONFIG_KEY)
            seconds = float((t.user_attrs.get(keys.TIME) or {}).get(COMPILE, 0.0))
            if isinstance(key, str):
                longest[key] = max(longest.get(key, 0.0), seconds)
        return longest

    def seconds(config: LoopConfig, precision: str | None) -> float:
        return compiles().get(candidate_key(config, precision, reference), 0.0)

    return seconds
