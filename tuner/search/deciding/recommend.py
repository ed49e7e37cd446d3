"""The recommendation from the final round's samples: which configs may be recommended (the
gate's verdict, the memory cap), the winner and its ties by the tie rule, its speedups over the
baselines, its floor, utilisation and break-even, all in one `Recommendation`."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

import optuna

from trainers import LoopConfig
from trainers.gate import comparable_floor
from tuner.evidence.recommendation import (
    CPU_RUN_NOTE,
    STUDY_FIELDS,
    Entry,
    Floor,
    Interval,
    Recommendation,
)
from tuner.search.deciding.aim import Aim
from tuner.search.gating.verdict import GateVerdict
from tuner.search.measuring.measure import Measurer
from tuner.search.measuring.stats import Measurement, decide, pareto_front, ratio_ci
from tuner.search.options import memory_unmeasured
from tuner.search.spaces.pins import parse_fix, pins_from_mapping
from tuner.search.spaces.space import SIMPLICITY_ORDER, simplicity_key
from tuner.store import storage as studies
from tuner.store.counting import count_trials, gpu_seconds

Precisions = Mapping[str, str | None]
"""Each final-round entry's precision, by name (None or absent: the study's)."""


def _verdict(parity: Callable[..., GateVerdict], config: LoopConfig, precision: str | None) -> Any:
    return parity(config) if precision is None else parity(config, precision)


CPU_NOTE = CPU_RUN_NOTE


@dataclasses.dataclass(kw_only=True)
class _Rounds:
    """What the final round's runs gave, per entry name."""

    samples: dict[str, list[float]]
    memory: dict[str, int | None]
    setup: dict[str, float]
    """The one-off cost a run of the config pays before its first timed step (compilation); the
    largest of the rounds: a user's first run may find the cache as cold as the first round."""
    failures: dict[str, str] = dataclasses.field(default_factory=dict)
    dropped: dict[str, int] = dataclasses.field(default_factory=dict)
    """Entries no longer measured, and after how many rounds: they could no longer tie."""
    settled: int | None = None
    """The rounds run when the last of them left the decision as it was (`_settled`): the
    rounds after it were not run. None: every round ran."""
    cut: int | None = None
    """The rounds run when the next would have ended the job past its time aim
    (`tuner.search.deciding.aim`): the rounds after them were not run. None: no such cut."""
    seconds: float = 0.0


def tie_rule(options: Any) -> str:
    """How a tie is broken: the simplest config (`SIMPLICITY_ORDER`), and, in a study that
    searched precisions, the study's own precision before any other."""
    if getattr(options, "multi_precision", False):
        return f"the study's precision ({options.precision}) first, then {SIMPLICITY_ORDER}"
    return SIMPLICITY_ORDER


def _measurements(
    entries: list[tuple[str, LoopConfig]], rounds: _Rounds, precisions: Precisions | None = None
) -> list[Measurement]:
    # The tie rule's order starts with the precision: a tie goes to the study's own precision
    # (another changes the results, within the gate's equivalence, for no measured gain).
    other = precisions or {}
    return [
        Measurement(
            name=name,
            samples=tuple(rounds.samples[name]),
            memory_bytes=rounds.memory[name],
            key=(int(other.get(name) is not None), *simplicity_key(config)),
        )
        for name, config in entries
        if rounds.samples[name]
    ]


def _eligible(
    measured: list[Measurement],
    configs: Mapping[str, LoopConfig],
    parity: Callable[..., GateVerdict],
    options: Any,
    precisions: Precisions,
    aim: Aim | None = None,
) -> list[Measurement]:
    """The measured configs that passed the gate and stay under the memory cap, in `measured`'s
    order, for the decision (`stats.decide`).

    Gated fastest first, and only those that could change the decision: a config that does not
    tie with the fastest eligible one (decide's rule) can neither win nor tie, so its gate is
    not run. On the 1.1B preset the baselines were 1.55x slower than the winner, and gating them
    was 79 s of a 16-minute job (docs/benchmarks/raw/default-job-h100-2026-11-26-llama-1b-*).
    With `train_steps` (a slower config with no compile can win over the run) or two objectives
    (a slower one can be on the Pareto front), every config is gated. With the job's time `aim`,
    a config whose gate would end the job past it waits until the others are gated, and is left
    out (`aim.left_out`) where one of them ties with it (`tuner.search.deciding.aim`: why)."""
    cap = options.max_memory_bytes
    under = [m for m in measured if cap is None or m.memory_bytes is None or m.memory_bytes <= cap]
    # A config the user's pins rule out (a baseline with 0 workers, where `--fix num_workers=2`
    # said the loop has 2) stays measured, for the speedups, and is not recommended.
    pins = user_pins(options)
    under = [m for m in under if keeps_pins(configs[m.name], pins)]
    every = getattr(options, "train_steps", None) is not None or getattr(
        options, "multi_objective", False
    )
    gating = _Gating(configs, parity, precisions, options.tie_margin, None if every else aim)
    if every:
        passed = [
            m for m in sorted(under, key=lambda m: m.median, reverse=True) if gating.passes(m)
        ]
        return [m for m in under if any(p is m for p in passed)]
    return gating.eligible(under)


