"""The options of `python -m tuner`'s commands, one alias each (`tuner.cli` reads them), so that a
command's signature stays a list of names; `run`'s as one typed object (`RunFlags`, whose fields
`command_of` makes the command's options). Built before PyTorch loads: only typer and the
import-free defaults here."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from tuner.search.proposing.defaults import (
    AUTO_PATIENCE,
    AUTO_SCALE_BUDGET_S,
    AUTO_SEARCH_BUDGET_S,
    CPU_FINAL_ROUNDS,
    CPU_SEARCH_BUDGET_S,
    DEFAULT_TRIALS,
    DEFAULT_WINDOW_STEPS,
    MAX_TRIALS,
    SCALE_WINDOW_STEPS,
)
from tuner.search.textargs import parse_model_args, parse_precisions, program_workload

# The settings' fields (`trainers.LoopConfig`, `RunOptions`, the measurement `Protocol`) and run
# arguments -> the flag a user typed. tests/tuner/test_cli_flags.py holds it to those owners:
# every flag here exists, and every field of theirs has a flag here or a reason not to.
FLAGS = {
    "num_streams": "--streams",
    "sync_interval": "--sync-interval",
    "sync_mode": "--sync-mode",
    "prefetch_depth": "--prefetch-depth",
    "pin_memory": "--pin-memory",
    "non_blocking": "--non-blocking",
    "num_workers": "--num-workers",
    "cuda_graph": "--cuda-graph",
    "steps": "--steps",
    "warmup": "--warmup",
    "windows": "--windows",
    "device": "--device",
    "workload": "--workload",
    "preset": "--preset",
    "matmul_precision": "--matmul-precision",
    "trials": "--trials",
    "timeout_s": "--timeout",
    "objectives": "--objectives",
    "max_memory_bytes": "--max-memory",
    "top_k": "--top-k",
    "tie_margin": "--tie-margin",
    "final_rounds": "--final-rounds",
    "baseline_every": "--baseline-every",
    "parity_steps": "--parity-steps",
    "precision_parity_steps": "--precision-parity-steps",
    "precision_tolerance": "--precision-tolerance",
    "sampler": "--sampler",
    "window_steps": "--window-steps",
    "profile": "--profile",
    "profile_steps": "--profile-steps",
    "artifacts": "--artifacts",
    "model_arg": "--model-arg",
    "precision": "--precision",
    "precisions": "--precisions",
    "train_steps": "--train-steps",
    "patience": "--patience",
    "screen": "--screen",
    "nproc_per_node": "--nproc-per-node",
    "gpus": "--gpus",
    "compile": "--compile",
    "optimizer": "--optimizer",
    "space": "--space",
    "fix": "--fix",
    "storage": "--storage",
    "study": "--study",
    "seed": "--seed",
    "model_args": "--model-arg",
}


Workload = Annotated[
    str,
    typer.Option(
        help="A built-in workload (transformer, mlp, convnet), a library model (torchvision:NAME, "
        "timm:NAME, hf:KIND; see `python -m tuner models`) or package.module:factory."
    ),
]
ModelArgs = Annotated[
    list[str] | None,
    typer.Option(
        "--model-arg",
        show_default="none",
        help="A library model's option: key=value (repeatable; see `models`).",
    ),
]
Precision = Annotated[
    str | None,
    typer.Option(
        show_default="fp32",
        help="fp32, tf32, bf16-autocast, fp16-autocast (gradient scaler) or float8 (sm89+). "
        "Fixed for a study, not tuned: it changes the results.",
    ),
]
Precisions = Annotated[
    str | None,
    typer.Option(
        show_default="--precision alone",
        help="The precisions the search may choose among, comma-separated (e.g. "
        "bf16-autocast,float8): precision becomes a searched setting of every trial, and a "
        "trial in another than --precision (default: the first listed, the reference the "
        "baselines and the gate run in) is owed equivalence against it. Never searched by "
        "default.",
    ),
]
PRESET_HELP = "Workload size: tiny, small, medium or large (library models: `tuner models`)."
Preset = Annotated[str, typer.Option(help=PRESET_HELP)]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:INDEX.")]
MatmulPrecision = Annotated[
    str,
    typer.Option(
        help="float32 matmul precision: highest (PyTorch's default), high (TF32) or medium. "
        "Changes results and speed; not tuned."
    ),
]

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a summary.")]

Storage = Annotated[
    str | None,
    typer.Option(
        show_default="$TUNER_STORAGE, else sqlite:///tuner.db",
        help="Optuna storage URL: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB. An SQLite "
        "file's folder must exist: the file and its NAME-artifacts/ folder are created beside "
        "it, never a missing folder on the way to it (create those with mkdir -p).",
    ),
]
StudyName = Annotated[str, typer.Option("--study", help="Study name.")]

# `run`'s options, one alias each, so that the command's signature stays a list of names.
Trials = Annotated[
    int,
    typer.Option(
        help=f"Trials to run, 1-{MAX_TRIALS} (added to a resumed study; the API's trials).",
    ),
]
Timeout = Annotated[
    float | None,
    typer.Option(
        show_default="by device, as above",
        help="Stop starting trials after this many seconds (default: "
        f"{AUTO_SEARCH_BUDGET_S:.0f} on the default space on a GPU, {AUTO_SCALE_BUDGET_S:.0f} "
        f"there for a model of 250M parameters or more, each over N with --gpus N, "
        f"{CPU_SEARCH_BUDGET_S:.0f} on a CPU, else none).",
    ),
]
Space = Annotated[
    str,
    typer.Option(
        help="auto (on a GPU: scale from 250M parameters, else compile; full on a CPU), full, "
        "streams, compile, scale or a JSON file."
    ),
]
Fix = Annotated[
    list[str] | None,
    typer.Option(show_default="none", help="Pin a setting: name=value (repeatable)."),
]
RunStudy = Annotated[
    str | None, typer.Option(show_default="workload-preset-hardware", help="Study name.")
]
Objectives = Annotated[
    str, typer.Option(help="throughput, or throughput,memory for a Pareto front.")
]
MaxMemory = Annotated[
    int | None,
    typer.Option(
        show_default="no cap",
        help="Recommend the fastest config under this many bytes of peak memory.",
    ),
]
TopK = Annotated[int, typer.Option(help="Configs re-measured in the final round.")]
TieMargin = Annotated[
    float, typer.Option(help="Configs within this fraction of the fastest median also tie.")
]
FinalRounds = Annotated[
    int | None,
    typer.Option(
        show_default="3; 1 on a CPU",
        help=f"Interleaved final rounds at most (default: 3; {CPU_FINAL_ROUNDS} on a CPU); they "
        "stop once a round leaves the decision as it was.",
    ),
]
BaselineEvery = Annotated[
    int, typer.Option(help="Re-measure the baselines every N trials (drift).")
]
ParitySteps = Annotated[int, typer.Option(help="Steps of each parity check.")]
PrecisionParitySteps = Annotated[
    int | None,
    typer.Option(
        show_default="--parity-steps",
        help="Steps of the parity check of a config in another precision than --precision "
        "(with --precisions), judged against the reference's seed-to-seed envelope (default: "
        "--parity-steps; the float8 evidence used 200).",
    ),
]
PrecisionTolerance = Annotated[
    float | None,
    typer.Option(
        show_default="3",
        help="How many times the reference's seed-to-seed envelope a config in another "
        "precision may deviate by (default: 3, the gate's own multiple; shown in its verdict).",
    ),
]
Warmup = Annotated[int, typer.Option(help="Untimed steps per measurement.")]
Windows = Annotated[int, typer.Option(help="Timed windows per measurement.")]
WindowSteps = Annotated[
    int | None,
    typer.Option(
        show_default="by model, as above",
        help=f"Steps per timed window (default: {DEFAULT_WINDOW_STEPS}; {SCALE_WINDOW_STEPS} on "
        "the scale space, models of 250M parameters and more on a GPU, whose steps are long).",
    ),
]
Sampler = Annotated[str, typer.Option(help="tpe or random.")]
Seed = Annotated[int, typer.Option(help="Seed of the sampler, weights and data (0 to 2^32 - 1).")]
TrainSteps = Annotated[
    int | None,
    typer.Option(
        show_default="none",
        help="Your planned run length: recommend the least total time, setup "
        "(compilation) included, over that many steps.",
    ),
]
Patience = Annotated[
    int | None,
    typer.Option(
        show_default="by device, as above",
        help="Stop starting trials after this many complete trials in a row without a "
        f"gain above --tie-margin; 0: off (default: {AUTO_PATIENCE} on the default space on a "
        "GPU, else off).",
    ),
]
Screen = Annotated[
    str,
    typer.Option(
        help="Screen, then gate: auto (on for models of 250M parameters or more on a GPU, and "
        "under --nproc-per-node above 1), on, off. A trial slower than the fastest so far is "
        "pruned after two windows and never gated; a candidate predicted not to fit, or to "
        "lose, is not run."
    ),
]
Profile = Annotated[
    str | None,
    typer.Option(
        show_default="baselines; none on a CPU",
        help="Profile none, the baselines and the recommended config (baselines), or every "
        "complete trial too (all). Default: baselines; none on a CPU, where a profile has no "
        "GPU figures.",
    ),
]
ProfileSteps = Annotated[int, typer.Option(help="Profiled steps per config.")]
Artifacts = Annotated[
    str | None,
    typer.Option(
        show_default="beside an SQLite database",
        help="Directory of the profiler traces (default: beside an SQLite database; "
        "$TUNER_ARTIFACTS).",
    ),
]
Program = Annotated[
    str | None,
    typer.Option(
        show_default="none",
        help="A registered training program to tune as it is (the registry file in "
        "$TUNER_PROGRAMS; see trainers/program/runner.py): same as --workload program:NAME.",
    ),
]
NprocPerNode = Annotated[
    int,
    typer.Option(
        help="Processes per trial on this node, one per GPU (gloo on a CPU): above 1, each "
        "trial is a torchrun launch and DDP, FSDP2 and their settings are searched."
    ),
]
Gpus = Annotated[
    str,
    typer.Option(
        help="GPUs of this node whose workers run the trials at once, one trial per GPU: a "
        "number or all (every visible GPU). Above 1 the run is a job of the storage's job "
        "table, run by one `python -m tuner worker` per GPU (as the service runs them); the "
        "final round measures every finalist on one GPU. 1: this process alone."
    ),
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet",
        help="Print no progress. Without it, progress goes to stderr: a live bar on a "
        "terminal, else one line per phase and per trial.",
    ),
]

# `train`'s own options.
Streams = Annotated[int, typer.Option(help="1-4 CUDA streams (see LoopConfig).")]
SyncInterval = Annotated[int, typer.Option(help="Host syncs every N steps.")]
SyncMode = Annotated[str, typer.Option(help="synchronize, event or query.")]
PrefetchDepth = Annotated[int, typer.Option(help="Batches copied ahead, 0-4.")]
PinMemory = Annotated[bool, typer.Option(help="Page-locked batches.")]
NonBlocking = Annotated[bool, typer.Option(help="Asynchronous H2D copies.")]
NumWorkers = Annotated[int, typer.Option(help="DataLoader workers.")]
CudaGraph = Annotated[bool, typer.Option(help="Capture the step in a CUDA graph.")]
Steps = Annotated[int, typer.Option(help="Measured steps.")]
TrainWarmup = Annotated[int, typer.Option(help="Untimed steps first.")]
TrainWindows = Annotated[int | None, typer.Option(help="Timed windows: 5, or --steps if fewer.")]
TrainSeed = Annotated[int, typer.Option(min=0, max=2**32 - 1, help="Seed of weights and data.")]
CompileMode = Annotated[
    str,
    typer.Option(
        "--compile",
        help=(
            "torch.compile of the model: none or one of LoopConfig's compile modes (a mode it "
            "does not declare is refused, naming those it does)."
        ),
    ),
]
Optimizer = Annotated[str, typer.Option(help="as-built, foreach, fused or compiled.")]


if TYPE_CHECKING:
    from tuner.request import JobSpec

F = TypeVar("F")
R = TypeVar("R")


# `run --help` in groups: each option in the first whose fields name it, else in "Advanced".
RUN_PANELS = {
    "What to tune": "workload preset program model_arg device precision precisions space fix "
    "objectives max_memory train_steps",
    "How long": "trials timeout patience screen final_rounds",
    "Where it is stored": "storage study artifacts",
}


def command_of(
    flags: type[F], panels: dict[str, str] | None = None
) -> Callable[[Callable[[F], R]], Callable[..., R]]:
    """A Typer command whose options are the fields of the dataclass `flags` (their annotations
    are the aliases above, their defaults the flags' defaults), calling the function with one
    `flags` instance: a typed object in place of a signature of dozens of parameters. `panels`:
    the help's groups (`RUN_PANELS`)."""
    hints = typing.get_type_hints(flags, include_extras=True)
    params = [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=field.default,
            annotation=_shown(hints[field.name], field.name, panels),
        )
        for field in dataclasses.fields(flags)  # type: ignore[arg-type]
    ]

    def wrap(function: Callable[[F], R]) -> Callable[..., R]:
        def command(**given: Any) -> R:
            return function(flags(**given))

        command.__name__ = function.__name__
        command.__qualname__ = function.__qualname__
        command.__doc__ = function.__doc__
        command.__module__ = function.__module__
        # What Typer reads: the signature and the type hints.
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap


