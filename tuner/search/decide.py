"""The decision: re-measure the best configs beside the baselines, interleaved, and recommend.

After the search, the top-k distinct configs (by the median of all their windows) and both
baselines are run again, in rounds: A B C D E, A B C D E, ... so clock and load drift hit all of
them alike. Each one's samples are the window throughputs of all its final-round runs. The
recommendation is the best median of that round; configs whose 95 % bootstrap interval overlaps
the best one's, or whose median is within `tie_margin` (1 %) of it, are ties, and a tie goes to
the simplest config (`tuner.search.space.SIMPLICITY_ORDER`),
baselines included: when the PyTorch default ties with the fastest, the answer is "change nothing".
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
from tuner.search.measure import Failure, Measurer
from tuner.search.space import SIMPLICITY_ORDER, config_key, simplicity_key
from tuner.search.stats import Measurement, decide, pareto_front, ratio_ci
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.counting import count_trials, gpu_seconds

CPU_NOTE = (
    "measured on a CPU: stream, event and pinned-memory settings have no effect there, so "
    "differences between configs are noise; tune on the GPU you train on"
)


def top_configs(
    study: optuna.Study, k: int, max_memory_bytes: int | None
) -> list[tuple[str, LoopConfig]]:
    """The k best distinct configs of the study's complete trials (all their windows pooled)."""
    pooled: dict[str, list[float]] = {}
    first: dict[str, optuna.trial.FrozenTrial] = {}
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        key = trial.user_attrs.get(keys.CONFIG_KEY)
        if key is None:
            continue
        memory = trial.user_attrs.get(keys.PEAK_MEMORY)
        if max_memory_bytes is not None and memory is not None and memory > max_memory_bytes:
            continue
        pooled.setdefault(key, []).extend(trial.user_attrs.get(keys.WINDOWS, []))
        first.setdefault(key, trial)
    ranked = sorted(pooled, key=lambda key: statistics.median(pooled[key]), reverse=True)
    return [
        (f"trial-{first[key].number}", LoopConfig.from_dict(first[key].user_attrs[keys.CONFIG]))
        for key in ranked[:k]
    ]


