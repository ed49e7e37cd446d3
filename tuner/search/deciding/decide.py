"""The decision: re-measure the best configs beside the baselines, interleaved, and recommend.

After the search, the top-k distinct configs (by the median of all their windows) and both
baselines are run again, in rounds: A B C D E, A B C D E, ... so clock and load drift hit all of
them alike. Each one's samples are the window throughputs of all its final-round runs. The
recommendation is the best median of that round; configs whose 95 % bootstrap interval overlaps
the best one's, or whose median is within `tie_margin` (1 %) of it, are ties, and a tie goes to
the simplest config (`tuner.search.spaces.space.SIMPLICITY_ORDER`),
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
when, and after how many rounds the decision settled. On the scale space the job's time aim
(`tuner.search.deciding.aim`) leaves out a tied config's gate and a round after the first where
they would end the job past it: the recommendation's reason names what was not gated, and the
record says after how many rounds the aim cut them (`cut_after`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from trainers import KEPT_CODE_DROPPED, LoopConfig, compiles, keeping_compiled, keeps_code
from tuner.evidence.recommendation import Recommendation
from tuner.search.deciding.aim import Aim
from tuner.search.deciding.recommend import (
    Precisions,
    _base,
    _eligible,
    _measurements,
    _recommend,
    _Rounds,
    user_pins,
)
from tuner.search.gating.verdict import GateVerdict
from tuner.search.measuring.measure import Failure, Measured, Measurer
from tuner.search.measuring.stats import decide
from tuner.search.measuring.timing import Clock
from tuner.search.options import SEARCH_KEPT
from tuner.search.spaces.space import candidate_key
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.phases import FINAL_ROUND


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
    precisions keys each config and precision apart, `tuner.search.spaces.space.candidate_key`).
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


def _measure(measurer: Measurer, config: LoopConfig, precision: str | None) -> Measured | Failure:
    # Without a precision of its own, the call a single-precision study always made.
    if precision is None:
        return measurer.measure(config)
    return measurer.measure(config, precision=precision)


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
    aim: Aim | None = None,
) -> Recommendation:
    """Re-measure the finalists beside the baselines, interleaved, and recommend (module doc).

    `parity` gives a config's (cached) gate verdict (`parity(config, precision)` for a
    candidate in a precision of its own); `clock` (optional) takes the time spent; `behind`
    leaves out trials too far behind the best to tie (`top_candidates`); `aim` (optional): the
    job's time aim, which a tied config's gate and a round after the first keep inside
    (`tuner.search.deciding.aim`).
    """
    clock = clock or Clock()
    entries, precisions = finalist_candidates(study, options, baselines, behind=behind)
    configs = dict(entries)
    searched = _searched(study, entries, baselines, options, precisions)
    with _keeping_code(entries):
        rounds = _measure_rounds(
            entries, measurer, options, progress, baselines, parity, clock, precisions, searched,
            aim,
        )  # fmt: skip
    measured = _measurements(entries, rounds, precisions)
    # A config dropped after a round was shown not to tie with the leader then; its fewer
    # samples must not make it look like a tie now (a wider interval), nor its gate run.
    kept = [m for m in measured if m.name not in rounds.dropped]
    eligible = _eligible(kept, configs, parity, options, precisions, aim)
    left_out = {} if aim is None else dict(aim.left_out)
    for name, why in left_out.items():
        progress.phase(f"final round: {name} {why}")
    _store_rounds(study, entries, rounds, left_out)
    base = _base(study, options, measured, configs, rounds, eligible, precisions)
    if not eligible:
        return dataclasses.replace(base, reason=_none_eligible(options, bool(measured)))

    def floor_of(name: str) -> float | None:
        # The floor is measured (once) for the winner's precision and compile setting.
        with clock.timing(FINAL_ROUND):
            precision = precisions.get(name)
            if precision is None:
                return measurer.floor_ms(configs[name])
            return measurer.floor_ms(configs[name], precision=precision)

    recommendation = _recommend(
        base, eligible, configs, rounds, options, baselines, parity, measurer, floor_of, precisions
    )
    return _naming(recommendation, left_out)


def _keeping_code(entries: list[tuple[str, LoopConfig]]) -> contextlib.AbstractContextManager[None]:
    """The entries take turns, round after round: one whose arithmetic differs from the run
    before it would compile again at each turn (28-59 s at 0.5B in float8). Each keeps its code
    instead, beside what the trials kept (`SEARCH_KEPT`: a finalist among them compiles
    nothing), as many as `trainers.keeping_compiled` keeps. (On a GPU the gate runs in a
    process of its own, but for a config's run made here where its code is kept, which
    compiles nothing: `ParityProcess.runs_here`.)"""
    compiled = sum(1 for _, config in entries if compiles(config) and keeps_code(config))
    return keeping_compiled(compiled + SEARCH_KEPT) if compiled else contextlib.nullcontext()


def _naming(recommendation: Recommendation, left_out: Mapping[str, str]) -> Recommendation:
    """The decision the user reads names what it did without: a config as fast, not gated."""
    if not left_out:
        return recommendation
    notes = "; ".join(f"{name} {why}" for name, why in left_out.items())
    reason = f"among the configs gated, {recommendation.reason}; {notes}"
    return dataclasses.replace(recommendation, reason=reason)


def _store_rounds(
    study: optuna.Study,
    entries: list[tuple[str, LoopConfig]],
    rounds: _Rounds,
    left_out: Mapping[str, str],
) -> None:
    """The final round's record (`keys.FINAL_PREFIX`): what it measured, dropped and when the
    decision settled; what the job's time aim cut (`cut_after`) and left out ungated, and why."""
    study.set_user_attr(
        f"{keys.FINAL_PREFIX}{uuid.uuid4().hex[:10]}",
        {
            "seconds": rounds.seconds,
            "entries": [name for name, _ in entries],
            "dropped": dict(rounds.dropped),
            "settled_after": rounds.settled,
            "cut_after": rounds.cut,
            "left_out": dict(left_out),
        },
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


def _none_eligible(options: Any, measured: bool) -> str:
    """Why nothing is recommended when no measured config is eligible."""
    if not measured:
        return "every final-round measurement failed (see failures)"
    capped = " and the memory cap" if options.max_memory_bytes is not None else ""
    pins = user_pins(options)
    pinned = ", ".join(f"{k}={v}" for k, v in pins.items())
    keeping = f" keeping the pins ({pinned})" if pins else ""
    return f"no config{keeping} passed parity{capped}"


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
    aim: Aim | None = None,
) -> _Rounds:
    """`final_rounds` rounds over the entries still in the running (`_still_tying`), fewer once
    a round leaves the decision as it was (`_settled`) or once the next would end the job past
    its time `aim`; `searched`: the search's own samples of the entries, the decision before
    the first round."""
    names = [name for name, _ in entries]
    rounds = _Rounds(
        samples={n: [] for n in names}, memory=dict.fromkeys(names), setup=dict.fromkeys(names, 0.0)
    )
    running = list(entries)
    before = None
    for round_index in range(options.final_rounds):
        for name, config in running:
            line = f"final round {round_index + 1}/{options.final_rounds}: {name}"
            progress.phase(line)
            outcome = _measure(measurer, config, precisions.get(name))
            _say_compiled(progress, line, outcome)
            clock.measured(outcome, FINAL_ROUND)
            if aim is not None:
                aim.spent[name] = outcome.seconds
            _record(rounds, name, outcome)
        if round_index + 1 < options.final_rounds:
            why = _no_round_fits(running, baselines, aim)
            if why is not None:
                _cut(progress, rounds, options, round_index, why)
                break
            if round_index == 0 and searched is not None:
                # The decision before the first round, asked after it: it needs the entries'
                # verdicts, which another worker of a job may still be running, and the round's
                # measurements need none (`Search.decide`). Same entries, same answer.
                before = _settled(list(entries), searched, options, parity, precisions, aim)
            running = _still_tying(
                running, rounds, options, baselines, parity, round_index + 1, precisions, aim
            )
            now = _settled(running, rounds, options, parity, precisions, aim)
            if now is not None and now == before:
                progress.phase(
                    f"final round: round {round_index + 1} left the decision as it was "
                    f"({now[0]}); {options.final_rounds - round_index - 1} more not run"
                )
                rounds.settled = round_index + 1
                break
            before = now
            why = None if aim is None else aim.next_round([name for name, _ in running])
            if why is not None:
                _cut(progress, rounds, options, round_index, why)
                break
    return rounds


