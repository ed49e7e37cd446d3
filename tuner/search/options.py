"""What one tuning run is asked to do (`RunOptions`), the baselines it measures, and the small
interfaces the search is driven through: progress, trial slots, retries."""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, runtime_checkable
from typing import Protocol as TypingProtocol

import optuna

import trainers
from trainers import LoopConfig
from trainers.program import PREFIX as PROGRAM_PREFIX
from trainers.program import Program, check_nproc
from tuner.evidence.progress import TrialReport
from tuner.search.proposing.defaults import (
    DEFAULT_TRIALS,
    MAX_MEMORY_BYTES,
    MAX_PATIENCE,
    MAX_TRIALS,
)
from tuner.search.proposing.screen import SCREEN_MODES
from tuner.search.protocol import Protocol
from tuner.search.spaces.space import SearchSpace
from tuner.search.spaces.staged import sampler_for
from tuner.store.storage import precision_of

if TYPE_CHECKING:
    import torch

_T = TypeVar("_T")

BASELINES: dict[str, LoopConfig] = {
    # The PyTorch idiom: one stream, loss.item() every step, unpinned.
    "pytorch-default": trainers.REFERENCE,
    # The seed design's starting point: transfer + compute streams, synchronize every step.
    "seed-baseline": LoopConfig(num_streams=2, pin_memory=True, non_blocking=True),
}


def baselines_for(nproc_per_node: int, program: Program | None = None) -> dict[str, LoopConfig]:
    """The baselines a study of `nproc_per_node` processes measures: `BASELINES` alone, or, with
    several processes, the same loops under DDP with its defaults (what a user of torchrun
    writes first): every trial is then measured against what runs on as many devices. A
    `program` measures those it implements (the seed baseline's two streams are refused by a
    program without `num_streams`: it was reported failed in every such study)."""
    if nproc_per_node == 1:
        chosen = dict(BASELINES)
    else:
        chosen = {name: config.replace(parallel="ddp") for name, config in BASELINES.items()}
    if program is None:
        return chosen
    return {name: c for name, c in chosen.items() if program.lacking(c.to_dict()) is None}


SAMPLERS = ("tpe", "random")
PROFILE_MODES = ("none", "baselines", "all")
DRIFT_WARNING = 0.10
PRUNE_PERCENTILE = 25.0

SEARCH_KEPT = 3
"""How many configs of other arithmetic keep their compiled code side by side while trials run
(`trainers.keeping_compiled` in `tuner.search.search.Search.run_trials`; a fourth starts
fresh): where the leader is among them, the final round runs its code kept, as after a leader
and the two variants the second stage runs of it right after it. At 18bbdc5 (the Llama-3.2-1B
shape, one H200), one config kept, the leader's entry of the final round compiled again for
34 s after its two variants had run."""


