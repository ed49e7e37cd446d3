"""One trial of a `Search`, start to end (`TrialRunner`, the base `Search` runs its trials with):
create it, suggest its config and precision, predict it, measure it window by window (the pruner
or the screen may stop it), gate it or defer its gate, tell Optuna, report it."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial, TrialState

import trainers
from trainers import LoopConfig
from trainers.program import ProgramStopped
from tuner.evidence.progress import TrialReport
from tuner.evidence.unrun import pruned_reason
from tuner.search.deciding import profiling
from tuner.search.gating.parity import ParityCache
from tuner.search.measuring.measure import Failure, Measured, Measurer
from tuner.search.measuring.stats import bootstrap_ci
from tuner.search.measuring.timing import Clock
from tuner.search.options import NoRetry, Progress, Retry, RunOptions, make_sampler
from tuner.search.proposing import held
from tuner.search.proposing.drawn import judged
from tuner.search.proposing.levers import Prober, Staged, offered_levers, second_stage
from tuner.search.proposing.predict import check as check_prediction
from tuner.search.proposing.predict import known_trials, not_run, predict
from tuner.search.proposing.screen import (
    SCREEN_WINDOWS,
    Incumbent,
    incumbent,
    measured_before,
    screen_record,
    screen_value,
    screened_out,
    trials_without_gain,
)
from tuner.search.spaces.space import SearchSpace, candidate_key
from tuner.search.spaces.staged import draws_hold
from tuner.store import keys
from tuner.store.phases import MEASURE, PROFILE
from tuner.store.retry import is_transient
from tuner.store.running import this_process


class TrialRunner:
    """The trial steps of a `Search` (`tuner.search.search`): the attributes below are the
    search's, set in `Search.__init__`."""

    study: optuna.Study
    options: RunOptions
    space: SearchSpace
    measurer: Measurer
    progress: Progress
    retry: Retry
    clock: Clock
    owner: str | None
    done: int
    joined: frozenset[int]
    should_stop: Callable[[], bool] | None
    stopped: bool
    screening: bool
    traces: Path | None
    parity_cache: ParityCache
    _children: Any
    _against: dict[int, Incumbent | None]
    _staged: Staged  # the leaders given a second stage (`tuner.search.proposing.levers`)
    _prober: Prober  # the levers' probes, which predict what a stage's variants gain

    def _failed_keys(self) -> set[str]:
        """The config keys whose cached gate verdict failed (`ParityCache.failed`)."""
        return self.parity_cache.failed()

    def _prepare(self, trial: optuna.Trial) -> None:
        """Its owner, its config (sampled with a seed of its own) and the config's key.

        Each trial's sampler is seeded with `seed + trial number`: reproducible for a given
        history, and workers sharing a study do not draw the same random start-up points. A
        combination the harness refuses (e.g. a whole-step graph over reduce-overhead's own
        graphs) is recorded as the trial's failure, with the harness's reason, and not run."""
        if self.owner is not None:
            trial.set_user_attr(keys.OWNER, self.owner)
        else:  # the CLI's or the library's: a resume fails it if this process is killed
            trial.set_user_attr(keys.PROCESS, this_process())
        self.study.sampler = make_sampler(
            self.options.sampler, self.options.seed + trial.number, self.options.trials, self.space
        )
        try:
            config = self.space.suggest(trial)
        except trainers.ConfigError as exc:
            self._refuse(trial, str(exc))
            return
        precision = self._suggest_precision(trial)
        # A config that cannot run in the trial's precision (fp16-autocast under a whole-step
        # graph) or for the model (the compiled loss of one without a loss function) is refused
        # like any other combination, with the harness's reason.
        rules = precision or self.options.precision or "fp32"  # a study without one: fp32's
        refused = trainers.invalid_reason(config.to_dict(), precision=rules, model=self._model())
        if refused:
            self._refuse(trial, refused)
            return
        trial.set_user_attr(keys.CONFIG, config.to_dict())
        trial.set_user_attr(
            keys.CONFIG_KEY, candidate_key(config, precision, self.options.precision)
        )
        if precision is not None:
            trial.set_user_attr(keys.PRECISION, precision)

    def _model(self) -> torch.nn.Module | None:
        """The workload's model, whose rules a config must pass; None for a program's."""
        return None if self.measurer.program is not None else self.measurer.workload.model

    def _suggest_precision(self, trial: optuna.Trial) -> str | None:
        """The trial's precision when the study searches several (an Optuna param named
        `precision`), else None: the study's."""
        if not self.options.multi_precision:
            return None
        return str(trial.suggest_categorical(keys.PRECISION, list(self.options.allowed_precisions)))

    def _refuse(self, trial: optuna.Trial, reason: str) -> None:
        """A combination the harness refuses: recorded as the trial's failure, never run."""
        trial.set_user_attr(keys.FAILURE_REASON, f"invalid combination: {reason}")
        trial.set_user_attr(keys.FAILURE_KIND, "invalid")

    def _run(self, trial: optuna.Trial) -> str:
        if keys.CONFIG not in trial.user_attrs:  # an invalid combination (see _prepare)
            self.retry.call(
                lambda: self.study.tell(trial, state=TrialState.FAIL),
                what=f"telling trial {trial.number}",
            )
            return "failed"
        config = LoopConfig.from_dict(trial.user_attrs[keys.CONFIG])
        key = trial.user_attrs[keys.CONFIG_KEY]
        precision = trial.user_attrs.get(keys.PRECISION)
        complete = self.retry.call(
            lambda: self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
            what="reading the study",
        )
        earlier = [t for t in complete if t.user_attrs.get(keys.CONFIG_KEY) == key]
        if self.screening:
            skipped = self._predict(trial, config, precision)
            if skipped is not None:
                return skipped
        try:
            outcome = self.measurer.measure(
                config,
                on_window=self._window_callback(trial),
                precision=precision,
                should_stop=None if self.should_stop is None else self._stop_requested,
            )
            spent = self.clock.measured(outcome, MEASURE)
            return self.retry.call(
                lambda: self._tell(trial, config, key, outcome, earlier, spent, precision),
                what=f"telling trial {trial.number}",
            )
        except ProgramStopped:  # on request, in the gate's runs of a program: no verdict, no fault
            trial.set_user_attr(keys.STOPPED, True)
            self.study.tell(trial, state=TrialState.PRUNED)
            return "pruned"
        except KeyboardInterrupt:
            trial.set_user_attr(keys.FAILURE_REASON, "interrupted")
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        except optuna.exceptions.UpdateFinishedTrialError:
            # Finished meanwhile: failed as interrupted by a worker that took this one for dead
            # (it is run again), or told by an attempt whose answer the database did not send.
            return "finished elsewhere"

    def _predict(
        self, trial: optuna.Trial, config: LoopConfig, precision: str | None
    ) -> str | None:
        """Predict the trial's peak and speed from the study's measurements (`tuner.search.
        predict`) and keep the prediction on it; one predicted not to fit, or to lose to the
        incumbent beyond the tie margin with margin to spare, is pruned unrun ("skipped"), and so
        is a sampled config an earlier study measured (`measured_before`)."""
        trials = self.retry.call(
            lambda: self.study.get_trials(deepcopy=False), what="reading the study"
        )
        same = measured_before(trial.number, trials)
        if same is not None:  # a sampled config an earlier study measured: not again
            trial.set_user_attr(keys.SAME_AS, same)
        else:
            against = incumbent(
                trials, failed=self._failed_keys(), cap=self.options.max_memory_bytes
            )
            self._against[trial.number] = against
            prediction = predict(
                config,
                precision,
                known_trials(trials),
                parameters=self.measurer.parameters(),
                # Several processes: the model state per device depends on the data-parallel
                # lever (FSDP2 shards it), which the memory model does not: no memory prediction.
                device_bytes=(
                    self.measurer.device_memory_bytes()
                    if self.options.nproc_per_node == 1
                    else None
                ),
                incumbent=against,
                margin=self.options.tie_margin,
            )
            prediction = judged(  # the second stage's rule on a draw (`proposing.drawn`)
                prediction,
                config.to_dict(),
                precision,
                trials,
                against,
                self._prober.known,
                self.options.precision,
                draws_hold(self.space),
            )
            trial.set_user_attr(keys.PREDICTION, prediction.to_dict())
            if prediction.skip is None:
                return None
        self.retry.call(
            lambda: self.study.tell(trial, state=TrialState.PRUNED),
            what=f"telling trial {trial.number}",
        )
        return "skipped"

    def _stop_requested(self) -> bool:
        if not self.stopped and self.should_stop is not None and self.should_stop():
            self.stopped = True
        return self.stopped

    def _window_callback(self, trial: optuna.Trial) -> Any:
        prune = not self.options.multi_objective
        if not prune and self.should_stop is None:
            return None
        seen: list[float] = []
        against = self._against.get(trial.number)

        def on_window(index: int, throughput: float) -> bool:
            if self._stop_requested():
                return False
            if not prune:
                return True
            seen.append(throughput)
            if self.screening:
                # The screen, not the percentile pruner: the pruner keeps only the top quarter
                # of earlier trials, and in a screening study those are the contenders, so it
                # would cut configs that tie the fastest.
                if len(seen) == SCREEN_WINDOWS and against is not None:
                    # Its best window against the incumbent (tuner.search.proposing.screen).
                    record = screen_record("screen", seen, against, self.options.tie_margin)
                    trial.set_user_attr(keys.SCREEN, record)
                    return bool(record["outcome"] != "lost")
                return True
            try:
                trial.report(throughput, index)
                if pruned := trial.should_prune():  # why, for its row (`unrun.pruned_reason`)
                    trial.set_user_attr(keys.PRUNED_AT, {"window": index, "throughput": throughput})
                return not pruned
            except Exception as exc:
                if isinstance(self.retry, NoRetry) or not is_transient(exc):
                    raise
                # The database is away: measure on, unpruned; the result is told once it is back.
                return True

        return on_window

    def _tell(
        self,
        trial: optuna.Trial,
        config: LoopConfig,
        key: str,
        outcome: Measured | Failure,
        earlier: Sequence[optuna.trial.FrozenTrial],
        spent: dict[str, float],
        precision: str | None = None,
    ) -> str:
        """Store the trial's result and tell Optuna. `spent`: its phase times so far (gate, profile
        added here). `precision`: the trial's (None: the study's; another's gate is equivalence)."""
        # A program stopped on request between its windows: no measurement, and no fault.
        if not (stopped := isinstance(outcome, Failure) and outcome.kind == "stopped"):
            self._check_prediction(trial, outcome)
        if isinstance(outcome, Failure) and not stopped:
            trial.set_user_attr(keys.FAILURE_REASON, outcome.reason)
            trial.set_user_attr(keys.FAILURE_KIND, outcome.kind)
            trial.set_user_attr(keys.SECONDS, outcome.seconds)
            trial.set_user_attr(keys.TIME, spent)
            self.study.tell(trial, state=TrialState.FAIL)
            return "failed"
        if isinstance(outcome, Measured):
            for attr, value in outcome.to_attrs().items():
                trial.set_user_attr(attr, value)
        if not isinstance(outcome, Measured) or outcome.stopped_early:
            trial.set_user_attr(keys.TIME, spent)
            if self.stopped:
                trial.set_user_attr(keys.STOPPED, True)
            self.study.tell(trial, state=TrialState.PRUNED)
            return "screened out" if screened_out(trial) else "pruned"
        if keys.PRUNED_AT in trial.user_attrs:  # its last window's: nothing was left to stop
            trial.set_user_attr(keys.PRUNED_AT, None)
        ended, spent = self._screen_or_gate(trial, config, outcome, spent, precision, earlier)
        if ended is not None:
            return ended
        # The same config measured before: add these windows to its earlier ones.
        pooled = list(outcome.throughputs)
        for previous in earlier:
            pooled += previous.user_attrs.get(keys.WINDOWS, [])
        if earlier:
            trial.set_user_attr(keys.DUPLICATE_OF, earlier[0].number)
        value = statistics.median(pooled)
        trial.set_user_attr(keys.POOLED_WINDOWS, len(pooled))
        if self.options.profile == "all" and self._children.profiler is not None:
            self.progress.phase(f"profiling trial {trial.number}")
            started = time.perf_counter()
            with self.clock.timing(PROFILE):
                profiling.profile_trial(
                    trial, config, self.traces, self._children.profiler, precision=precision
                )
            spent = spent | {PROFILE: time.perf_counter() - started}
        trial.set_user_attr(keys.CI95, list(bootstrap_ci(pooled)))
        trial.set_user_attr(keys.TIME, spent)
        if self.options.multi_objective:
            memory = float(outcome.peak_memory_bytes or 0)
            self.study.tell(trial, [value, memory])
        else:
            self.study.tell(trial, value)
        return "complete"

    def _check_prediction(self, trial: optuna.Trial, outcome: Measured | Failure) -> None:
        """A predicted trial's prediction checked against what it measured, kept beside it:
        was it right about fit and order (`tuner.search.proposing.predict.check`)?"""
        prediction = trial.user_attrs.get(keys.PREDICTION)
        if not isinstance(prediction, dict):
            return
        checked = check_prediction(
            prediction,
            out_of_memory=isinstance(outcome, Failure) and outcome.kind == "oom",
            throughput=None if isinstance(outcome, Failure) else outcome.median,
            margin=self.options.tie_margin,
        )
        trial.set_user_attr(keys.PREDICTION_CHECK, checked)

    def _screen_or_gate(
        self,
        trial: optuna.Trial,
        config: LoopConfig,
        outcome: Measured,
        spent: dict[str, float],
        precision: str | None,
        earlier: Sequence[optuna.trial.FrozenTrial] = (),
    ) -> tuple[str | None, dict[str, float]]:
        """A measured trial's judgement: in a screening study, pruned ungated when its median is
        behind the incumbent beyond the tie margin, else complete with its gate deferred to the
        final round; otherwise gated now, and failed when the gate fails it. Returns the state
        it ended in (None: it goes on to be complete) and its phase times, the gate's added."""
        if self.screening:
            against = self._against.get(trial.number)
            # A config measured before (the incumbent's own, say) is judged on all its windows.
            pooled = list(outcome.throughputs)
            for previous in earlier:
                pooled += previous.user_attrs.get(keys.WINDOWS, [])
            record = screen_record("measured", pooled, against, self.options.tie_margin)
            if against is not None:
                trial.set_user_attr(keys.SCREEN, record)
            if record["outcome"] == "lost":
                # Measured whole and still behind the incumbent: it cannot tie, so no gate.
                trial.set_user_attr(keys.TIME, spent)
                self.study.tell(trial, state=TrialState.PRUNED)
                return "screened out", spent
            # A contender: its gate runs in the final round, and only if it can still tie.
            trial.set_user_attr(keys.GATE_DEFERRED, True)
            return None, spent
        verdict, gate_time = self.parity_cache.check(config, precision)
        spent = spent | gate_time
        trial.set_user_attr(keys.PARITY, verdict.to_dict())
        if verdict.passed:
            return None, spent
        trial.set_user_attr(keys.FAILURE_REASON, verdict.failure_reason())
        trial.set_user_attr(keys.FAILURE_KIND, "parity")
        trial.set_user_attr(keys.TIME, spent)
        self.study.tell(trial, state=TrialState.FAIL)
        return "failed", spent

    # -- helpers ---------------------------------------------------------------------------
    def _leading(self) -> tuple[list[FrozenTrial], FrozenTrial | None]:
        """The study's trials and its incumbent (`screen.incumbent`; None: none)."""
        trials = self.study.get_trials(deepcopy=False)
        best = incumbent(trials, failed=self._failed_keys(), cap=self.options.max_memory_bytes)
        return trials, None if best is None else next(t for t in trials if t.number == best.trial)

    def _stage_levers(self) -> None:
        """The float8 corner held for the probes (`held.release`), then the second stage."""
        if not offered_levers(self.space):
            return  # no lever to stage in this space: no read of the study for it
        device_type, model = self.measurer.device.type, self._model()
        for said in (
            self.retry.call(
                lambda: held.release(
                    self.study,
                    self.space,
                    predict=self._prober,
                    device_type=device_type,
                    model=model,
                    claims=self.parity_cache.claims,
                ),
                what="enqueueing the float8 corner",
            ),
            self.retry.call(
                lambda: second_stage(
                    self.study,
                    self.space,
                    self._leading()[1],
                    device_type=device_type,
                    precision=self.options.precision,
                    staged=self._staged,
                    predict=self._prober,
                    model=model,
                    precisions=self.options.allowed_precisions
                    if self.options.multi_precision
                    else (),
                ),
                what="enqueueing the second stage",
            ),
        ):
            if said:
                self.progress.phase(said)

    def out_of_patience(self) -> bool:
        """The patience rule, over the whole study (workers sharing it included). The trials
        since this run joined the study (`_since_joined`) must number at least the patience
        too, so that resuming a study that had already stalled still runs that many more. In a
        screening study a trial screened out, skipped on its prediction or not run as a copy's
        config (`measured_before`) counts too: it did not beat the best either. It waits while
        an enqueued trial waits (a stage's corners or leader variants, `tuner.search.proposing`)."""
        patience = self.options.patience
        trials = sorted(self.study.get_trials(deepcopy=False), key=lambda t: t.number)
        if not patience or self._since_joined(trials) < patience:
            return False
        if any(t.state == TrialState.WAITING for t in trials):
            return False  # enqueued trials are the search's plan (its stages): they run first
        values: list[float] = []
        for t in trials:
            if t.state == TrialState.COMPLETE and t.values:
                values.append(t.values[0])
            elif (
                self.screening and t.state == TrialState.PRUNED and (screened_out(t) or not_run(t))
            ):
                values.append(screen_value(t) or 0.0)
        return trials_without_gain(values, self.options.tie_margin) >= patience

    def _since_joined(self, trials: list[FrozenTrial]) -> int:
        """The study's finished trials begun since this run joined it (not in `joined`): this
        run's own, and those of the job's other workers. A worker of a
        job on N GPUs runs about 1/N of them, so counting only its own (as until 2026-11-27)
        let every worker run `patience` trials of its own before the rule could stop it."""
        return sum(1 for t in trials if t.number not in self.joined and t.state.is_finished())

    def _complete_values(self) -> dict[int, float]:
        """Each complete trial's throughput, by trial number."""
        return {
            t.number: t.values[0]
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.values
        }

    def _report(
        self,
        trial: optuna.Trial,
        state: str,
        seconds: float,
        value: float | None,
        best: float | None,
    ) -> TrialReport:
        """The finished trial in full, for a progress that prints one line per trial."""
        attrs = trial.user_attrs
        reason = attrs.get(keys.FAILURE_REASON)
        if state in ("screened out", "skipped"):
            reason = pruned_reason(attrs)
        elif state == "pruned" and attrs.get(keys.STOPPED):
            # As the summary counts it (`finished_state`): it had said "pruned" here and
            # "interrupted" there (a probe, 2026-12-08).
            state, reason = "interrupted", "stopped on request; run again when the job resumes"
        elif state == "pruned":
            reason = "stopped early: slower than most earlier trials at the same window"
        elif state == "finished elsewhere":
            reason = "finished by another worker"
        phases = attrs.get(keys.TIME)
        return TrialReport(
            number=trial.number,
            done=self.done,
            total=self.options.trials,
            state=state,
            config=attrs.get(keys.CONFIG),
            precision=attrs.get(keys.PRECISION),
            value=value if state == "complete" else None,
            reason=None if reason is None else str(reason),
            seconds=seconds,
            phases=phases if isinstance(phases, dict) else {},
            best=best,
        )
