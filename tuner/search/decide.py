"""The decision: re-measure the best configs beside the baselines, interleaved, and recommend.

After the search, the top-k distinct configs (by the median of all their windows) and both
baselines are run again, in rounds: A B C D E, A B C D E, ... so clock and load drift hit all of
them alike. Each one's samples are the window throughputs of all its final-round runs. The
recommendation is the best median of that round; configs whose 95 % bootstrap interval overlaps
the best one's, or whose median is within `tie_margin` (1 %) of it, are ties, and a tie goes to
the simplest config (`tuner.search.space.SIMPLICITY_ORDER`),
baselines included: when the PyTorch default ties with the fastest, the answer is "change nothing".

A config that no longer ties with the leader after a round is not measured again (`_still_tying`):
the rounds spend their time only on the configs that can still be recommended, and the
baselines. The rounds stop early once a round changed nothing (`_settled`): when the decision
(the winner and the configs tied with it) on all samples so far is the one on the samples before
that round, the rounds left are not run; before the first round, the samples are the search's
own (`_searched`: each candidate's trial windows and the baselines' measurements during the
search), so a first round that decides as the search did is the last. Measured on an H100
(GPT-2 124M, the default job at 73b9fe6), a final round was 78 s of a 377 s job, and its third
round re-measured two baselines and two tied configs whose medians were 0.15 % apart, for the
same answer. The final round's stored record (`keys.FINAL_PREFIX`) says which were dropped
when, and after how many rounds the decision settled.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from trainers import LoopConfig
from trainers.gate import comparable_floor
from tuner.evidence.recommendation import STUDY_FIELDS, Entry, Floor, Interval, Recommendation
from tuner.search.gate import GateVerdict
from tuner.search.measure import Failure, Measured, Measurer
from tuner.search.space import SIMPLICITY_ORDER, candidate_key, simplicity_key
from tuner.search.stats import Measurement, decide, pareto_front, ratio_ci
from tuner.search.timing import Clock
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.counting import count_trials, gpu_seconds
from tuner.store.phases import FINAL_ROUND

CPU_NOTE = (
    "measured on a CPU: stream, event and pinned-memory settings have no effect there, so "
    "differences between configs are noise; tune on the GPU you train on"
)


def top_configs(
    study: optuna.Study, k: int, max_memory_bytes: int | None
) -> list[tuple[str, LoopConfig]]:
    """The k best distinct configs of the study's complete trials (all their windows pooled)."""
    return [(name, config) for name, config, _ in top_candidates(study, k, max_memory_bytes)]


def top_candidates(
    study: optuna.Study, k: int, max_memory_bytes: int | None, *, behind: float | None = None
) -> list[tuple[str, LoopConfig, str | None]]:
    """The k best distinct candidates of the study's complete trials (all their windows
    pooled): a config with the precision it ran in (None: the study's; a study searching
    precisions keys each config and precision apart, `tuner.search.space.candidate_key`).
    behind: leave out a candidate whose median is more than this fraction behind the best's (a
    screening study's rule: the screen would prune it now; at 1B each finalist costs a compile)."""
    pooled: dict[str, list[float]] = {}
    first: dict[str, optuna.trial.FrozenTrial] = {}
    # A complete trial whose gate was deferred (a screening study) may have failed it since:
    # it leaves its place among the k to the next.
    verdicts = study.user_attrs
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        key = trial.user_attrs.get(keys.CONFIG_KEY)
        if key is None:
            continue
        verdict = verdicts.get(f"{keys.PARITY_PREFIX}{key}")
        if isinstance(verdict, dict) and verdict.get("passed") is False:
            continue
        memory = trial.user_attrs.get(keys.PEAK_MEMORY)
        if max_memory_bytes is not None and memory is not None and memory > max_memory_bytes:
            continue
        pooled.setdefault(key, []).extend(trial.user_attrs.get(keys.WINDOWS, []))
        first.setdefault(key, trial)
    medians = {key: statistics.median(values) for key, values in pooled.items() if values}
    ranked = sorted(medians, key=medians.__getitem__, reverse=True)
    if behind is not None and ranked:
        floor = medians[ranked[0]] * (1.0 - behind)
        ranked = [key for key in ranked if medians[key] >= floor]
    return [
        (
            f"trial-{first[key].number}",
            LoopConfig.from_dict(first[key].user_attrs[keys.CONFIG]),
            first[key].user_attrs.get(keys.PRECISION),
        )
        for key in ranked[:k]
    ]