def final_round(
    study: optuna.Study,
    measurer: Measurer,
    options: Any,
    *,
    progress: Any,
    baselines: Mapping[str, LoopConfig],
    parity: Callable[[LoopConfig], dict[str, Any]],
) -> Recommendation:
    entries: list[tuple[str, LoopConfig]] = list(baselines.items())
    known = {config_key(config) for config in baselines.values()}
    for name, config in top_configs(study, options.top_k, options.max_memory_bytes):
        if config_key(config) not in known:  # a trial that is a baseline is measured once
            entries.append((name, config))
            known.add(config_key(config))

    samples: dict[str, list[float]] = {name: [] for name, _ in entries}
    memory: dict[str, int | None] = {name: None for name, _ in entries}
    # The one-off cost a run of the config pays before its first timed step (compilation); the
    # largest of the rounds: a user's first run may find the cache as cold as the first round.
    setup: dict[str, float] = {name: 0.0 for name, _ in entries}
    failures: dict[str, str] = {}
    seconds = 0.0
    for round_index in range(options.final_rounds):
        for name, config in entries:
            progress.phase(f"final round {round_index + 1}/{options.final_rounds}: {name}")
            outcome = measurer.measure(config)
            seconds += outcome.seconds
            if isinstance(outcome, Failure):
                failures[name] = outcome.reason
                continue
            samples[name].extend(outcome.throughputs)
            peak = outcome.peak_memory_bytes
            if peak is not None:
                memory[name] = max(memory[name] or 0, peak)
            if outcome.compile is not None:
                setup[name] = max(setup[name], float(outcome.compile.get("compile_s") or 0.0))

    study.set_user_attr(
        f"{keys.FINAL_PREFIX}{uuid.uuid4().hex[:10]}",
        {"seconds": seconds, "entries": [name for name, _ in entries]},
    )
    configs = dict(entries)
    measured = [
        Measurement(
            name=name,
            samples=tuple(samples[name]),
            memory_bytes=memory[name],
            key=simplicity_key(configs[name]),
        )
        for name, _ in entries
        if samples[name]
    ]
    eligible = [m for m in measured if parity(configs[m.name]).get("passed")]
    if options.max_memory_bytes is not None:
        eligible = [
            m
            for m in eligible
            if m.memory_bytes is None or m.memory_bytes <= options.max_memory_bytes
        ]
    meta = studies.meta(study)
    trials = study.get_trials(deepcopy=False)
    on_cpu = str(meta.get("device", "")).startswith("cpu")
    base = Recommendation(
        study=study.study_name,
        config=None,
        reason=None,
        n_trials=count_trials(trials),
        gpu_seconds=gpu_seconds(trials, study.user_attrs),
        final_round=tuple(_entry(m, configs[m.name]) for m in measured),
        failures=failures,
        tie_rule=SIMPLICITY_ORDER,
        tie_margin=options.tie_margin,
        max_memory_bytes=options.max_memory_bytes,
        study_fields={k: meta.get(k) for k in STUDY_FIELDS},
        effective=not on_cpu,
        note=CPU_NOTE if on_cpu else None,
        pareto=(
            tuple(_entry(m, configs[m.name]) for m in pareto_front(eligible))
            if options.multi_objective
            else None
        ),
    )
    if not eligible:
        reason = (
            "no config passed parity (and the memory cap)"
            if measured
            else "every final-round measurement failed (see failures)"
        )
        return dataclasses.replace(base, reason=reason)

    # With a memory cap, `eligible` holds only configs under it: the fastest of those wins.
    decision = decide(eligible, order_description=SIMPLICITY_ORDER, margin=options.tie_margin)
    best = decision.best
    reason = decision.reason
    per_batch = measurer.samples_per_batch
    train_steps: int | None = getattr(options, "train_steps", None)
    if train_steps is not None:
        steps: int = train_steps

        # The user's run length decides: setup + N steps, each at its measured median.
        def total_s(m: Measurement) -> float:
            return setup[m.name] + steps * per_batch / m.median

        fastest = min(eligible, key=lambda m: (total_s(m), m.key))
        # Only a setup cost can reverse the decision: among configs without one, the tie rule
        # (noise-aware, simplest first) already chose.
        if setup[best.name] > 0.0 and fastest.name != best.name:
            reason = (
                f"{train_steps} training steps: {fastest.name} takes {total_s(fastest):.1f} s "
                f"in all against {total_s(best):.1f} s for {best.name}, the fastest per "
                f"step ({best.name} pays {setup[best.name]:.1f} s of setup first)"
            )
            best = fastest
    step_ms = per_batch / best.median * 1e3
    # Only a floor that bounds this step is shown: same precision, eager kernels, not slower.
    floor_ms = comparable_floor(measurer.floor_ms(configs[best.name]), step_ms)
    return dataclasses.replace(
        base,
        config=configs[best.name].to_dict(),
        reason=reason,
        source=best.name,
        throughput=Interval(median=best.median, ci95=best.ci95),
        step_ms=step_ms,
        peak_memory_bytes=best.memory_bytes,
        speedup={name: _speedup(best, samples[name]) for name in baselines if samples[name]},
        ties=tuple(_entry(m, configs[m.name]) for m in decision.ties),
        was_tie=decision.was_tie,
        floor=None if floor_ms is None else Floor(step_ms=floor_ms, ratio=floor_ms / step_ms),
        parity={k: v for k, v in parity(configs[best.name]).items() if k != "config"},
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
        train_steps=train_steps,
    )


def _break_even(extra_setup_s: float, step_s: float, baseline_step_s: float) -> int | None:
    """Training steps after which the recommended config's extra setup has paid for itself
    against a baseline: 0 when it costs nothing extra, None when it never does (not faster)."""
    if extra_setup_s <= 0.0:
        return 0
    saved = baseline_step_s - step_s
    return None if saved <= 0.0 else math.ceil(extra_setup_s / saved)


def _speedup(best: Measurement, baseline: list[float]) -> Interval:
    ratio, low, high = ratio_ci(best.samples, baseline)
    return Interval(median=ratio, ci95=(low, high))


def _entry(m: Measurement, config: LoopConfig) -> Entry:
    return Entry(
        name=m.name,
        config=config.to_dict(),
        throughput=Interval(median=m.median, ci95=m.ci95),
        peak_memory_bytes=m.memory_bytes,
        samples=len(m.samples),
    )