def _no_round_fits(
    running: list[tuple[str, LoopConfig]], baselines: Mapping[str, LoopConfig], aim: Aim | None
) -> str | None:
    """Why no further round can start within the job's time `aim`, asked before the decision
    on the samples so far, whose ties are gated (None: one might). The smallest next round is
    the baselines and one config, the cheapest: where even that would end the job past its aim,
    no gate can change what the rounds measured (at c1bf87b on one H100 the `llama-1b` repeat
    job gated a finalist 48 s for a decision no round followed)."""
    if aim is None:
        return None
    configs = [name for name, _ in running if name not in baselines]
    if not configs:
        return None
    cheapest = min(configs, key=lambda name: aim.spent.get(name, 0.0))
    return aim.next_round([*baselines, cheapest])


def _cut(progress: Any, rounds: _Rounds, options: Any, round_index: int, why: str) -> None:
    """The rounds end after `round_index` for the job's time aim (`why`), said and recorded."""
    left = options.final_rounds - round_index - 1
    more = f" ({left - 1} more not run either)" if left > 1 else ""
    progress.phase(f"final round: round {round_index + 2} not run{more}: {why}")
    rounds.cut = round_index + 1


def _say_compiled(progress: Any, line: str, outcome: Measured | Failure) -> None:
    """A finalist's run that compiled (a second or more): how long, and why the code of its
    trial or an earlier turn was not run instead (`trainers.dynamo_state.why_dropped`, or the
    guard that failed). At 0.5B in float8 on an H200 each such turn was 45-60 s of the round."""
    if isinstance(outcome, Failure) or outcome.compile is None:
        return
    seconds = float(outcome.compile.get("compile_s") or 0.0)
    if seconds < 1.0:
        return
    notes = [str(n) for n in outcome.compile.get("notes", ()) if str(n).startswith(_WHY_COMPILED)]
    progress.phase(f"{line} compiled {seconds:.0f} s" + (f": {notes[0]}" if notes else ""))