def user_pins(options: Any) -> dict[str, Any]:
    """The settings the user pinned (`--fix`, a job's `fix`), typed; {} for none."""
    fix = getattr(options, "fix", ())
    return pins_from_mapping(fix) if isinstance(fix, Mapping) else parse_fix(fix)


def keeps_pins(config: LoopConfig, pins: Mapping[str, Any]) -> bool:
    return all(getattr(config, name) == value for name, value in pins.items())


@dataclasses.dataclass
class _Gating:
    """`_eligible`'s gates, fastest first (its doc), with the job's time `aim` (or None)."""

    configs: Mapping[str, LoopConfig]
    parity: Callable[..., GateVerdict]
    precisions: Precisions
    margin: float
    aim: Aim | None

    def passes(self, m: Measurement) -> bool:
        return bool(_verdict(self.parity, self.configs[m.name], self.precisions.get(m.name)).passed)

    def ties(self, m: Measurement, other: Measurement) -> bool:
        # Either way round: a deferred config may be faster than the gated one it meets.
        return decide([other, m], margin=self.margin).was_tie

    def eligible(self, under: list[Measurement]) -> list[Measurement]:
        """The configs of `under` that passed, in its order. A deferred config that fails its
        gate, or is left out for the aim, leaves the lead: the first pass runs again without it
        (the verdicts are cached), so what ties with the new lead is gated in its turn."""
        out: dict[str, str | None] = {}  # failed its gate (None), or left out for the aim (why)
        while True:
            passed, deferred = self._first_pass([m for m in under if m.name not in out])
            late = self._deferred(passed, deferred)
            if late is None:
                break
            out[late[0]] = late[1]
        if self.aim is not None:
            self.aim.left_out.clear()  # this call's, on the samples it decides on
            self.aim.left_out.update({name: why for name, why in out.items() if why is not None})
        return [m for m in under if any(p is m for p in passed)]

    def _first_pass(
        self, under: list[Measurement]
    ) -> tuple[list[Measurement], list[tuple[Measurement, str]]]:
        """Fastest first, each config that ties with the fastest still in play (passed, or
        deferred): gated, or deferred where the aim says its gate would end the job past it."""
        passed: list[Measurement] = []
        deferred: list[tuple[Measurement, str]] = []
        lead: Measurement | None = None
        for m in sorted(under, key=lambda m: m.median, reverse=True):
            if lead is not None and not self.ties(m, lead):
                continue
            config, precision = self.configs[m.name], self.precisions.get(m.name)
            why = None if self.aim is None else self.aim.gate(m.name, config, precision)
            if why is not None:
                deferred.append((m, why))
            elif self.passes(m):
                passed.append(m)
            else:
                continue
            if lead is None:
                lead = m
        return passed, deferred

    def _deferred(
        self, passed: list[Measurement], deferred: list[tuple[Measurement, str]]
    ) -> tuple[str, str | None] | None:
        """The deferred configs, fastest first: left out where a gated one ties with it, gated
        where none could stand in for it. Returns the first left out (its name and why) or
        failed (its name and None), for the first pass to run again without it; None when
        neither happened."""
        for m, why in deferred:
            anchor = max(passed, key=lambda p: p.median, default=None)
            if anchor is not None and self.ties(m, anchor):
                return m.name, f"tied with {anchor.name} and not gated: {why}"
            if anchor is not None and m.median < anchor.median:
                continue  # slower than a gated config and not tied with it: it cannot be chosen
            if not self.passes(m):
                return m.name, None
            passed.append(m)
        return None


def _base(
    study: optuna.Study,
    options: Any,
    measured: list[Measurement],
    configs: Mapping[str, LoopConfig],
    rounds: _Rounds,
    eligible: list[Measurement],
    precisions: Precisions,
) -> Recommendation:
    """The recommendation's fields that do not depend on which config wins."""
    meta = studies.meta(study)
    trials = study.get_trials(deepcopy=False)
    on_cpu = str(meta.get("device", "")).startswith("cpu")
    return Recommendation(
        study=study.study_name,
        config=None,
        reason=None,
        trial_counts=count_trials(trials),
        gpu_seconds=gpu_seconds(trials, study.user_attrs),
        final_round=tuple(_entry(m, configs[m.name], precisions) for m in measured),
        failures=rounds.failures,
        tie_rule=tie_rule(options),
        tie_margin=options.tie_margin,
        max_memory_bytes=options.max_memory_bytes,
        study_fields={k: meta.get(k) for k in STUDY_FIELDS} | {"fix": user_pins(options)},
        effective=not on_cpu,
        note=_cpu_note(options, str(meta.get("device"))) if on_cpu else None,
        pareto=(
            tuple(_entry(m, configs[m.name], precisions) for m in pareto_front(eligible))
            if options.multi_objective
            else None
        ),
    )