def _shown(hint: Any, name: str, panels: dict[str, str] | None) -> Any:
    """The option's alias in its help group; a flag without its `<bool>` label (it takes no
    value: `--quiet`, not `--quiet true`). The alias is shared with other commands: a copy."""
    if panels is None:
        return hint
    base, info, *rest = typing.get_args(hint)
    info = copy.copy(info)
    groups = (p for p, names in panels.items() if name in names.split())
    info.rich_help_panel = next(groups, "Advanced")
    if base is bool:
        info.metavar, info.show_default = "", "off"
    return Annotated[base, info, *rest]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunFlags:
    """`python -m tuner run`'s flags as typed: the request (`spec`, the API's job field for
    field) and how this process measures it (`settings`, `RunOptions`' other fields)."""

    workload: Workload = "transformer"
    preset: Preset = "tiny"  # the README's (and `train`'s): a first run on any machine
    trials: Trials = DEFAULT_TRIALS
    timeout: Timeout = None
    space: Space = "auto"
    fix: Fix = None
    storage: Storage = None
    study: RunStudy = None
    device: Device = "auto"
    objectives: Objectives = "throughput"
    max_memory: MaxMemory = None
    top_k: TopK = 3
    tie_margin: TieMargin = 0.01
    final_rounds: FinalRounds = None
    baseline_every: BaselineEvery = 10
    parity_steps: ParitySteps = 20
    precision_parity_steps: PrecisionParitySteps = None
    precision_tolerance: PrecisionTolerance = None
    warmup: Warmup = 10
    windows: Windows = 5
    window_steps: WindowSteps = None
    sampler: Sampler = "tpe"
    seed: Seed = 0
    matmul_precision: MatmulPrecision = "highest"
    model_arg: ModelArgs = None
    precision: Precision = None
    precisions: Precisions = None
    train_steps: TrainSteps = None
    patience: Patience = None
    screen: Screen = "auto"
    profile: Profile = None
    profile_steps: ProfileSteps = 10
    artifacts: Artifacts = None
    program: Program = None
    quiet: Quiet = False
    nproc_per_node: NprocPerNode = 1
    gpus: Gpus = "1"
    as_json: AsJson = False

    @property
    def workload_name(self) -> str:
        return program_workload(self.program, self.workload)

    def spec(self) -> JobSpec:
        """What is asked: the API's job, field for field (one process: `gpus` 1)."""
        from tuner.request import JobSpec
        from tuner.search.spaces.pins import parse_fix

        return JobSpec(
            workload=self.workload_name,
            preset=self.preset,
            space=self.space,
            fix=parse_fix(self.fix or ()),
            trials=self.trials,
            timeout_s=self.timeout,
            objectives=tuple(o.strip() for o in self.objectives.split(",")),
            max_memory_bytes=self.max_memory,
            device=self.device,
            model_args=parse_model_args(self.model_arg or ()),
            precision=self.precision,
            precisions=parse_precisions(self.precisions),
            nproc_per_node=self.nproc_per_node,
            screen=self.screen,
            patience=self.patience,
            gpus=1,
        )

    def settings(self) -> dict[str, Any]:
        """How this process measures the request: `RunOptions`' other fields, by name, as a
        service worker takes them from its `TUNER_*` settings. None where the default depends
        on the device (final_rounds, profile: `tuner.cli`'s CPU defaults)."""
        from tuner.errors import TunerError
        from tuner.search.measuring.measure import Protocol

        if not 0 <= self.seed < 2**32:  # Optuna's sampler refused it later, with a traceback
            raise TunerError(f"--seed: seed={self.seed} is invalid: allowed 0 to 4294967295")
        return {
            "storage": self.storage,
            "study": self.study,
            "top_k": self.top_k,
            "tie_margin": self.tie_margin,
            "final_rounds": self.final_rounds,
            "baseline_every": self.baseline_every,
            "parity_steps": self.parity_steps,
            "precision_parity_steps": self.precision_parity_steps,
            "precision_tolerance": self.precision_tolerance,
            "sampler": self.sampler,
            "seed": self.seed,
            "matmul_precision": self.matmul_precision,
            "profile": self.profile,
            "profile_steps": self.profile_steps,
            "artifacts": self.artifacts,
            "train_steps": self.train_steps,
            "protocol": Protocol.given(
                warmup=self.warmup,
                windows=self.windows,
                window_steps=self.window_steps,
                seed=self.seed,
            ),
            "auto_window_steps": self.window_steps is None,
        }