@dataclasses.dataclass(kw_only=True, frozen=True)
class RunOptions:
    workload: str
    preset: str
    trials: int = DEFAULT_TRIALS
    timeout_s: float | None = None
    space: str | Mapping[str, Any] = "auto"
    """"auto" (compile on a GPU, full on a CPU), "full", "streams", "compile", a .json path, or
    a mapping (see `tuner.search.spaces.named.load_space`)."""
    fix: tuple[str, ...] | Mapping[str, Any] = ()
    """Pins: "name=value" strings (`--fix`) or a mapping of typed values (a job's `fix`)."""
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
    precision_parity_steps: int | None = None
    """The gate's run length for a config in another precision than `precision` (a study
    searching `precisions`: float8 against bf16), judged against the reference's seed-to-seed
    envelope (`trainers.gate.spread_for`); None: `parity_steps`. The float8 evidence uses 200."""
    precision_tolerance: float | None = None
    """How many times that seed-to-seed envelope a config in another precision may deviate by
    (its verdict and the report show it); None: the gate's own multiple, 3
    (`trainers.gate.MULTIPLE`)."""
    sampler: str = "tpe"
    seed: int = 0
    matmul_precision: str = "highest"
    profile: str = "baselines"
    """none; baselines (both baselines and the recommended config); all (every complete trial
    too)."""
    profile_steps: int = 10
    artifacts: str | None = None
    """Where traces go (default: beside an SQLite file; other storages store figures only)."""
    train_steps: int | None = None
    """The user's planned run length: the recommendation is then the config of the least total
    time (setup + N x step) among those that pass the gate; None: the fastest per step."""
    patience: int | None = None
    """Stop starting trials once this many complete trials in a row have not beaten the best
    throughput by more than `tie_margin`; 0 turns the rule off; None: AUTO_PATIENCE for the
    default space on a GPU (`tuner.search.study.search_patience`), off otherwise."""
    model_args: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """`--model-arg key=value` options of a library model (`torchvision:`, `timm:`, `hf:`)."""
    precision: trainers.Precision | None = None
    """fp32, tf32, bf16-autocast, fp16-autocast or float8: the study's reference precision (the
    baselines and the gate's reference run in it). Never searched unless `precisions` allows
    others (it changes the results). None: as before this setting, fp32 under
    `matmul_precision`; with `precisions`, the first of them."""
    precisions: tuple[str, ...] | None = None
    """The precisions the user allows the search to choose among (`--precisions`): with two or
    more, `precision` is a dimension of every trial, and a trial in another precision than
    `precision` is judged by equivalence against it. None: `precision` alone, as before."""
    protocol: Protocol = dataclasses.field(default_factory=Protocol)
    auto_window_steps: bool = False
    """True where the user did not set the protocol's window length (`run` without
    --window-steps): the scale space then times windows of SCALE_WINDOW_STEPS steps
    (`tuner.search.study.measurement_protocol`); False keeps `protocol` as given."""
    screen: str = "auto"
    """Screen, then gate (`tuner.search.proposing.screen`): `on`, `off`, or `auto` (on for the scale
    space): a trial that falls behind the fastest so far is pruned and never gated, one that
    does not is gated in the final round, and a candidate predicted not to fit or to lose is not
    run (`tuner.search.proposing.predict`)."""
    nproc_per_node: int = 1
    """Processes per trial on this node (1..8): above 1, every measurement is a torchrun launch
    of N processes (one per GPU; gloo on a CPU), the data-parallel levers are searched and the
    baselines are DDP's defaults (`baselines_for`)."""
    scope: str | None = None
    """Whose earlier records a study may reuse: the gate memo's verdicts, envelope and profiles,
    and an earlier study's trials (`tuner.search.gating.memo`, `tuner.search.earlier`). None:
    every record of the storage (one user's own file or database); the service gives the job's
    owner, so one owner's job neither reuses another owner's measurements nor names their job."""
    precision_spec: trainers.PrecisionSpec = dataclasses.field(
        init=False, repr=False, compare=False
    )
    """`precision`, `precisions` and `matmul_precision` as one checked value, built from them."""

    def __post_init__(self) -> None:
        def bad(field: str, allowed: str) -> trainers.ConfigError:
            return trainers.ConfigError(field, getattr(self, field), allowed)

        if not 1 <= self.trials <= MAX_TRIALS:
            raise bad("trials", f"an integer in 1..{MAX_TRIALS}")
        # NaN compares false with everything: `<= 0` let `--timeout nan` through.
        if self.timeout_s is not None and not (
            math.isfinite(self.timeout_s) and self.timeout_s > 0
        ):
            raise bad("timeout_s", "a finite number of seconds > 0 (leave it out for the default)")
        if tuple(self.objectives) not in (("throughput",), ("throughput", "memory")):
            # Shown as the user typed it (`memory`), not as a Python tuple.
            raise trainers.ConfigError(
                "objectives", ",".join(self.objectives), "throughput or throughput,memory"
            )
        if self.max_memory_bytes is not None and not (
            0 < self.max_memory_bytes <= MAX_MEMORY_BYTES
        ):
            raise bad("max_memory_bytes", f"a number of bytes in 1..{MAX_MEMORY_BYTES} (1 PiB)")
        if not 0.0 <= self.tie_margin < 1.0:
            raise bad("tie_margin", "a fraction in [0, 1), e.g. 0.01 for 1 %")
        for field, low in (
            ("top_k", 1),
            ("final_rounds", 1),
            ("baseline_every", 1),
            ("parity_steps", 2),
        ):
            if getattr(self, field) < low:
                raise bad(field, f"an integer >= {low}")
        if self.precision_parity_steps is not None and self.precision_parity_steps < 2:
            raise bad("precision_parity_steps", "an integer >= 2, or unset for parity_steps")
        tolerance = self.precision_tolerance
        if tolerance is not None and not (math.isfinite(tolerance) and tolerance > 0):
            raise bad("precision_tolerance", "a number > 0 (a multiple of the envelope), or unset")
        if self.sampler not in SAMPLERS:
            raise bad("sampler", ", ".join(SAMPLERS))
        self._take_precisions()
        if self.train_steps is not None and self.train_steps < 1:
            raise bad("train_steps", "an integer >= 1")
        check_patience(self.patience, self.objectives)
        if self.screen not in SCREEN_MODES:
            raise bad("screen", ", ".join(SCREEN_MODES))
        if self.profile not in PROFILE_MODES:
            raise bad("profile", ", ".join(PROFILE_MODES))
        if self.profile_steps < 1:
            raise bad("profile_steps", "an integer >= 1")
        check_nproc(self.nproc_per_node)
        if self.nproc_per_node > 1 and self.workload.startswith(PROGRAM_PREFIX):
            raise bad(
                "nproc_per_node",
                f"1 for a program ({self.workload}: a registered program starts its own "
                "processes; data-parallel trials run the built-in loop under torchrun)",
            )

    def _take_precisions(self) -> None:
        """The one check of the study's precisions (`trainers.PrecisionSpec.of`); `precision`
        becomes the reference it names (the first of `precisions` when not given). The frozen
        dataclass's fields are set here, before anything reads them."""
        program = self.workload if self.workload.startswith(PROGRAM_PREFIX) else None
        spec = trainers.PrecisionSpec.of(
            self.precision,
            self.precisions,
            self.matmul_precision,
            nproc_per_node=self.nproc_per_node,
            program=program,
        )
        object.__setattr__(self, "precision", spec.precision)
        if self.precisions is not None:
            object.__setattr__(self, "precisions", spec.allowed)
        object.__setattr__(self, "precision_spec", spec)

    @property
    def allowed_precisions(self) -> tuple[str, ...]:
        """The precisions a trial may run in: `precisions`, or the study's alone."""
        return self.precision_spec.allowed

    @property
    def multi_precision(self) -> bool:
        """Whether precision is a searched dimension (two or more allowed)."""
        return self.precision_spec.searched

    @property
    def study_precision(self) -> str:
        """The precision the study is measured in, as stored and shown (`precision`, or what
        `matmul_precision` amounts to)."""
        return self.precision or precision_of(self.matmul_precision)

    @property
    def multi_objective(self) -> bool:
        return len(self.objectives) > 1