Precisions = Mapping[str, str | None]
"""Each final-round entry's precision, by name (None or absent: the study's)."""


def _measure(measurer: Measurer, config: LoopConfig, precision: str | None) -> Measured | Failure:
    # Without a precision of its own, the call a single-precision study always made.
    if precision is None:
        return measurer.measure(config)
    return measurer.measure(config, precision=precision)


def _verdict(parity: Callable[..., GateVerdict], config: LoopConfig, precision: str | None) -> Any:
    return parity(config) if precision is None else parity(config, precision)


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
    seconds: float = 0.0


def final_round(
    study: optuna.Study,
    measurer: Measurer,
    options: Any,
    *,
    progress: Any,
    baselines: Mapping[str, LoopConfig],
    parity: Callable[..., GateVerdict],
    clock: Clock | None = None,
    behind: float | None = None,
) -> Recommendation:
    """Re-measure the finalists beside the baselines, interleaved, and recommend (module doc).

    `parity` gives a config's (cached) gate verdict (`parity(config, precision)` for a
    candidate in a precision of its own); `clock` (optional) takes the time spent; `behind`
    leaves out trials too far behind the best to tie (`top_candidates`).
    """
    clock = clock or Clock()
    entries, precisions = finalist_candidates(study, options, baselines, behind=behind)
    configs = dict(entries)
    searched = _searched(study, entries, baselines, options, precisions)
    rounds = _measure_rounds(
        entries, measurer, options, progress, baselines, parity, clock, precisions, searched
    )
    study.set_user_attr(
        f"{keys.FINAL_PREFIX}{uuid.uuid4().hex[:10]}",
        {
            "seconds": rounds.seconds,
            "entries": [name for name, _ in entries],
            "dropped": dict(rounds.dropped),
            "settled_after": rounds.settled,
        },
    )
    measured = _measurements(entries, rounds, precisions)
    # A config dropped after a round was shown not to tie with the leader then; its fewer
    # samples must not make it look like a tie now (a wider interval).
    eligible = [
        m
        for m in _eligible(measured, configs, parity, options, precisions)
        if m.name not in rounds.dropped
    ]
    base = _base(study, options, measured, configs, rounds, eligible, precisions)
    if not eligible:
        reason = (
            "no config passed parity (and the memory cap)"
            if measured
            else "every final-round measurement failed (see failures)"
        )
        return dataclasses.replace(base, reason=reason)

    def floor_of(name: str) -> float | None:
        # The floor is measured (once) for the winner's precision and compile setting.
        with clock.timing(FINAL_ROUND):
            precision = precisions.get(name)
            if precision is None:
                return measurer.floor_ms(configs[name])
            return measurer.floor_ms(configs[name], precision=precision)

    return _recommend(
        base, eligible, configs, rounds, options, baselines, parity, measurer, floor_of, precisions
    )


def finalists(
    study: optuna.Study, options: Any, baselines: Mapping[str, LoopConfig]
) -> list[tuple[str, LoopConfig]]:
    """The baselines, then the top configs of the search that are not one of them."""
    return finalist_candidates(study, options, baselines)[0]


