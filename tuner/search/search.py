"""The search: an Optuna study over the loop's settings, measured with short real training runs.

A `Search` holds one open study (`tuner.search.study.open_search` opens it; its trials run in
`tuner.search.trials.TrialRunner`). `tuner.search.study.run_study(options)` reads top to bottom:
1. open (or resume) the study; measure both baselines;
2. ask Optuna for a config, measure it window by window (the pruner may stop it after its second
   window), gate it on `check_parity` (cached per config), tell the result;
3. every `baseline_every` trials, measure the baselines again and record their drift;
4. re-measure the top configs and the baselines interleaved and decide
(`tuner.search.deciding.decide`).

Pruning rule: `PercentilePruner(25)`: from its second window on, a trial whose best window is
below the 25th percentile of earlier trials there stops (after 5; Optuna prunes no multi-objective).

When trials stop starting: after `trials`; after `timeout_s` (`search_budget`: by default 240 s
on the default space on a GPU, 480 s where that space is `scale`, for models of 0.3-8B
parameters); and, once no enqueued trial waits (the stages' corners and leader variants,
`tuner.search.proposing`), after `patience` trials in a row not beating the best by more than
`tie_margin` (`search_patience`: 4 on those spaces, off otherwise). A running trial finishes.

Who runs which trial: `run_study` (`python -m tuner run`) runs `trials` trials in this process
(`LocalSlots`); the tuning service's workers share one study, each taking trial slots of its job
(`tuner.service.slots.JobSlots`) and calling the same `Search` methods (`open_search`,
`measure_baselines`, `run_trials`, `decide`). Each trial's sampler is seeded with `seed + trial
number`, so a study is reproducible for a given history and workers do not draw the same points.

Stopping on request (the tuning service's cancel, a worker's shutdown): `should_stop`, when given,
is asked before each trial and baseline and after each measured window. Once it answers True, a
running trial stops at its next window (told PRUNED, attribute `stopped`), a baseline too (not
stored), nothing further starts, and `run_study` raises `Stopped` instead of deciding.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import optuna
from optuna.trial import TrialState

from trainers import LoopConfig, keeping_compiled
from tuner.evidence import profiles
from tuner.evidence.recommendation import Recommendation
from tuner.search import helping
from tuner.search.children import open_children, seeds_ahead
from tuner.search.deciding import aim, decide, profiling
from tuner.search.deciding.record import search_record
from tuner.search.gating.memo import MEMO_ENV
from tuner.search.gating.parity import Beside, GateClaims, ParityCache
from tuner.search.gating.verdict import GateVerdict
from tuner.search.measuring import artifacts
from tuner.search.measuring.baselines import Baselines
from tuner.search.measuring.measure import Measurer
from tuner.search.measuring.timing import Clock
from tuner.search.options import (
    SEARCH_KEPT,
    LocalSlots,
    NoRetry,
    Progress,
    Retry,
    RunOptions,
    TrialReporter,
    TrialSlots,
    baselines_for,
)
from tuner.search.proposing.levers import Prober, Staged
from tuner.search.proposing.predict import TIME_SPARE
from tuner.search.proposing.screen import (
    Incumbent,
    judged_against,
    over_cap,
    screening,
)
from tuner.search.spaces.named import SCALE_SPACE
from tuner.search.spaces.space import SearchSpace
from tuner.search.trials import TrialRunner
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.counting import begun
from tuner.store.phases import MEASURE, PROFILE, study_time


class Search(TrialRunner):
    """One process's part of a study: its trials and the final round, over its parts: the
    baselines (`Baselines`), the gate's cache (`ParityCache`), the gate and profiler
    (`Children`) and the time each phase took (`Clock`)."""

    owned_storage: optuna.storages.BaseStorage | None = None  # opened for it: closed with it
    cache_setting_before: str | None = None  # TORCHINDUCTOR_CACHE_DIR before the job: restored
    made = False  # this run created the study (`open_search`), not resumed it

    def __init__(
        self,
        study: optuna.Study,
        measurer: Measurer,
        space: SearchSpace,
        options: RunOptions,
        progress: Progress,
        should_stop: Callable[[], bool] | None = None,
        *,
        owner: str | None = None,
        retry: Retry | None = None,
        clock: Clock | None = None,
        memo: optuna.Study | None = None,
    ) -> None:
        self.study = study
        self.owner = owner
        self.retry: Retry = retry or NoRetry()
        self.clock = clock or Clock()
        self.measurer = measurer
        self.space = space
        self.options = options
        self.progress = progress
        self.done = 0
        self.joined = begun(study)  # the patience counts the trials begun after these
        self.should_stop = should_stop
        self.stopped = False
        self.ended: dict[str, str] | None = None  # what ended the trials (`_end_of_trials`)
        self.traces = (
            None
            if options.profile == "none"
            else profiles.trace_dir(studies.storage_url(options.storage), options.artifacts)
        )
        self._children = open_children(options, measurer, self._stop_requested)
        # Screen, then gate (proposing.screen): each running trial's incumbent, read as it starts.
        self.screening = screening(
            options.screen,
            space.name,
            multi_objective=options.multi_objective,
            nproc=options.nproc_per_node,
        )
        self._against: dict[int, Incumbent | None] = {}
        self._staged = Staged(options.tie_margin)
        self._prober = Prober(measurer, space, options.tie_margin, self._timing, self._said)
        # The compile cache folder and the portable artefacts loaded into it (`artifacts`).
        self.compile_cache: str | None = None
        self.artifacts_loaded = 0
        self.copied = 0  # trials copied from an earlier study (`earlier`): a share of the budget
        self.baseline_configs = baselines_for(options.nproc_per_node, measurer.program)
        self._open_shared(memo)
        # Where this process measures: drift compares a device with its own first measurement.
        self.baselines = Baselines(
            study,
            measurer,
            where=f"{socket.gethostname()}/{measurer.device}",
            retry=self.retry,
            progress=progress,
            clock=self.clock,
            configs=self.baseline_configs,
            stop=self._stop_requested,
        )

    def _open_shared(self, memo: optuna.Study | None) -> None:
        """The gate's cache and the profiles, shared with earlier studies of the same inputs
        through `memo` (`tuner.search.gating.memo`; None: this study's alone)."""
        options = self.options
        self.parity_cache = ParityCache(
            self.study,
            self._children.gate,
            retry=self.retry,
            clock=self.clock,
            reference=options.precision,
            memo=memo,
            say=self.progress.phase,
        )
        self.shared_profiles = None if memo is None else self._profiles_on(memo)
        known = self.parity_cache.known()
        if not known:
            # A first study of these inputs will gate: its child builds beside the trials, and
            # the gate after them starts at once. A repeat's verdicts come from the memo.
            # A seed envelope's builds too where the gate waits until the trials end (screening):
            # a study that gates each trial would wait for them at its first gate.
            measured = self.parity_cache.envelope_known
            seeds = seeds_ahead(self.options, measured) if self.screening else ()
            self._children.prepare_gate(seeds)
        else:
            self.progress.phase(
                f"gate: {known} verdicts known from earlier studies of this workload, shape and "
                f"precision on this machine and code ({MEMO_ENV}=off checks them again)"
            )

    def share_gate(self, claims: GateClaims) -> None:
        """Share the gate's work and the profiles with the other processes of this study (a
        job's workers): nothing is checked or profiled twice at once, and `help_gate` may take
        part of it. Without a memo the profiles are shared on the study itself."""
        self.parity_cache.claims = claims
        if self.shared_profiles is None:
            self.shared_profiles = self._profiles_on(self.study)
        self.shared_profiles.claims = claims

    def help_gate(
        self, over: Callable[[], bool], settled: Callable[[], bool], *, wait: bool = True
    ) -> int:
        """A job's worker with no trial left while the others run theirs or decide: the gate's
        parts and the profiles the finalizer will ask for, taken here
        (`tuner.search.helping.help_job`). Returns how many it took."""
        try:
            return helping.help_job(self, over, settled, wait=wait)
        finally:
            self._store_time()

    @property
    def profiler(self) -> profiling.Profiler | None:
        """This search's profiler (None: profiles off, or none for its kind of run)."""
        return None if self.options.profile == "none" else self._children.profiler

    def _profiles_on(self, study: optuna.Study) -> profiling.SharedProfiles:
        """Profiles kept by config on `study` (the memo, or the job's own study)."""
        return profiling.SharedProfiles(
            study,
            settings=f"{self.options.profile_steps}x{self.options.protocol.warmup}",
            reference=self.options.precision,
            retry=self.retry,
        )

    def _timing(self) -> AbstractContextManager[None]:
        return self.clock.timing(MEASURE)  # the levers' probes are measurement

    def _said(self, line: str) -> None:
        self.progress.phase(line)

    def close(self) -> None:
        # The phase times were stored after the last trial and by `decide`: an early end keeps them.
        try:
            self._children.close()
        finally:
            studies.close_storage(self.owned_storage)  # None: the caller's, left open
            # The next job of this process (a worker's, a script's) chooses its own folder.
            artifacts.restore_cache_setting(self.cache_setting_before)

    # -- baselines -------------------------------------------------------------------------
    def measure_baselines(self, phase: str) -> None:
        if self.space.name == SCALE_SPACE:
            # Not at the start (60-90 s at 1B, 1cda6b8), nor the drift, which then has no base (48 s
            # of `llama-1b` at b58d9ad, where skipped trials count); the final round measures them.
            if phase == "start":
                self.progress.phase("baselines: measured in the final round (the scale space)")
            return
        self.baselines.measure(phase)
        self._store_time()

    # -- trials ----------------------------------------------------------------------------
    def run_trials(self, slots: TrialSlots, *, stops: bool = True) -> None:
        """Run trials while `slots` gives one; baselines again every `baseline_every` of them.
        `stops` False: the search budget and patience do not stop them (trials run again by
        `revive`, which the search owes its decision)."""
        deadline = (
            None
            if self.options.timeout_s is None or not stops
            else (time.monotonic() + self.options.timeout_s)
        )
        while True:
            end = self._end_of_trials(slots, deadline, stops)
            trial = None if end is not None else slots.take(self.study.ask, self._prepare)
            if trial is None:
                by, why = end or slots.ended()
                if end is not None and by != "trials":
                    self.progress.phase(why)
                if self.ended is None and stops:  # the search's own end, not revive's
                    self.ended = {"by": by, "why": why}
                break
            started = time.perf_counter()
            with keeping_compiled(SEARCH_KEPT):
                state = self._run(trial)
            self.done += 1
            if stops and slots.more() and (deadline is None or time.monotonic() < deadline):
                self._stage_levers()  # not past the budget: `revive` would run what waits
            self._store_time()
            values = self._complete_values()
            best = max(values.values()) if values else None
            if isinstance(self.progress, TrialReporter):
                seconds = time.perf_counter() - started
                self.progress.trial_report(
                    self._report(trial, state, seconds, values.get(trial.number), best)
                )
            self.progress.trial_done(self.done, self.options.trials, best, state)
            if self.done % self.options.baseline_every == 0 and slots.more():
                self.measure_baselines("drift")

    def _end_of_trials(
        self, slots: TrialSlots, deadline: float | None, stops: bool
    ) -> tuple[str, str] | None:
        """Why the trials end before the next one (what ended them, and a line saying so);
        None: run another if `slots` gives one."""
        if self._stop_requested():
            return "request", f"stopped on request after {self.done} trials"
        if isinstance(slots, LocalSlots) and stops and not slots.more():
            # Every trial asked for was run: no budget stopped them (a job's slots count
            # its workers' trials, some not counted: they say when none is left).
            return slots.ended()
        if deadline is not None and time.monotonic() > deadline:
            return "timeout", f"timeout: stopped after {self.done} trials"
        if stops and self.out_of_patience():
            copied = f" (and {self.copied} copied)" if self.copied else ""
            return "patience", (
                f"patience: {self.options.patience} trials in a row without a gain above "
                f"{self.options.tie_margin:.0%}; stopped after {self.done} trials{copied}"
            )
        return None

    def revive(self) -> int:
        """In a screening study, before the final round: gate the complete trials fastest first
        until one holds (passes, under the memory cap; the final round reads the same verdicts),
        then run again every trial that was screened out or skipped against a faster one that
        did not hold: it was judged against a config that cannot be recommended. Returns how
        many were run again (0 in the usual case, where the fastest trial passes)."""
        if not self.screening:
            return 0
        cap = self.options.max_memory_bytes
        self.parity_cache.before_check = self._warm_profiles  # the first config gated here
        try:
            while True:
                trials, found = self._leading()
                if found is None:
                    break
                config = LoopConfig.from_dict(found.user_attrs[keys.CONFIG])
                if self.parity(config, found.user_attrs.get(keys.PRECISION)).passed:
                    break
        finally:
            self.parity_cache.before_check = None
            with self.clock.timing(PROFILE):  # the warm-up uses the GPU: ended before any timing
                if self._children.end_warm():
                    self.progress.phase(f"profiles: the leader's compile {self._children.warmed}")
        failed = self._failed_keys()
        invalid = {
            t.number
            for t in trials
            if t.state == TrialState.COMPLETE
            and (t.user_attrs.get(keys.CONFIG_KEY) in failed or over_cap(t, cap))
        }
        again = [t for t in trials if t.state == TrialState.PRUNED and judged_against(t) in invalid]
        if not again:
            return 0
        self.progress.phase(
            f"{len(again)} trials were judged against a faster config that the gate failed (or "
            "over the memory cap): run again"
        )
        waiting = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        for trial in again:
            self.study.enqueue_trial(dict(trial.params))
        # Enqueued trials run oldest first: what was waiting runs too.
        self.run_trials(LocalSlots(waiting + len(again)), stops=False)
        return len(again)

    def _warm_profiles(self, config: LoopConfig, precision: str | None) -> Beside:
        """Before the gate checks the leader after the trials: its profile's compile, run now in
        the profiles' child beside the gate (`Children.warm_leader`), where it will be
        profiled (not copied from an earlier study). Returns how to wait for it (None: not
        started)."""
        self.parity_cache.before_check = None  # once: the gate's first config is the leader
        shared = self.shared_profiles
        if self.profiler is None or (shared is not None and shared.get(config, precision)):
            return None
        trials = self.retry.call(lambda: self.study.get_trials(deepcopy=False), what="trials")
        beside: Beside = self._children.warm_leader(
            config, precision, trials, self.options.precision
        )
        if self._children.warmed:
            self.progress.phase(f"profiles: the leader's compile {self._children.warmed}")
        return beside

    def decide(self) -> Recommendation:
        """The final round, the profiles, and the recommendation stored on the study, with the
        time each phase of the study took so far."""
        early = self._gated_elsewhere()
        if early is None:
            self.revive()
        profiles = self.options.profile != "none" and self._children.profiler is not None
        if profiles:
            # Built beside the final round, on the CPU: the profiles after it start at once.
            self._children.prepare_profiles()
        self.progress.phase("final round: top configs and baselines, interleaved")
        started = time.perf_counter()
        recommendation = self._final_round()
        if early is not None and (self.revive() > 0 or self.leader() != early):
            # The leader did not hold the gate: what the final round measured is not what it
            # would have measured after the verdict, so it runs again (as one process would).
            self.progress.phase(
                f"final round again: trial {early[0]}, measured while another worker gated it, "
                "did not hold the gate"
            )
            recommendation = self._final_round()
        self.progress.phase(f"final round: {time.perf_counter() - started:.0f} s")
        if profiles:
            started = time.perf_counter()
            recommendation = self._profile(recommendation)
            self.progress.phase(f"profiles: {time.perf_counter() - started:.0f} s")
        # What this process compiled, for a job on another machine
        # (`tuner.search.measuring.artifacts`).
        saved, unsaved = artifacts.save(self.compile_cache)
        if unsaved:
            self.progress.phase(f"compile artefacts not saved: {unsaved}")
        self._store_time()
        attrs = self.retry.call(lambda: self.study.user_attrs, what="reading the study")
        recommendation = recommendation.with_time(study_time(attrs))
        recommendation = recommendation.with_search(
            search_record(
                self.study,
                self.retry.call(
                    lambda: self.study.get_trials(deepcopy=False), what="reading the study"
                ),
                attrs,
                screening=self.screening,
                ended=self.ended,
                parity_cache=self.parity_cache,
            )
            | {"compile_artifacts": {"loaded": self.artifacts_loaded, "saved": saved}}
            # What the space left out or pinned and why, for a client that saw no progress line.
            | {"space_notes": list(self.space.notes)}
        )
        if self.owner is not None:
            self._store_attr(keys.FINALIZER, self.owner)
        self._store_attr(keys.RECOMMENDATION, recommendation.to_dict())
        return recommendation

    def _final_round(self) -> Recommendation:
        return decide.final_round(
            self.study,
            self.measurer,
            self.options,
            progress=self.progress,
            baselines=self.baseline_configs,
            parity=self.parity,
            clock=self.clock,
            # What the screen would prune now does not enter: at 1B each entry is a compile.
            behind=self.options.tie_margin + TIME_SPARE if self.screening else None,
            aim=aim.final_aim(
                self.space.name, self.study, self.parity_cache, self.clock, self.retry
            ),
        )

    def leader(self) -> tuple[int, str] | None:
        """The incumbent trial's number and its verdict's key (None: none)."""
        found = self._leading()[1]
        if found is None:
            return None
        config = LoopConfig.from_dict(found.user_attrs[keys.CONFIG])
        return found.number, self.parity_cache.key(config, found.user_attrs.get(keys.PRECISION))

    def _gated_elsewhere(self) -> tuple[int, str] | None:
        """The leader (`leader`), where another worker of a job is gating it now (None: no
        such worker, or no screening, where every trial was gated as it ran). The final round
        then measures while that gate runs instead of waiting for it: on 4 H100s (`llama-1b`,
        2026-11-28, d1073e1) the finalizer waited about 120 s for the leader's gate on another
        GPU, then ran its final round for about 120 s. The verdicts are read after the round
        (`decide`, and `final_round` asks for them after its first round)."""
        claims = self.parity_cache.claims
        if not self.screening or claims is None:
            return None
        leader = self.leader()
        if leader is None or claims.holder(leader[1]) is None:
            return None
        return leader

    def _profile(self, recommendation: Recommendation) -> Recommendation:
        """The profiles after deciding (`profiling.profile_recommendation`), each one left out
        or copied from an earlier study said in one line."""
        profiler = self._children.profiler
        assert profiler is not None  # decide asks only where there is one
        self.progress.phase("profiling the baselines and the recommended config")
        with self.clock.timing(PROFILE):
            recommendation = profiling.profile_recommendation(
                self.study,
                recommendation,
                self.baseline_configs,
                self.traces,
                profiler,
                shared=self.shared_profiles,
                cut=aim.profile_cut(
                    self.space.name,
                    self.options.profile,
                    self.clock,
                    prepared=self._children.prepared,
                    warmed=self._children.warm_config,
                    repeat=keys.TRIALS_COPIED in self.study.user_attrs,
                    compiled=aim.trial_compile(self.study, self.options.precision, self.retry),
                ),
            )
        for line in profiling.said(self.study, recommendation):
            self.progress.phase(line)
        return recommendation

    def parity(self, config: LoopConfig, precision: str | None = None) -> GateVerdict:
        """The correctness gate's verdict for `config` in `precision` (None: the study's), from
        the study's cache when it was checked (`ParityCache`)."""
        return self.parity_cache.verdict(config, precision)

    def _store_time(self) -> None:
        """This session's phase times so far, on the study (`keys.TIME_PREFIX`)."""
        self._store_attr(self.clock.key, self.clock.record())

    def _store_attr(self, key: str, value: Any) -> None:
        self.retry.call(lambda: self.study.set_user_attr(key, value), what=f"storing {key}")