def resume_command(options: RunOptions, study: str, done: int = 0) -> str:
    """The `run` command that resumes `study` as `options` made it: each setting its stored
    question must match (`tuner.store.storage.SAME_QUESTION`) that is not the default, and the
    trials left of the run's (`done` of them were run) and its --timeout. "run again with
    --study NAME" alone ran the default workload, which the study refused, and without --trials
    a run of 6 resumed ran up to 40 (new users' trials, 2026-12-02)."""
    words = ["--study", study, "--workload", options.workload, "--preset", options.preset]
    # None left (stopped in the gate or the final round): one more, then the final round;
    # without --trials the resume had run up to 40 (a user's probe, 2026-12-06).
    words += ["--trials", str(max(1, options.trials - done))]
    if options.timeout_s is not None:
        words += ["--timeout", f"{options.timeout_s:g}"]
    for key, value in options.model_args.items():
        words += ["--model-arg", f"{key}={value}"]
    if isinstance(options.space, str) and options.space != "auto":
        words += ["--space", options.space]
    # A job's pins arrive typed (a mapping, the CLI's too once made a `JobSpec`): said as
    # --fix; left out, the printed command was refused ("made with space=...").
    pins = options.fix.items() if isinstance(options.fix, Mapping) else ()
    for pin in options.fix if isinstance(options.fix, tuple) else ():
        words += ["--fix", pin]
    for key, value in pins:
        words += ["--fix", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
    if tuple(options.objectives) != ("throughput",):
        words += ["--objectives", ",".join(options.objectives)]
    if options.precision is not None:
        words += ["--precision", str(options.precision)]
    elif options.matmul_precision != "highest":  # the study's precision (tf32) comes from it
        words += ["--matmul-precision", options.matmul_precision]
    if options.precisions:
        words += ["--precisions", ",".join(options.precisions)]
    if options.seed:
        words += ["--seed", str(options.seed)]
    if options.parity_steps != RunOptions.parity_steps:
        words += ["--parity-steps", str(options.parity_steps)]
    if options.precision_parity_steps is not None:
        words += ["--precision-parity-steps", str(options.precision_parity_steps)]
    if options.device != "auto":
        words += ["--device", options.device]
    words += _changed_settings(options)
    if options.storage is not None:
        words += ["--storage", options.storage]
    return "python -m tuner run " + " ".join(shlex.quote(w) for w in words)


_RESUMED_FLAGS = {
    "max_memory_bytes": "--max-memory",
    "tie_margin": "--tie-margin",
    "top_k": "--top-k",
    "final_rounds": "--final-rounds",
    "baseline_every": "--baseline-every",
    "precision_tolerance": "--precision-tolerance",
    "sampler": "--sampler",
    "screen": "--screen",
    "patience": "--patience",
    "train_steps": "--train-steps",
    "profile": "--profile",
    "profile_steps": "--profile-steps",
    "artifacts": "--artifacts",
    "nproc_per_node": "--nproc-per-node",
}
"""Settings a resume must repeat that its study does not refuse when they differ: left out of
the printed command, a resume dropped the memory cap and the tie margin (so recommended over
the cap), went from the random sampler to TPE and measured in other windows (a user's probe,
2026-12-06)."""


def _changed_settings(options: RunOptions) -> list[str]:
    """`_RESUMED_FLAGS` and the measurement protocol where `options` differs from the default."""
    words: list[str] = []
    for name, flag in _RESUMED_FLAGS.items():
        value = getattr(options, name)
        default = next(f.default for f in dataclasses.fields(RunOptions) if f.name == name)
        if value != default:
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    protocol, default_protocol = options.protocol, Protocol()
    for name in ("warmup", "windows", "window_steps"):
        value = getattr(protocol, name)
        if value != getattr(default_protocol, name) or (
            name == "window_steps" and not options.auto_window_steps
        ):
            words += [f"--{name.replace('_', '-')}", str(value)]
    return words


def check_patience(patience: int | None, objectives: Sequence[str]) -> None:
    """The patience a request may ask: 0..MAX_PATIENCE, and 0 (off) beside a second objective
    (it counts gains in throughput alone). The one rule of `RunOptions` and the service's
    `check_spec` (a job's request is refused before it is queued)."""
    if patience is None:
        return
    if not 0 <= patience <= MAX_PATIENCE:
        raise trainers.ConfigError(
            "patience", patience, f"an integer in 0..{MAX_PATIENCE} (0 turns it off)"
        )
    if patience and len(objectives) > 1:
        raise trainers.ConfigError(
            "patience",
            patience,
            "0 with objectives throughput,memory (it counts gains in throughput alone)",
        )


def memory_unmeasured(options: RunOptions, device: str) -> str | None:
    """The line that says a memory cap or objective does nothing off a CUDA device, where no peak
    memory is measured (None: on one, or neither asked). Both were taken on a CPU and nothing
    said so: the recommendation's peak was null (a new API client's trial, 2026-12-03)."""
    asked = [
        *(["--max-memory excludes no config"] if options.max_memory_bytes is not None else []),
        *(["the memory objective is not known"] if "memory" in options.objectives else []),
    ]
    if device == "cuda" or not asked:
        return None
    return f"peak memory is measured on a CUDA device only: on {device} {' and '.join(asked)}"


def tf32_unused(options: RunOptions, device: torch.device) -> str | None:
    """The line that says tf32 runs as fp32 on `device` (off an Ampere or later GPU:
    `trainers.tf32_unused`), where the study allows it (None: it does not, or tf32 is real)."""
    if "tf32" not in options.allowed_precisions:
        return None
    why = trainers.tf32_unused(device)
    flag = "--precisions" if options.precisions is not None else "--precision"
    return None if why is None else f"{flag} tf32: {why}"


def unmeasured_here(options: RunOptions, device: torch.device) -> list[str]:
    """The lines that say what the study asks and `device` cannot give (`memory_unmeasured`,
    `tf32_unused`), said as the job starts."""
    said = [memory_unmeasured(options, device.type), tf32_unused(options, device)]
    return [line for line in said if line is not None]


class Progress(TypingProtocol):
    """What the search tells its caller as it goes (the CLI draws a progress bar from it)."""

    def start(self, study: str, total: int, resumed: bool) -> None: ...
    def phase(self, text: str) -> None: ...
    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None: ...


@runtime_checkable
class TrialReporter(TypingProtocol):
    """A `Progress` that also takes each finished trial in full (number, config, result or
    reason, seconds): the CLI's plain lines. Optional, so a `Progress` without it still works."""

    def trial_report(self, report: TrialReport) -> None: ...


class Quiet:
    def start(self, study: str, total: int, resumed: bool) -> None:
        pass

    def phase(self, text: str) -> None:
        pass

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        pass


def make_sampler(
    name: str, seed: int, trials: int, space: SearchSpace | None = None
) -> optuna.samplers.BaseSampler:
    """The study's sampler; with `space`, keeping the settings only its second stage tries at
    their values (`tuner.search.spaces.staged`)."""
    if name == "random":
        return sampler_for(space, optuna.samplers.RandomSampler(seed=seed))
    # constant_liar: several workers on one study do not all try the same point (issue 5).
    tpe = optuna.samplers.TPESampler(
        seed=seed, n_startup_trials=max(5, min(10, trials // 4)), constant_liar=True
    )
    return sampler_for(space, tpe)


def directions(options: RunOptions) -> list[optuna.study.StudyDirection]:
    """The study's directions: speed up, and with the memory objective, peak memory down."""
    maximize, minimize = optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE
    return [maximize, minimize] if options.multi_objective else [maximize]


def make_pruner(options: RunOptions) -> optuna.pruners.BasePruner:
    if options.multi_objective:
        return optuna.pruners.NopPruner()  # Optuna does not prune multi-objective studies
    return optuna.pruners.PercentilePruner(PRUNE_PERCENTILE, n_startup_trials=5, n_warmup_steps=1)


class TrialSlots(TypingProtocol):
    """Whether this process may run another trial of the study, and the trial if so.

    `python -m tuner run` counts its own trials (`LocalSlots`); workers sharing a job take slots
    of the job under a lock in the database (`tuner.service.slots.JobSlots`).
    """

    def take(
        self, create: Callable[[], optuna.Trial], prepare: Callable[[optuna.Trial], None]
    ) -> optuna.Trial | None:
        """A new trial (`create`, then `prepare` it), or None when no trial is left to run."""
        ...

    def more(self) -> bool:
        """Whether trials may follow the ones taken so far (drift baselines need a next one)."""
        ...

    def ended(self) -> tuple[str, str]:
        """After `take` gave none: what ended the trials (trials, timeout, request or others)
        and a line saying so, for the recommendation's record."""
        ...


class LocalSlots:
    """`trials` slots, taken one after the other by this process alone."""

    def __init__(self, trials: int) -> None:
        self.trials = trials
        self.taken = 0

    def take(
        self, create: Callable[[], optuna.Trial], prepare: Callable[[optuna.Trial], None]
    ) -> optuna.Trial | None:
        if self.taken >= self.trials:
            return None
        self.taken += 1
        trial = create()
        prepare(trial)
        return trial

    def more(self) -> bool:
        return self.taken < self.trials

    def ended(self) -> tuple[str, str]:
        return "trials", f"every trial asked for was run ({self.taken})"


class Retry(TypingProtocol):
    def call(self, fn: Callable[[], _T], *, what: str) -> _T: ...


class NoRetry:
    """`python -m tuner run`: a database error ends the run (the study resumes later)."""

    def call(self, fn: Callable[[], _T], *, what: str) -> _T:
        return fn()
