"""The search: an Optuna study over the loop's settings, measured with short real training runs.

`run_study(options)` reads top to bottom:
1. open (or resume) the study; measure both baselines;
2. ask Optuna for a config, measure it window by window (the pruner may stop it after its second
   window), gate it on `check_parity` (cached per config), tell the result;
3. every `baseline_every` trials, measure the baselines again and record their drift;
4. re-measure the top configs and the baselines interleaved and decide (`tuner.decide`).

Pruning rule: `PercentilePruner(25)`: from its second window on, a trial whose best window so far
is below the 25th percentile of earlier trials at the same window is stopped (after 5 trials).
Multi-objective studies are not pruned (Optuna does not support it).

Who runs which trial: `run_study` (`python -m tuner run`) runs `trials` trials in this process
(`LocalSlots`); the tuning service's workers share one study, each taking trial slots of its job
(`tuner.job_run.JobSlots`) and calling the same `Search` methods (`open_search`,
`measure_baselines`, `run_trials`, `decide`). Each trial's sampler is seeded with `seed + trial
number`, so a study is reproducible for a given history and workers do not draw the same points.

Stopping on request (the tuning service's cancel, a worker's shutdown): `should_stop`, when given,
is asked before each trial and after each measured window. Once it answers True, the running
trial stops at its next window (told PRUNED with the windows it measured and the user attribute
`stopped`), no further trial starts, and `run_study` raises `Stopped` instead of deciding.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import socket
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from typing import Protocol as TypingProtocol

import optuna
from optuna.trial import TrialState

import trainers
from trainers import LoopConfig
from tuner import decide
from tuner import profile as profiling
from tuner import study as studies
from tuner.errors import TunerError
from tuner.isolated import ParityProcess, ProfileProcess
from tuner.measure import PRECISIONS, Failure, Measured, Measurer, Protocol, set_matmul_precision
from tuner.retry import is_transient
from tuner.space import SearchSpace, config_key, load_space
from tuner.stats import bootstrap_ci, drift

BASELINES: dict[str, LoopConfig] = {
    # The PyTorch idiom: one stream, loss.item() every step, unpinned.
    "pytorch-default": trainers.REFERENCE,
    # The seed design's starting point: transfer + compute streams, synchronize every step.
    "seed-baseline": LoopConfig(num_streams=2, pin_memory=True, non_blocking=True),
}
SAMPLERS = ("tpe", "random")
PROFILE_MODES = ("none", "baselines", "all")
DRIFT_WARNING = 0.10
PRUNE_PERCENTILE = 25.0


class Interrupted(TunerError):
    """Ctrl-C: finished trials are stored, the running one is failed as 'interrupted'."""


class Stopped(TunerError):
    """`should_stop` answered True: finished trials are stored, the running one stopped early."""


_T = TypeVar("_T")

OWNER_ATTR = "worker"
"""User attribute of a trial run by a worker of the tuning service: that worker's id."""

STOPPED_ATTR = "stopped"
"""User attribute (True) of a trial cut short by `should_stop`; its measured windows are kept."""


@dataclasses.dataclass(kw_only=True, frozen=True)
class RunOptions:
    workload: str
    preset: str
    trials: int = 40
    timeout_s: float | None = None
    space: str = "full"
    fix: tuple[str, ...] = ()
    storage: str | None = None
    study: str | None = None
    device: str = "auto"
    objectives: tuple[str, ...] = ("throughput",)
    max_memory_bytes: int | None = None
    top_k: int = 3
    tie_margin: float = 0.01
    final_rounds: int = 3
    baseline_every: int = 10
    parity_steps: int = 20
    sampler: str = "tpe"
    seed: int = 0
    matmul_precision: str = "highest"
    profile: str = "baselines"
    """none; baselines (both baselines and the recommended config); all (every complete trial
    too)."""
    profile_steps: int = 10
    artifacts: str | None = None
    """Where traces go (default: beside an SQLite file; other storages store figures only)."""
    protocol: Protocol = dataclasses.field(default_factory=Protocol)

    def __post_init__(self) -> None:
        def bad(field: str, allowed: str) -> trainers.ConfigError:
            return trainers.ConfigError(field, getattr(self, field), allowed)

        if not 1 <= self.trials <= 100_000:
            raise bad("trials", "an integer in 1..100000")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise bad("timeout_s", "a number of seconds > 0")
        if tuple(self.objectives) not in (("throughput",), ("throughput", "memory")):
            # Shown as the user typed it (`memory`), not as a Python tuple.
            raise trainers.ConfigError("objectives", ",".join(self.objectives),
                                       "throughput or throughput,memory")
        if self.max_memory_bytes is not None and self.max_memory_bytes <= 0:
            raise bad("max_memory_bytes", "a number of bytes > 0")
        if not 0.0 <= self.tie_margin < 1.0:
            raise bad("tie_margin", "a fraction in [0, 1), e.g. 0.01 for 1 %")
        for field, low in (("top_k", 1), ("final_rounds", 1), ("baseline_every", 1),
                           ("parity_steps", 2)):
            if getattr(self, field) < low:
                raise bad(field, f"an integer >= {low}")
        if self.sampler not in SAMPLERS:
            raise bad("sampler", ", ".join(SAMPLERS))
        if self.matmul_precision not in PRECISIONS:
            raise bad("matmul_precision", ", ".join(PRECISIONS))
        if self.profile not in PROFILE_MODES:
            raise bad("profile", ", ".join(PROFILE_MODES))
        if self.profile_steps < 1:
            raise bad("profile_steps", "an integer >= 1")

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1