def _cpu_note(options: Any, device: str) -> str:
    """CPU_NOTE, and what a memory cap or objective could not do there: a service job had
    it only in the worker's log (a probe, 2026-12-06)."""
    memory = memory_unmeasured(options, device)
    return CPU_NOTE if memory is None else f"{CPU_NOTE}; {memory}"


def _recommend(
    base: Recommendation,
    eligible: list[Measurement],
    configs: Mapping[str, LoopConfig],
    rounds: _Rounds,
    options: Any,
    baselines: Mapping[str, LoopConfig],
    parity: Callable[..., GateVerdict],
    measurer: Measurer,
    floor_of: Callable[[str], float | None],
    precisions: Precisions,
) -> Recommendation:
    """The winner among `eligible` (with a memory cap, only configs under it), and the figures
    that compare it with the baselines."""
    decision = decide(eligible, order_description=tie_rule(options), margin=options.tie_margin)
    per_batch = measurer.samples_per_batch
    best, reason = _for_run_length(
        decision.best, decision.reason, eligible, rounds, options, per_batch
    )
    samples, setup = rounds.samples, rounds.setup
    step_ms = per_batch / best.median * 1e3
    # Only a floor that bounds this step is shown: same precision, eager kernels, not slower.
    floor_ms = comparable_floor(floor_of(best.name), step_ms)
    chosen = precisions.get(best.name)
    searched = getattr(options, "multi_precision", False)
    return dataclasses.replace(
        base,
        config=configs[best.name].to_dict(),
        reason=reason,
        source=best.name,
        throughput=Interval(median=best.median, ci95=best.ci95),
        step_ms=step_ms,
        peak_memory_bytes=best.memory_bytes,
        utilisation=_utilisation(measurer, step_ms, chosen, configs[best.name]),
        device_memory_bytes=measurer.device_memory_bytes(),
        speedup={name: _speedup(best, samples[name]) for name in baselines if samples[name]},
        ties=tuple(_entry(m, configs[m.name], precisions) for m in decision.ties),
        was_tie=decision.was_tie,
        floor=None if floor_ms is None else Floor(step_ms=floor_ms, ratio=floor_ms / step_ms),
        parity=_verdict(parity, configs[best.name], chosen).public(),
        # The precision to train in, named whenever the study chose among several.
        precision=(chosen or getattr(options, "precision", None)) if searched else None,
        setup_s=setup[best.name],
        break_even_steps={
            name: _break_even(
                setup[best.name] - setup[name],
                per_batch / best.median,
                per_batch / statistics.median(samples[name]),
            )
            for name in baselines
            if samples[name]
        },
        train_steps=getattr(options, "train_steps", None),
    )


def _for_run_length(
    best: Measurement,
    reason: str,
    eligible: list[Measurement],
    rounds: _Rounds,
    options: Any,
    per_batch: int,
) -> tuple[Measurement, str]:
    """With `train_steps`, the user's run length decides: setup + N steps, each at its measured
    median. Only a setup cost can reverse the decision: among configs without one, the tie rule
    (noise-aware, simplest first) already chose."""
    train_steps: int | None = getattr(options, "train_steps", None)
    if train_steps is None:
        return best, reason
    steps: int = train_steps
    setup = rounds.setup

    def total_s(m: Measurement) -> float:
        return setup[m.name] + steps * per_batch / m.median

    fastest = min(eligible, key=lambda m: (total_s(m), m.key))
    if setup[best.name] > 0.0 and fastest.name != best.name:
        reason = (
            f"{train_steps} training steps: {fastest.name} takes {total_s(fastest):.1f} s "
            f"in all against {total_s(best):.1f} s for {best.name}, the fastest per "
            f"step ({best.name} pays {setup[best.name]:.1f} s of setup first)"
        )
        return fastest, reason
    return best, reason


def _break_even(extra_setup_s: float, step_s: float, baseline_step_s: float) -> int | None:
    """Training steps after which the recommended config's extra setup has paid for itself
    against a baseline: 0 when it costs nothing extra, None when it never does (not faster)."""
    if extra_setup_s <= 0.0:
        return 0
    saved = baseline_step_s - step_s
    return None if saved <= 0.0 else math.ceil(extra_setup_s / saved)


def _utilisation(
    measurer: Measurer, step_ms: float, precision: str | None, config: LoopConfig
) -> dict[str, Any] | None:
    use = (
        measurer.utilisation(step_ms, config=config)
        if precision is None
        else measurer.utilisation(step_ms, precision=precision, config=config)
    )
    return None if use is None else dataclasses.asdict(use)


def _speedup(best: Measurement, baseline: list[float]) -> Interval:
    ratio, low, high = ratio_ci(best.samples, baseline)
    return Interval(median=ratio, ci95=(low, high))


def _entry(m: Measurement, config: LoopConfig, precisions: Precisions) -> Entry:
    return Entry(
        name=m.name,
        config=config.to_dict(),
        precision=precisions.get(m.name),
        throughput=Interval(median=m.median, ci95=m.ci95),
        peak_memory_bytes=m.memory_bytes,
        samples=len(m.samples),
    )
