"""The search: an Optuna study over the loop's settings, measured with short real training runs.

`run_study(options)` reads top to bottom:
1. open (or resume) the study; measure both baselines;
2. ask Optuna for a config, measure it window by window (the pruner may stop it after its second
   window), gate it on `check_parity` (cached per config), tell the result;
3. every `baseline_every` trials, measure the baselines again and record their drift;
4. re-measure the top configs and the baselines interleaved and decide (`tuner.search.decide`).

Pruning rule: `PercentilePruner(25)`: from its second window on, a trial whose best window so far
is below the 25th percentile of earlier trials at the same window is stopped (after 5 trials).
Multi-objective studies are not pruned (Optuna does not support it).

When trials stop starting: after `trials`; after `timeout_s` (`search_budget`: by default 240 s
on the default space on a GPU, 480 s where that space is `scale`, for models of 0.3-8B
parameters); and once `patience` complete trials in a row have not beaten the best throughput by
more than `tie_margin` (`search_patience`: 4 by default on those spaces, off otherwise). A trial
already running always finishes.

Who runs which trial: `run_study` (`python -m tuner run`) runs `trials` trials in this process
(`LocalSlots`); the tuning service's workers share one study, each taking trial slots of its job
(`tuner.service.slots.JobSlots`) and calling the same `Search` methods (`open_search`,
`measure_baselines`, `run_trials`, `decide`). Each trial's sampler is seeded with `seed + trial
number`, so a study is reproducible for a given history and workers do not draw the same points.

Stopping on request (the tuning service's cancel, a worker's shutdown): `should_stop`, when given,
is asked before each trial and after each measured window. Once it answers True, the running
trial stops at its next window (told PRUNED with the windows it measured and the user attribute
`stopped`), no further trial starts, and `run_study` raises `Stopped` instead of deciding.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

import trainers
from trainers import LoopConfig
from tuner.errors import Interrupted, Stopped, TunerError
from tuner.evidence import profiles
from tuner.evidence.progress import TrialReport
from tuner.evidence.recommendation import Recommendation
from tuner.search import artifacts, decide, profiling
from tuner.search.baselines import Baselines, now
from tuner.search.children import open_children
from tuner.search.defaults import (
    AUTO_PATIENCE,
    AUTO_SCALE_BUDGET_S,
    AUTO_SEARCH_BUDGET_S,
    PROFILE_CHILD_S,
    PROFILE_COMPILED_S,
    PROFILE_EAGER_S,
    SCALE_JOB_AIM_S,
    SCALE_WINDOW_STEPS,
)
from tuner.search.gate import GateVerdict
from tuner.search.measure import Failure, Measured, Measurer, Protocol, set_matmul_precision
from tuner.search.memo import MEMO_ENV, open_memo
from tuner.search.options import (
    PRUNE_PERCENTILE,
    LocalSlots,
    NoRetry,
    Progress,
    Quiet,
    Retry,
    RunOptions,
    TrialReporter,
    TrialSlots,
    baselines_for,
    make_sampler,
)
from tuner.search.parity import ParityCache
from tuner.search.predict import TIME_SPARE, known_trials, predict
from tuner.search.predict import check as check_prediction
from tuner.search.predict import tally as search_tally
from tuner.search.screen import (
    SCREEN_WINDOWS,
    Incumbent,
    incumbent,
    judged_against,
    over_cap,
    screen_record,
    screen_value,
    screened_out,
    screening,
)
from tuner.search.space import SearchSpace, candidate_key
from tuner.search.spaces import (
    AUTO_GPU_SPACE,
    SCALE_SPACE,
    for_processes,
    load_space,
    program_space,
    without_block_levers,
)
from tuner.search.stages import first_stage
from tuner.search.stats import bootstrap_ci
from tuner.search.timing import Clock
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.keys import OWNER as OWNER_ATTR
from tuner.store.keys import PRECISION as PRECISION_PARAM
from tuner.store.keys import STOPPED as STOPPED_ATTR
from tuner.store.phases import MEASURE, PROFILE, study_time
from tuner.store.retry import is_transient


def run_study(
    options: RunOptions,
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Recommendation:
    """Search, decide, store the recommendation on the study and return it.

    `should_stop` (optional) is polled between trials and after each window; see the module doc.
    """
    progress = progress or Quiet()
    search = open_search(options, progress=progress, should_stop=should_stop)
    # search.options, not options: open_search adapts them (profiles off for a program), and the
    # budget must not undo that (it did: a program's job on a GPU then failed at its profiles).
    budget = search_budget(search.options.timeout_s, search.space.name)
    if budget != search.options.timeout_s:
        search.options = dataclasses.replace(search.options, timeout_s=budget)
        progress.phase(
            f"search budget {budget:.0f} s (the default on a GPU; --timeout sets another)"
        )
    patience = search_patience(search.options, search.space.name)
    if patience != search.options.patience:
        search.options = dataclasses.replace(search.options, patience=patience)
        progress.phase(
            f"patience {patience} trials (the default on a GPU; --patience sets another, "
            "0 turns it off)"
        )
    try:
        search.measure_baselines("start")
        search.run_trials(LocalSlots(options.trials))
        if search.stopped:
            raise Stopped(
                f"stopped on request: {search.done} trials of this run are stored in "
                f"study {search.study.study_name!r}"
            )
        return search.decide()
    except KeyboardInterrupt as exc:
        name = search.study.study_name
        raise Interrupted(
            f"interrupted: {search.done} trials of this run are stored in study {name!r}; "
            f"run again with --study {name} to resume"
        ) from exc
    finally:
        search.close()


DEFAULT_BUDGETS: dict[str, float] = {
    AUTO_GPU_SPACE: AUTO_SEARCH_BUDGET_S,
    SCALE_SPACE: AUTO_SCALE_BUDGET_S,
}
"""The search budget of each space the default space means on a GPU, given no --timeout."""


def search_budget(timeout_s: float | None, space_name: str) -> float | None:
    """Seconds after which no trial starts: `timeout_s` when given; else, for what the default
    space means on a GPU, its budget (`DEFAULT_BUDGETS`): compiled trials cost 3-85 s each on an
    H100 at 125M (docs/benchmarks/peers-h100-*), 80-205 s at 1.1B, so 40 of them could take
    most of an hour."""
    if timeout_s is not None:
        return timeout_s
    return DEFAULT_BUDGETS.get(space_name)


def search_patience(options: RunOptions, space_name: str) -> int | None:
    """`options.patience` when given; else AUTO_PATIENCE for a single-objective job on what the
    default space means on a GPU, whose trials cost a compile each; else None (off)."""
    if options.patience is not None or space_name not in DEFAULT_BUDGETS:
        return options.patience
    if options.multi_objective:
        return options.patience
    return AUTO_PATIENCE


def measurement_protocol(options: RunOptions, space_name: str) -> Protocol:
    """The protocol the job measures with: `options.protocol`, except on the scale space where
    the user left the window length to the job (`options.auto_window_steps`): windows of
    SCALE_WINDOW_STEPS steps there, since a step of a 0.3-8B model takes long enough that the
    default window costs tens of seconds per measurement for no gain in precision."""
    if not options.auto_window_steps or space_name != SCALE_SPACE:
        return options.protocol
    return dataclasses.replace(options.protocol, window_steps=SCALE_WINDOW_STEPS)


def _with_protocol(
    options: RunOptions, measurer: Measurer, space_name: str, progress: Progress
) -> RunOptions:
    """`options` with the protocol the job measures with (`measurement_protocol`), given to the
    measurer too, and said where it is not the one asked for."""
    protocol = measurement_protocol(options, space_name)
    if protocol == options.protocol:
        return options
    progress.phase(
        f"windows of {protocol.window_steps} steps (the default on the {space_name} space; "
        "--window-steps sets another)"
    )
    measurer.protocol = protocol
    return dataclasses.replace(options, protocol=protocol)


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


def open_search(
    options: RunOptions,
    *,
    progress: Progress | None = None,
    should_stop: Callable[[], bool] | None = None,
    owner: str | None = None,
    retry: Retry | None = None,
    storage: optuna.storages.BaseStorage | None = None,
) -> Search:
    """Open (or resume) the study of `options` and everything needed to measure its trials.

    `owner` (a worker's id) is written on every trial this process runs (`OWNER_ATTR`), so that
    a trial whose worker died can be told from one still being measured. `retry` wraps the
    calls that write results to the storage (a worker waits out a database that is away);
    `storage`, when given, is used instead of opening `options.storage` again.
    """
    clock = Clock()  # the session's wall time starts here: opening the study is part of it
    progress = progress or Quiet()
    set_matmul_precision(options.matmul_precision)
    measurer = Measurer(
        options.workload,
        options.preset,
        device=options.device,
        protocol=options.protocol,
        model_args=options.model_args,
        precision=options.precision,
        nproc=options.nproc_per_node,
    )
    # Build the workload now: a bad --workload or --preset must fail before a study is stored.
    measurer.check()
    _check_precisions_here(options, measurer)
    space, options = _space_for(options, measurer, progress)
    storage = storage or studies.open_storage(studies.storage_url(options.storage))
    name, info = _study_info(options, measurer, space)
    loaded = _load_artifacts(info["compile_cache"], progress)
    study, resumed = studies.open_study(
        storage,
        name,
        info=info,
        directions=_directions(options),
        sampler=make_sampler(options.sampler, options.seed, options.trials),
        pruner=_pruner(options),
    )
    if not resumed:
        # A new study starts with the lever corners (tuner/search/stages.py); a resumed one
        # already holds them, and skip_if_exists keeps a second creator from adding them twice.
        for params in _first_trials(space, options, measurer.device.type):
            study.enqueue_trial(params, skip_if_exists=True)
    progress.start(name, options.trials, resumed)
    # Programs are measured elsewhere: their code is not this process's to fingerprint.
    memo = (
        None if measurer.program is not None else open_memo(storage, options, info["fingerprint"])
    )
    search = Search(
        study,
        measurer,
        space,
        options,
        progress,
        should_stop,
        owner=owner,
        retry=retry,
        clock=clock,
        memo=memo,
    )
    search.compile_cache, search.artifacts_loaded = info["compile_cache"], loaded
    return search


def _space_for(
    options: RunOptions, measurer: Measurer, progress: Progress
) -> tuple[SearchSpace, RunOptions]:
    """The space this model, device and launch search (`options.space` with what the model
    cannot take pinned off), and the options with the protocol that space measures with."""
    space = load_space(
        options.space,
        fix=options.fix,
        cuda=measurer.device.type == "cuda",
        parameters=measurer.parameters(),
        train_steps=options.train_steps,
    )
    if not measurer.has_blocks():
        space = without_block_levers(space)
    options = _with_protocol(options, measurer, space.name, progress)
    # N processes per trial: the data-parallel levers join the space (one: they stay off).
    space = for_processes(
        space,
        options.nproc_per_node,
        has_blocks=measurer.has_blocks(),
        precision=options.precision,
    )
    return _for_program(space, options, measurer, progress)


def _load_artifacts(folder: str | None, progress: Progress) -> int:
    """Before any compile: what an earlier job compiled, where its artefacts file was copied
    (`tuner.search.artifacts`); the entries loaded, each outcome said in one line."""
    loaded, refused = artifacts.load(folder)
    if loaded:
        progress.phase(f"compile artefacts of an earlier job loaded: {loaded} entries")
    if refused:
        progress.phase(f"compile artefacts of an earlier job not loaded ({refused}): cold compiles")
    return loaded


def _check_precisions_here(options: RunOptions, measurer: Measurer) -> None:
    """A precision this device cannot run (float8 off an sm89+ GPU, or without torchao) fails
    here, in one line naming the flag, not as every trial's failure."""
    flag = "--precisions" if options.precisions is not None else "--precision"
    for precision in options.allowed_precisions or (None,):
        try:
            trainers.check_precision_here(precision, measurer.device)
        except trainers.UnsupportedOnDevice as exc:
            raise TunerError(f"{flag}: {exc}") from None


def _first_trials(
    space: SearchSpace, options: RunOptions, device_type: str
) -> list[dict[str, Any]]:
    """The lever corners (tuner/search/stages.py); with several precisions allowed, each corner
    in each precision where it is valid (corner by corner, so a short study sees them all), or,
    in a space without corners (a CPU's), one trial in each precision, its settings sampled:
    every precision the user allowed is measured and gated, however short the study."""
    if not options.multi_precision:
        return first_stage(space, device_type=device_type, precision=options.precision)
    by_precision = {
        precision: first_stage(space, device_type=device_type, precision=precision)
        for precision in options.allowed_precisions
    }
    if not any(by_precision.values()):
        return [{PRECISION_PARAM: precision} for precision in options.allowed_precisions]
    corners: list[dict[str, Any]] = []
    for index in range(max((len(c) for c in by_precision.values()), default=0)):
        for precision, chosen in by_precision.items():
            if index < len(chosen):
                corners.append(chosen[index] | {PRECISION_PARAM: precision})
    return corners


def _for_program(
    space: SearchSpace, options: RunOptions, measurer: Measurer, progress: Progress
) -> tuple[SearchSpace, RunOptions]:
    """A program searches only the settings it implements; it is profiled by nobody (its
    kernels run in another process)."""
    if measurer.program is None:
        return space, options
    space = program_space(space, measurer.program)
    if options.profile != "none":
        progress.phase(f"profiles off: program {measurer.program.name!r} runs elsewhere")
        options = dataclasses.replace(options, profile="none")
    return space, options


def _study_info(
    options: RunOptions, measurer: Measurer, space: SearchSpace
) -> tuple[str, dict[str, Any]]:
    """The study's name and its metadata (`keys.META`)."""
    fingerprint = trainers.fingerprint(measurer.device)
    hardware = trainers.fingerprint_key(fingerprint)
    if options.nproc_per_node > 1:
        # N processes on N devices never share a study with one process on one.
        hardware = f"{hardware}-x{options.nproc_per_node}"
    compile_cache = share_compile_cache(options)
    # The study's name carries the effective model options and a non-default precision: two
    # shapes or precisions never share a study.
    shape = trainers.workload_key(options.workload, options.preset, options.model_args)
    # A study that searches precisions never shares a name with one fixed to one of them.
    label = (
        "precisions-" + "-".join(options.allowed_precisions)
        if options.multi_precision
        else options.study_precision
    )
    name = options.study or studies.default_study_name(shape, hardware, space.name, precision=label)
    info = {
        "workload": options.workload,
        "preset": options.preset,
        "model_args": dict(options.model_args),
        "shape": shape,
        "precision": options.study_precision,
        "precisions": list(options.allowed_precisions) if options.multi_precision else None,
        "space": space.to_dict(),
        "objectives": list(options.objectives),
        "max_memory_bytes": options.max_memory_bytes,
        "protocol": options.protocol.to_dict(),
        "device": str(measurer.device),
        "hardware": hardware,
        "fingerprint": fingerprint,
        "matmul_precision": options.matmul_precision,
        "compile_cache": compile_cache,
        "nproc_per_node": options.nproc_per_node,
        "created": now(),
    }
    return name, info


def _directions(options: RunOptions) -> list[optuna.study.StudyDirection]:
    maximize, minimize = optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE
    return [maximize, minimize] if options.multi_objective else [maximize]


def _pruner(options: RunOptions) -> optuna.pruners.BasePruner:
    if options.multi_objective:
        return optuna.pruners.NopPruner()  # Optuna does not prune multi-objective studies
    return optuna.pruners.PercentilePruner(PRUNE_PERCENTILE, n_startup_trials=5, n_warmup_steps=1)


COMPILE_CACHE_ENV = "TUNER_COMPILE_CACHE"


def share_compile_cache(options: RunOptions) -> str | None:
    """Point Inductor's on-disk caches at one folder for every trial, child process and worker of
    the study: $TUNER_COMPILE_CACHE, else `inductor-cache/` in the study's artifact folder (beside
    an SQLite file), else Inductor's own default. A cache the user set (TORCHINDUCTOR_CACHE_DIR)
    is left alone. Set for the whole process, so the children it spawns inherit it."""
    chosen = os.environ.get(COMPILE_CACHE_ENV)
    if not chosen:
        artifacts = profiles.trace_dir(studies.storage_url(options.storage), options.artifacts)
        chosen = None if artifacts is None else str(artifacts / "inductor-cache")
    if os.environ.get(trainers.compilation.CACHE_DIR_VARIABLE):
        return os.environ[trainers.compilation.CACHE_DIR_VARIABLE]
    if chosen is None:
        return None
    try:
        Path(chosen).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        # One line naming where the folder came from, not a traceback (issue 29).
        source = COMPILE_CACHE_ENV if os.environ.get(COMPILE_CACHE_ENV) else "--artifacts"
        raise TunerError(
            f"{source}: cannot create the compile cache folder {chosen}: {exc.strerror}"
        ) from exc
    os.environ[trainers.compilation.CACHE_DIR_VARIABLE] = str(Path(chosen).resolve())
    return os.environ[trainers.compilation.CACHE_DIR_VARIABLE]


def _skipped(trial: optuna.trial.FrozenTrial) -> bool:
    """A trial pruned unrun on its prediction (`Search._predict`)."""
    found = trial.user_attrs.get(keys.PREDICTION)
    return isinstance(found, dict) and found.get("skip") is not None


class Search:
    """One process's part of a study: its trials and the final round, over its parts: the
    baselines (`Baselines`), the gate's cache (`ParityCache`), the gate and profiler
    (`Children`) and the time each phase took (`Clock`)."""

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
        self.should_stop = should_stop
        self.stopped = False
        self.traces = (
            None
            if options.profile == "none"
            else profiles.trace_dir(studies.storage_url(options.storage), options.artifacts)
        )
        self._children = open_children(options, measurer)
        # Screen, then gate (tuner.search.screen): the incumbent each running trial is held
        # against, read when it starts.
        self.screening = screening(
            options.screen,
            space.name,
            multi_objective=options.multi_objective,
            nproc=options.nproc_per_node,
        )
        self._against: dict[int, Incumbent | None] = {}
        # The compile cache folder and the portable artefacts loaded into it (`artifacts`).
        self.compile_cache: str | None = None
        self.artifacts_loaded = 0
        self.baseline_configs = baselines_for(options.nproc_per_node)
        self.parity_cache = ParityCache(
            study,
            self._children.gate,
            retry=self.retry,
            clock=self.clock,
            reference=options.precision,
            memo=memo,
        )
        self.shared_profiles = (
            None
            if memo is None
            else profiling.SharedProfiles(
                memo,
                settings=f"{options.profile_steps}x{options.protocol.warmup}",
                reference=options.precision,
                retry=self.retry,
            )
        )
        known = self.parity_cache.known()
        if known:
            progress.phase(
                f"gate: {known} verdicts known from earlier studies of this workload, shape and "
                f"precision on this machine and code ({MEMO_ENV}=off checks them again)"
            )
        # Where this process measures: drift compares a device with its own first measurement.
        self.baselines = Baselines(
            study,
            measurer,
            where=f"{socket.gethostname()}/{measurer.device}",
            retry=self.retry,
            progress=progress,
            clock=self.clock,
            configs=self.baseline_configs,
        )

    def close(self) -> None:
        # The phase times were stored after the last trial and by `decide`: a run that ends
        # otherwise (stopped, interrupted, the database gone) keeps those.
        self._children.close()

    # -- baselines -------------------------------------------------------------------------
    def measure_baselines(self, phase: str) -> None:
        if phase == "start" and self.space.name == SCALE_SPACE:
            # The start measurement is the base of the baselines' drift, which a scale job never
            # reaches (4-7 trials on the 0.4-1.1B rows at 1cda6b8, drift every 10), and it cost
            # 60-90 s of such a job; the final round measures the baselines, interleaved.
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
            if self._stop_requested():
                self.progress.phase(f"stopped on request after {self.done} trials")
                break
            if deadline is not None and time.monotonic() > deadline:
                self.progress.phase(f"timeout: stopped after {self.done} trials")
                break
            if stops and self._out_of_patience():
                self.progress.phase(
                    f"patience: {self.options.patience} trials in a row without a gain above "
                    f"{self.options.tie_margin:.0%}; stopped after {self.done} trials"
                )
                break
            trial = slots.take(self._create, self._prepare)
            if trial is None:
                break
            started = time.perf_counter()
            state = self._run(trial)
            self.done += 1
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

    def revive(self) -> int:
        """In a screening study, before the final round: gate the complete trials fastest first
        until one holds (passes, under the memory cap; the final round reads the same verdicts),
        then run again every trial that was screened out or skipped against a faster one that
        did not hold: it was judged against a config that cannot be recommended. Returns how
        many were run again (0 in the usual case, where the fastest trial passes)."""
        if not self.screening:
            return 0
        cap = self.options.max_memory_bytes
        while True:
            trials = self.study.get_trials(deepcopy=False)
            best = incumbent(trials, failed=self._failed_keys(), cap=cap)
            if best is None:
                break
            found = next(t for t in trials if t.number == best.trial)
            config = LoopConfig.from_dict(found.user_attrs[keys.CONFIG])
            if self.parity(config, found.user_attrs.get(keys.PRECISION)).passed:
                break
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

    def _failed_keys(self) -> set[str]:
        """The config keys whose cached gate verdict failed (`ParityCache`)."""
        attrs = self.retry.call(lambda: self.study.user_attrs, what="reading the study")
        return {
            key.removeprefix(keys.PARITY_PREFIX)
            for key, verdict in attrs.items()
            if key.startswith(keys.PARITY_PREFIX)
            and isinstance(verdict, dict)
            and verdict.get("passed") is False
        }

    def _profile_cut(self) -> Callable[[LoopConfig, bool], str | None] | None:
        """On the scale space with `--profile baselines`: a profile starts only where its
        expected cost ends the job inside `SCALE_JOB_AIM_S` (`tuner.search.defaults` says why
        and what each costs)."""
        if self.space.name != SCALE_SPACE or self.options.profile == "all":
            return None
        return profiling.time_cut(
            lambda: self.clock.wall_s,
            SCALE_JOB_AIM_S,
            child_s=PROFILE_CHILD_S,
            eager_s=PROFILE_EAGER_S,
            compiled_s=PROFILE_COMPILED_S,
        )

    def decide(self) -> Recommendation:
        """The final round, the profiles, and the recommendation stored on the study, with the
        time each phase of the study took so far."""
        self.revive()
        self.progress.phase("final round: top configs and baselines, interleaved")
        recommendation = decide.final_round(
            self.study,
            self.measurer,
            self.options,
            progress=self.progress,
            baselines=self.baseline_configs,
            parity=self.parity,
            clock=self.clock,
            # What the screen would prune now does not enter: at 1B each entry is a compile.
            behind=self.options.tie_margin + TIME_SPARE if self.screening else None,
        )
        if self.options.profile != "none" and self._children.profiler is not None:
            self.progress.phase("profiling the baselines and the recommended config")
            with self.clock.timing(PROFILE):
                recommendation = profiling.profile_recommendation(
                    self.study,
                    recommendation,
                    self.baseline_configs,
                    self.traces,
                    self._children.profiler,
                    shared=self.shared_profiles,
                    cut=self._profile_cut(),
                )
            left_out = [
                name
                for name, error in (recommendation.profile_errors or {}).items()
                if error.startswith("not profiled")
            ]
            if left_out:
                self.progress.phase(
                    f"profiles of {', '.join(left_out)} not taken: they would end the job after "
                    f"{SCALE_JOB_AIM_S:.0f} s (--profile all takes them)"
                )
            copied = [
                name
                for name, attrs in profiles.study_profiles(self.study).items()
                if attrs.get("shared_from") not in (None, self.study.study_name)
            ]
            if copied:
                self.progress.phase(
                    f"profiles of {', '.join(copied)}: from earlier studies of this workload, "
                    f"shape and precision on this machine and code ({MEMO_ENV}=off profiles "
                    "them again)"
                )
        # What this process compiled, for a job on another machine (`tuner.search.artifacts`).
        saved, unsaved = artifacts.save(self.compile_cache)
        if unsaved:
            self.progress.phase(f"compile artefacts not saved: {unsaved}")
        self._store_time()
        attrs = self.retry.call(lambda: self.study.user_attrs, what="reading the study")
        recommendation = recommendation.with_time(study_time(attrs))
        recommendation = recommendation.with_search(
            self._search_record(attrs)
            | {"compile_artifacts": {"loaded": self.artifacts_loaded, "saved": saved}}
        )
        if self.owner is not None:
            self._store_attr(keys.FINALIZER, self.owner)
        self._store_attr(keys.RECOMMENDATION, recommendation.to_dict())
        return recommendation

    def _search_record(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """How the search spent its trials (`tuner.search.predict.tally`), how many distinct
        candidates the gate judged, and which of the gate's references were reused from an
        earlier job (`ParityCache.reused_envelopes`)."""
        trials = self.retry.call(
            lambda: self.study.get_trials(deepcopy=False), what="reading the study"
        )
        candidates = {t.user_attrs.get(keys.CONFIG_KEY) for t in trials}
        gated = sum(
            1
            for key in attrs
            if key.startswith(keys.PARITY_PREFIX)
            and key.removeprefix(keys.PARITY_PREFIX) in candidates
        )
        return search_tally(trials) | {
            "screening": self.screening,
            "gated": gated,
            "reference_reused": sorted(self.parity_cache.reused_envelopes),
        }

    def parity(self, config: LoopConfig, precision: str | None = None) -> GateVerdict:
        """The correctness gate's verdict for `config` in `precision` (None: the study's), from
        the study's cache when it was checked (`ParityCache`)."""
        return self.parity_cache.verdict(config, precision)

    def _store_time(self) -> None:
        """This session's phase times so far, on the study (`keys.TIME_PREFIX`)."""
        self._store_attr(self.clock.key, self.clock.record())

    def _store_attr(self, key: str, value: Any) -> None:
        self.retry.call(lambda: self.study.set_user_attr(key, value), what=f"storing {key}")

    def _create(self) -> optuna.Trial:
        return self.study.ask()

    def _prepare(self, trial: optuna.Trial) -> None:
        """Its owner, its config (sampled with a seed of its own) and the config's key.

        Each trial's sampler is seeded with `seed + trial number`: reproducible for a given
        history, and workers sharing a study do not draw the same random start-up points. A
        combination the harness refuses (e.g. a whole-step graph over reduce-overhead's own
        graphs) is recorded as the trial's failure, with the harness's reason, and not run.
        """
        if self.owner is not None:
            trial.set_user_attr(OWNER_ATTR, self.owner)
        self.study.sampler = make_sampler(
            self.options.sampler, self.options.seed + trial.number, self.options.trials
        )
        try:
            config = self.space.suggest(trial)
        except trainers.ConfigError as exc:
            self._refuse(trial, str(exc))
            return
        precision = self._suggest_precision(trial)
        # A config that cannot run in the trial's precision (fp16-autocast under a whole-step
        # graph) is refused like any other combination, with the harness's reason.
        refused = precision and trainers.invalid_reason(config.to_dict(), precision=precision)
        if refused:
            self._refuse(trial, refused)
            return
        trial.set_user_attr(keys.CONFIG, config.to_dict())
        trial.set_user_attr(
            keys.CONFIG_KEY, candidate_key(config, precision, self.options.precision)
        )
        if precision is not None:
            trial.set_user_attr(keys.PRECISION, precision)

    def _suggest_precision(self, trial: optuna.Trial) -> str | None:
        """The trial's precision when the study searches several (an Optuna param named
        `precision`), else None: the study's."""
        if not self.options.multi_precision:
            return None
        return str(
            trial.suggest_categorical(PRECISION_PARAM, list(self.options.allowed_precisions))
        )

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
                config, on_window=self._window_callback(trial), precision=precision
            )
            spent = self.clock.measured(outcome, MEASURE)
            return self.retry.call(
                lambda: self._tell(trial, config, key, outcome, earlier, spent, precision),
                what=f"telling trial {trial.number}",
            )
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
        incumbent beyond the tie margin with margin to spare, is pruned unrun ("skipped")."""
        trials = self.retry.call(
            lambda: self.study.get_trials(deepcopy=False), what="reading the study"
        )
        against = incumbent(trials, failed=self._failed_keys(), cap=self.options.max_memory_bytes)
        self._against[trial.number] = against
        prediction = predict(
            config,
            precision,
            known_trials(trials),
            parameters=self.measurer.parameters(),
            # Several processes: the model state per device depends on the data-parallel
            # lever (FSDP2 shards it), which the memory model does not: no memory prediction.
            device_bytes=(
                self.measurer.device_memory_bytes() if self.options.nproc_per_node == 1 else None
            ),
            incumbent=against,
            margin=self.options.tie_margin,
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
                    # Its best window against the incumbent (tuner.search.screen).
                    record = screen_record("screen", seen, against, self.options.tie_margin)
                    trial.set_user_attr(keys.SCREEN, record)
                    return bool(record["outcome"] != "lost")
                return True
            try:
                trial.report(throughput, index)
                return not trial.should_prune()
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
        """Store the trial's result and tell Optuna. `spent`: the trial's phase times so far
        (its measurement); the gate's parts and a profile are added here. `precision`: the
        trial's (None: the study's); in another than the study's, the gate judges it by
        equivalence against the study's reference precision."""
        self._check_prediction(trial, outcome)
        if isinstance(outcome, Failure):
            trial.set_user_attr(keys.FAILURE_REASON, outcome.reason)
            trial.set_user_attr(keys.FAILURE_KIND, outcome.kind)
            trial.set_user_attr(keys.SECONDS, outcome.seconds)
            trial.set_user_attr(keys.TIME, spent)
            self.study.tell(trial, state=TrialState.FAIL)
            return "failed"
        for attr, value in outcome.to_attrs().items():
            trial.set_user_attr(attr, value)
        if outcome.stopped_early:
            trial.set_user_attr(keys.TIME, spent)
            if self.stopped:
                trial.set_user_attr(STOPPED_ATTR, True)
            self.study.tell(trial, state=TrialState.PRUNED)
            return "screened out" if screened_out(trial) else "pruned"
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
        was it right about fit and order (`tuner.search.predict.check`)?"""
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
    def _out_of_patience(self) -> bool:
        """The patience rule, over the whole study (workers sharing it included). This run's
        own trials must number at least the patience too, so that resuming a study that had
        already stalled still runs that many more. In a screening study a trial screened out or
        skipped on its prediction counts too: it did not beat the best either."""
        patience = self.options.patience
        if not patience or self.done < patience:
            return False
        values: list[float] = []
        for t in sorted(self.study.get_trials(deepcopy=False), key=lambda t: t.number):
            if t.state == TrialState.COMPLETE and t.values:
                values.append(t.values[0])
            elif (
                self.screening and t.state == TrialState.PRUNED and (screened_out(t) or _skipped(t))
            ):
                values.append(screen_value(t) or 0.0)
        return trials_without_gain(values, self.options.tie_margin) >= patience

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
        if state == "screened out":
            record = attrs.get(keys.SCREEN) or {}
            against = record.get("incumbent") or {}
            reason = (
                f"{record.get('value', 0.0):,.1f} samples/s over {record.get('windows')} windows, "
                f"more than {self.options.tie_margin:.0%} below trial {against.get('trial')}'s "
                f"{against.get('throughput', 0.0):,.1f}: not gated"
            )
        elif state == "skipped":
            reason = f"not run: {(attrs.get(keys.PREDICTION) or {}).get('reason')}"
        elif state == "pruned":
            reason = (
                "stopped on request"
                if attrs.get(STOPPED_ATTR)
                else "stopped early: slower than most earlier trials at the same window"
            )
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