_WHY_COMPILED = (KEPT_CODE_DROPPED, "recompile")
"""The compile notes that say why a run compiled although code was kept."""


def _record(rounds: _Rounds, name: str, outcome: Measured | Failure) -> None:
    """One final-round run of entry `name` into `rounds`: its samples, peak and setup cost."""
    rounds.seconds += outcome.seconds
    if isinstance(outcome, Failure):
        rounds.failures[name] = outcome.reason
        return
    rounds.samples[name].extend(outcome.throughputs)
    peak = outcome.peak_memory_bytes
    if peak is not None:
        rounds.memory[name] = max(rounds.memory[name] or 0, peak)
    if outcome.compile is not None:
        # What a fresh process pays: this run's compile, or the one whose code it kept.
        compile_s = float(outcome.compile.get("compile_s") or 0.0)
        kept_s = float(outcome.compile.get("kept_s") or 0.0)
        rounds.setup[name] = max(rounds.setup[name], compile_s, kept_s)


def _searched(
    study: optuna.Study,
    entries: list[tuple[str, LoopConfig]],
    baselines: Mapping[str, LoopConfig],
    options: Any,
    precisions: Precisions,
) -> _Rounds:
    """The samples the search itself measured of each entry: a candidate's complete trials'
    windows pooled (as `top_candidates` ranks them), a baseline's measurements during the search
    (`tuner.search.measuring.baselines`). Short and not interleaved, but independent of the final
    round's: when its first round decides as they do, that round left the decision as it was."""
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
    aim: Aim | None = None,
) -> tuple[str, frozenset[str]] | None:
    """The decision on the samples so far: the winner and the configs tied with it (None where
    there is none yet, or where the rounds must all run: with `train_steps` a config's setup
    cost decides, with two objectives the Pareto front does)."""
    if options.train_steps is not None or options.multi_objective:
        return None
    configs = dict(running)
    eligible = _eligible(
        _measurements(running, rounds, precisions), configs, parity, options, precisions, aim
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
    aim: Aim | None = None,
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
    eligible = _eligible(measured, configs, parity, options, precisions, aim)
    if not eligible:
        return running
    ties = {m.name for m in decide(eligible, margin=options.tie_margin).ties}
    kept = []
    for name, config in running:
        # A config left out for the job's time aim still ties: it is not dropped.
        left_out = aim is not None and name in aim.left_out
        if name in baselines or name in ties or left_out or not rounds.samples[name]:
            kept.append((name, config))
        else:
            rounds.dropped[name] = done
    return kept