class Progress(TypingProtocol):
    """What the search tells its caller as it goes (the CLI draws a progress bar from it)."""

    def start(self, study: str, total: int, resumed: bool) -> None: ...
    def phase(self, text: str) -> None: ...
    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None: ...


class _Quiet:
    def start(self, study: str, total: int, resumed: bool) -> None:
        pass

    def phase(self, text: str) -> None:
        pass

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        pass


def make_sampler(name: str, seed: int, trials: int) -> optuna.samplers.BaseSampler:
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # constant_liar: several workers on one study do not all try the same point (issue 5).
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=max(5, min(10, trials // 4)),
                                      constant_liar=True)


class TrialSlots(TypingProtocol):
    """Whether this process may run another trial of the study, and the trial if so.

    `python -m tuner run` counts its own trials (`LocalSlots`); workers sharing a job take slots
    of the job under a lock in the database (`tuner.job_run.JobSlots`).
    """

    def take(self, create: Callable[[], optuna.Trial],
             prepare: Callable[[optuna.Trial], None]) -> optuna.Trial | None:
        """A new trial (`create`, then `prepare` it), or None when no trial is left to run."""
        ...

    def more(self) -> bool:
        """Whether trials may follow the ones taken so far (drift baselines need a next one)."""
        ...


class LocalSlots:
    """`trials` slots, taken one after the other by this process alone."""

    def __init__(self, trials: int) -> None:
        self.trials = trials
        self.taken = 0

    def take(self, create: Callable[[], optuna.Trial],
             prepare: Callable[[optuna.Trial], None]) -> optuna.Trial | None:
        if self.taken >= self.trials:
            return None
        self.taken += 1
        trial = create()
        prepare(trial)
        return trial

    def more(self) -> bool:
        return self.taken < self.trials


def run_study(options: RunOptions, *, progress: Progress | None = None,
              should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Search, decide, store the recommendation on the study and return it.

    `should_stop` (optional) is polled between trials and after each window; see the module doc.
    """
    search = open_search(options, progress=progress, should_stop=should_stop)
    try:
        search.measure_baselines("start")
        search.run_trials(LocalSlots(options.trials))
        if search.stopped:
            raise Stopped(f"stopped on request: {search.done} trials of this run are stored in "
                          f"study {search.study.study_name!r}")
        return search.decide()
    except KeyboardInterrupt as exc:
        name = search.study.study_name
        raise Interrupted(
            f"interrupted: {search.done} trials of this run are stored in study {name!r}; "
            f"run again with --study {name} to resume"
        ) from exc
    finally:
        search.close()


def open_search(options: RunOptions, *, progress: Progress | None = None,
                should_stop: Callable[[], bool] | None = None, owner: str | None = None,
                retry: Retry | None = None,
                storage: optuna.storages.BaseStorage | None = None) -> Search:
    """Open (or resume) the study of `options` and everything needed to measure its trials.

    `owner` (a worker's id) is written on every trial this process runs (`OWNER_ATTR`), so that
    a trial whose worker died can be told from one still being measured. `retry` wraps the
    calls that write results to the storage (a worker waits out a database that is away);
    `storage`, when given, is used instead of opening `options.storage` again.
    """
    progress = progress or _Quiet()
    set_matmul_precision(options.matmul_precision)
    measurer = Measurer(options.workload, options.preset, device=options.device,
                        protocol=options.protocol)
    # Build the workload now: a bad --workload or --preset must fail before a study is stored.
    measurer.workload  # noqa: B018
    fingerprint = trainers.fingerprint(measurer.device)
    hardware = trainers.fingerprint_key(fingerprint)
    space = load_space(options.space, fix=options.fix, cuda=measurer.device.type == "cuda")
    storage = storage or studies.open_storage(studies.storage_url(options.storage))
    name = options.study or studies.default_study_name(options.workload, options.preset,
                                                       hardware, options.space)
    info = {
        "workload": options.workload,
        "preset": options.preset,
        "space": space.to_dict(),
        "objectives": list(options.objectives),
        "max_memory_bytes": options.max_memory_bytes,
        "protocol": options.protocol.to_dict(),
        "device": str(measurer.device),
        "hardware": hardware,
        "fingerprint": fingerprint,
        "matmul_precision": options.matmul_precision,
        "created": _now(),
    }
    maximize, minimize = optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE
    directions = [maximize, minimize] if options.multi_objective else [maximize]
    pruner: optuna.pruners.BasePruner = (
        optuna.pruners.NopPruner() if options.multi_objective else
        optuna.pruners.PercentilePruner(PRUNE_PERCENTILE, n_startup_trials=5, n_warmup_steps=1)
    )
    study, resumed = studies.open_study(
        storage, name, info=info, directions=directions,
        sampler=make_sampler(options.sampler, options.seed, options.trials), pruner=pruner)
    progress.start(name, options.trials, resumed)
    return Search(study, measurer, space, options, progress, should_stop, owner=owner,
                  retry=retry)


class Retry(TypingProtocol):
    def call(self, fn: Callable[[], _T], *, what: str) -> _T: ...


class _NoRetry:
    """`python -m tuner run`: a database error ends the run (the study resumes later)."""

    def call(self, fn: Callable[[], _T], *, what: str) -> _T:
        return fn()


class Search:
    """One process's part of a study: its baselines, the trials it runs, the final round."""

    def __init__(self, study: optuna.Study, measurer: Measurer, space: SearchSpace,
                 options: RunOptions, progress: Progress,
                 should_stop: Callable[[], bool] | None = None, *, owner: str | None = None,
                 retry: Retry | None = None) -> None:
        self.study = study
        self.owner = owner
        self.retry: Retry = retry or _NoRetry()
        # Where this process measures: drift compares a device with its own first measurement.
        self.where = f"{socket.gethostname()}/{measurer.device}"
        self.measurer = measurer
        self.space = space
        self.options = options
        self.progress = progress
        self.done = 0
        self.should_stop = should_stop
        self.stopped = False
        self._reference: list[float] | None = None
        self.traces = (None if options.profile == "none" else
                       profiling.trace_dir(studies.storage_url(options.storage), options.artifacts))
        # On a GPU, parity runs in its own process: its deterministic mode and cuBLAS workspace
        # setting outlast it and slowed later measurements by up to 50 % (tuner/isolated.py).
        self._isolated: ParityProcess | None = None
        # Profiles too: CUPTI stays attached after a profile and slows later measurements.
        self._profiles: ProfileProcess | None = None
        self.profiler = profiling.in_process(measurer.workload, device=measurer.device,
                                             steps=options.profile_steps,
                                             warmup=options.protocol.warmup)
        if measurer.device.type == "cuda":
            self._isolated = ParityProcess(
                options.workload, options.preset, steps=options.parity_steps,
                seed=options.protocol.seed, device=str(measurer.device),
                matmul_precision=options.matmul_precision)
            self._profiles = ProfileProcess(
                options.workload, options.preset, steps=options.profile_steps,
                warmup=options.protocol.warmup, seed=options.protocol.seed,
                device=str(measurer.device), matmul_precision=options.matmul_precision)
            self.profiler = self._profiles.profile

    def close(self) -> None:
        for child in (self._isolated, self._profiles):
            if child is not None:
                child.close()

    # -- baselines -------------------------------------------------------------------------
    def measure_baselines(self, phase: str) -> None:
        previous = self.retry.call(
            lambda: studies.entries(self.study, studies.BASELINE_PREFIX), what="baselines")
        for name, config in BASELINES.items():
            self.progress.phase(f"baseline {name} ({phase})")
            outcome = self.measurer.measure(config)
            entry: dict[str, Any] = {"phase": phase, "time": _now(), "at_trial": self._n_trials(),
                                     "config": config.to_dict(), "where": self.where}
            if isinstance(outcome, Failure):
                entry |= {"failure_reason": outcome.reason, "seconds": outcome.seconds}
            else:
                entry |= outcome.to_attrs()
                first = _first_baseline(previous, name, self.where)
                if first is not None:
                    entry["drift"] = drift(first["windows"], outcome.throughputs)
                    if abs(entry["drift"]) > DRIFT_WARNING:
                        self.progress.phase(
                            f"warning: {name} drifted {entry['drift']:+.1%} since the first "
                            "measurement (clocks, other load?)")
            self._store_attr(f"{studies.BASELINE_PREFIX}{name}/{uuid.uuid4().hex[:10]}", entry)

    # -- trials ----------------------------------------------------------------------------
    def run_trials(self, slots: TrialSlots) -> None:
        """Run trials while `slots` gives one; baselines again every `baseline_every` of them."""
        deadline = None if self.options.timeout_s is None else (
            time.monotonic() + self.options.timeout_s)
        while True:
            if self._stop_requested():
                self.progress.phase(f"stopped on request after {self.done} trials")
                break
            if deadline is not None and time.monotonic() > deadline:
                self.progress.phase(f"timeout: stopped after {self.done} trials")
                break
            trial = slots.take(self._create, self._prepare)
            if trial is None:
                break
            state = self._run(trial)
            self.done += 1
            self.progress.trial_done(self.done, self.options.trials, self._best_value(), state)
            if self.done % self.options.baseline_every == 0 and slots.more():
                self.measure_baselines("drift")

    def decide(self) -> dict[str, Any]:
        """The final round, the profiles, and the recommendation stored on the study."""
        self.progress.phase("final round: top configs and baselines, interleaved")
        recommendation = decide.final_round(self.study, self.measurer, self.options,
                                            progress=self.progress, baselines=BASELINES,
                                            parity=self.parity)
        if self.options.profile != "none":
            self.progress.phase("profiling the baselines and the recommended config")
            recommendation |= profiling.profile_recommendation(
                self.study, recommendation, BASELINES, self.traces, self.profiler)
        self._store_attr(studies.RECOMMENDATION, recommendation)
        return recommendation

    def _store_attr(self, key: str, value: Any) -> None:
        self.retry.call(lambda: self.study.set_user_attr(key, value), what=f"storing {key}")

    def _create(self) -> optuna.Trial:
        return self.study.ask()

    def _prepare(self, trial: optuna.Trial) -> None:
        """Its owner, its config (sampled with a seed of its own) and the config's key.

        Each trial's sampler is seeded with `seed + trial number`: reproducible for a given
        history, and workers sharing a study do not draw the same random start-up points.
        """
        if self.owner is not None:
            trial.set_user_attr(OWNER_ATTR, self.owner)
        self.study.sampler = make_sampler(self.options.sampler, self.options.seed + trial.number,
                                          self.options.trials)
        config = self.space.suggest(trial)
        trial.set_user_attr("config", config.to_dict())
        trial.set_user_attr("config_key", config_key(config))

    def _run(self, trial: optuna.Trial) -> str:
        config = LoopConfig.from_dict(trial.user_attrs["config"])
        key = trial.user_attrs["config_key"]
        complete = self.retry.call(lambda: self.study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,)), what="reading the study")
        earlier = [t for t in complete if t.user_attrs.get("config_key") == key]
        try:
            outcome = self.measurer.measure(config, on_window=self._window_callback(trial))
            return self.retry.call(lambda: self._tell(trial, config, key, outcome, earlier),
                                   what=f"telling trial {trial.number}")
        except KeyboardInterrupt:
            trial.set_user_attr("failure_reason", "interrupted")
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        except optuna.exceptions.UpdateFinishedTrialError:
            # Finished meanwhile: failed as interrupted by a worker that took this one for dead
            # (it is run again), or told by an attempt whose answer the database did not send.
            return "finished elsewhere"

    def _stop_requested(self) -> bool:
        if not self.stopped and self.should_stop is not None and self.should_stop():
            self.stopped = True
        return self.stopped

    def _window_callback(self, trial: optuna.Trial) -> Any:
        prune = not self.options.multi_objective
        if not prune and self.should_stop is None:
            return None

        def on_window(index: int, throughput: float) -> bool:
            if self._stop_requested():
                return False
            if not prune:
                return True
            try:
                trial.report(throughput, index)
                return not trial.should_prune()
            except Exception as exc:
                if isinstance(self.retry, _NoRetry) or not is_transient(exc):
                    raise
                # The database is away: measure on, unpruned; the result is told once it is back.
                return True

        return on_window

    def _tell(self, trial: optuna.Trial, config: LoopConfig, key: str,
              outcome: Measured | Failure, earlier: Sequence[optuna.trial.FrozenTrial]) -> str:
        if isinstance(outcome, Failure):
            trial.set_user_attr("failure_reason", outcome.reason)
            trial.set_user_attr("failure_kind", outcome.kind)
            trial.set_user_attr("seconds", outcome.seconds)
            self.study.tell(trial, state=TrialState.FAIL)
            return "failed"
        for attr, value in outcome.to_attrs().items():
            trial.set_user_attr(attr, value)
        if outcome.stopped_early:
            if self.stopped:
                trial.set_user_attr(STOPPED_ATTR, True)
            self.study.tell(trial, state=TrialState.PRUNED)
            return "pruned"
        verdict = self.parity(config)
        trial.set_user_attr("parity", verdict)
        if not verdict["passed"]:
            deviation = verdict.get("max_rel_deviation")
            shown = "inf" if deviation is None else f"{deviation:.3g}"
            trial.set_user_attr("failure_reason",
                                f"parity: {verdict['reason']} (max relative deviation {shown})")
            trial.set_user_attr("failure_kind", "parity")
            self.study.tell(trial, state=TrialState.FAIL)
            return "failed"
        # The same config measured before: add these windows to its earlier ones.
        pooled = list(outcome.throughputs)
        for previous in earlier:
            pooled += previous.user_attrs.get("windows", [])
        if earlier:
            trial.set_user_attr("duplicate_of", earlier[0].number)
        value = statistics.median(pooled)
        trial.set_user_attr("pooled_windows", len(pooled))
        if self.options.profile == "all":
            self.progress.phase(f"profiling trial {trial.number}")
            profiling.profile_trial(trial, config, self.traces, self.profiler)
        trial.set_user_attr("ci95", list(bootstrap_ci(pooled)))
        if self.options.multi_objective:
            memory = float(outcome.peak_memory_bytes or 0)
            self.study.tell(trial, [value, memory])
        else:
            self.study.tell(trial, value)
        return "complete"

    # -- the correctness gate ----------------------------------------------------------------
    def parity(self, config: LoopConfig) -> dict[str, Any]:
        """check_parity's verdict for `config`, from the study's cache when it was checked."""
        attr = f"{studies.PARITY_PREFIX}{config_key(config)}"
        cached = self.study.user_attrs.get(attr)
        if isinstance(cached, dict):
            return cached
        started = time.perf_counter()
        try:
            if self._isolated is not None:
                verdict = self._isolated.check(config).to_dict()
            else:
                verdict = self._check_here(config)
        except Exception as exc:  # noqa: BLE001 - a config that cannot even be checked fails
            verdict = {"passed": False, "reason": f"parity run failed: {exc}",
                       "max_rel_deviation": float("inf")}
        verdict["seconds"] = time.perf_counter() - started
        verdict["config"] = config.to_dict()
        self.study.set_user_attr(attr, _json_safe(verdict))
        return verdict

    def _check_here(self, config: LoopConfig) -> dict[str, Any]:
        if self._reference is None:
            self._reference = trainers.parity_losses(
                self.options.workload, self.options.preset, trainers.REFERENCE,
                steps=self.options.parity_steps, seed=self.options.protocol.seed,
                device=self.measurer.device)
        return trainers.check_parity(
            self.options.workload, config, self.options.parity_steps,
            preset=self.options.preset, seed=self.options.protocol.seed,
            device=self.measurer.device, reference=self._reference).to_dict()

    # -- helpers ---------------------------------------------------------------------------
    def _n_trials(self) -> int:
        return len(self.study.get_trials(deepcopy=False))

    def _best_value(self) -> float | None:
        values = [t.values[0] for t in self.study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,)) if t.values]
        return max(values) if values else None


def _first_baseline(entries: dict[str, Any], name: str, where: str) -> dict[str, Any] | None:
    """The first measurement of baseline `name` at `where` (entries from before `where` was
    recorded count as anywhere's)."""
    measured = [e for k, e in entries.items() if k.startswith(f"{name}/") and "windows" in e
                and e.get("where", where) == where]
    return min(measured, key=lambda e: e["time"]) if measured else None


def _json_safe(value: Any) -> Any:
    """Infinity is not JSON; Optuna stores attrs as JSON."""
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