def finalist_candidates(
    study: optuna.Study,
    options: Any,
    baselines: Mapping[str, LoopConfig],
    *,
    behind: float | None = None,
) -> tuple[list[tuple[str, LoopConfig]], dict[str, str | None]]:
    """The baselines (in the study's precision), then the top candidates of the search that are
    not one of them (`behind`: as `top_candidates`), and each entry's precision (None: the
    study's)."""
    entries: list[tuple[str, LoopConfig]] = list(baselines.items())
    precisions: dict[str, str | None] = dict.fromkeys(baselines)
    reference = getattr(options, "precision", None)
    known = {candidate_key(config, None, reference) for config in baselines.values()}
    top = top_candidates(study, options.top_k, options.max_memory_bytes, behind=behind)
    for name, config, precision in top:
        key = candidate_key(config, precision, reference)
        if key not in known:  # a trial that is a baseline is measured once
            entries.append((name, config))
            precisions[name] = None if precision == reference else precision
            known.add(key)
    return entries, precisions


def _measure_rounds(
    entries: list[tuple[str, LoopConfig]],
    measurer: Measurer,
    options: Any,
    progress: Any,
    baselines: Mapping[str, LoopConfig],
    parity: Callable[..., GateVerdict],
    clock: Clock,
    precisions: Precisions,
    searched: _Rounds | None = None,
) -> _Rounds:
    """`final_rounds` rounds over the entries still in the running (`_still_tying`), fewer once
    a round leaves the decision as it was (`_settled`); `searched`: the search's own samples of
    the entries, the decision before the first round."""
    names = [name for name, _ in entries]
    rounds = _Rounds(
        samples={n: [] for n in names},
        memory=dict.fromkeys(names),
        setup=dict.fromkeys(names, 0.0),
    )
    running = list(entries)
    before = None if searched is None else _settled(running, searched, options, parity, precisions)
    for round_index in range(options.final_rounds):
        for name, config in running:
            progress.phase(f"final round {round_index + 1}/{options.final_rounds}: {name}")
            outcome = _measure(measurer, config, precisions.get(name))
            clock.measured(outcome, FINAL_ROUND)
            rounds.seconds += outcome.seconds
            if isinstance(outcome, Failure):
                rounds.failures[name] = outcome.reason
                continue
            rounds.samples[name].extend(outcome.throughputs)
            peak = outcome.peak_memory_bytes
            if peak is not None:
                rounds.memory[name] = max(rounds.memory[name] or 0, peak)
            if outcome.compile is not None:
                compile_s = float(outcome.compile.get("compile_s") or 0.0)
                rounds.setup[name] = max(rounds.setup[name], compile_s)
        if round_index + 1 < options.final_rounds:
            running = _still_tying(
                running, rounds, options, baselines, parity, round_index + 1, precisions
            )
            now = _settled(running, rounds, options, parity, precisions)
            if now is not None and now == before:
                progress.phase(
                    f"final round: round {round_index + 1} left the decision as it was "
                    f"({now[0]}); {options.final_rounds - round_index - 1} more not run"
                )
                rounds.settled = round_index + 1
                break
            before = now
    return rounds


def _searched(
    study: optuna.Study,
    entries: list[tuple[str, LoopConfig]],
    baselines: Mapping[str, LoopConfig],
    options: Any,
    precisions: Precisions,
) -> _Rounds:
    """The samples the search itself measured of each entry: a candidate's complete trials'
    windows pooled (as `top_candidates` ranks them), a baseline's measurements during the search
    (`tuner.search.baselines`). Short and not interleaved, but independent of the final round's:
    when its first round decides as they do, that round left the decision as it was."""
    reference = getattr(options, "precision", None)
    keyed = {
        candidate_key(config, precisions.get(name), reference): name
        for name, config in entries
        if name not in baselines
    }
    samples: dict[str, list[float]] = {name: [] for name, _ in entries}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        name = keyed.get(str(trial.user_attrs.get(keys.CONFIG_KEY)))
        if name is not None:
            samples[name].extend(trial.user_attrs.get(keys.WINDOWS, []))
    for key, entry in studies.entries(study, keys.BASELINE_PREFIX).items():
        name = key.split("/", 1)[0]
        if name in samples and name in baselines and isinstance(entry, dict):
            samples[name].extend(entry.get("windows", []))
    return _Rounds(
        samples=samples, memory=dict.fromkeys(samples), setup=dict.fromkeys(samples, 0.0)
    )


def _settled(
    running: list[tuple[str, LoopConfig]],
    rounds: _Rounds,
    options: Any,
    parity: Callable[..., GateVerdict],
    precisions: Precisions,
) -> tuple[str, frozenset[str]] | None:
    """The decision on the samples so far: the winner and the configs tied with it (None where
    there is none yet, or where the rounds must all run: with `train_steps` a config's setup
    cost decides, with two objectives the Pareto front does)."""
    if options.train_steps is not None or options.multi_objective:
        return None
    configs = dict(running)
    eligible = _eligible(
        _measurements(running, rounds, precisions), configs, parity, options, precisions
    )
    if not eligible:
        return None
    decision = decide(eligible, margin=options.tie_margin)
    return decision.best.name, frozenset(m.name for m in decision.ties)


def _still_tying(
    running: list[tuple[str, LoopConfig]],
    rounds: _Rounds,
    options: Any,
    baselines: Mapping[str, LoopConfig],
    parity: Callable[..., GateVerdict],
    done: int,
    precisions: Precisions,
) -> list[tuple[str, LoopConfig]]:
    """The entries worth another round: the baselines (the speedups are over them), and every
    config that still ties with the leader (`stats.decide`: its interval overlaps the leader's or
    its median is within the tie margin). A config that no longer does cannot be recommended:
    more samples narrow the intervals, so the gap only becomes clearer. Off with `train_steps`
    (a config's setup cost can reverse the order) and with two objectives (a slower config may
    be on the Pareto front by its memory)."""
    if options.train_steps is not None or options.multi_objective:
        return running
    configs = dict(running)
    measured = _measurements(running, rounds, precisions)
    eligible = _eligible(measured, configs, parity, options, precisions)
    if not eligible:
        return running
    ties = {m.name for m in decide(eligible, margin=options.tie_margin).ties}
    kept = []
    for name, config in running:
        if name in baselines or name in ties or not rounds.samples[name]:
            kept.append((name, config))
        else:
            rounds.dropped[name] = done
    return kept


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
) -> list[Measurement]:
    """The measured configs that passed the gate and stay under the memory cap, in `measured`'s
    order, for the decision (`stats.decide`).

    Gated fastest first, and only those that could change the decision: a config that does not
    tie with the fastest eligible one (decide's rule) can neither win nor tie, so its gate is
    not run. On the 1.1B preset the baselines were 1.55x slower than the winner, and gating them
    was 79 s of a 16-minute job (docs/benchmarks/raw/default-job-h100-2026-11-26-llama-1b-*).
    With `train_steps` (a slower config with no compile can win over the run) or two objectives
    (a slower one can be on the Pareto front), every config is gated."""
    cap = options.max_memory_bytes
    under = [m for m in measured if cap is None or m.memory_bytes is None or m.memory_bytes <= cap]
    every = getattr(options, "train_steps", None) is not None or getattr(
        options, "multi_objective", False
    )
    passed: list[Measurement] = []
    for m in sorted(under, key=lambda m: m.median, reverse=True):
        if passed and not every:
            ties = decide([passed[0], m], margin=options.tie_margin).ties
            if not any(t is m for t in ties):
                continue
        if _verdict(parity, configs[m.name], precisions.get(m.name)).passed:
            passed.append(m)
    return [m for m in under if any(p is m for p in passed)]


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
        n_trials=count_trials(trials),
        gpu_seconds=gpu_seconds(trials, study.user_attrs),
        final_round=tuple(_entry(m, configs[m.name], precisions) for m in measured),
        failures=rounds.failures,
        tie_rule=tie_rule(options),
        tie_margin=options.tie_margin,
        max_memory_bytes=options.max_memory_bytes,
        study_fields={k: meta.get(k) for k in STUDY_FIELDS},
        effective=not on_cpu,
        note=CPU_NOTE if on_cpu else None,
        pareto=(
            tuple(_entry(m, configs[m.name], precisions) for m in pareto_front(eligible))
            if options.multi_objective
            else None
        ),
    )


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
