"""The `python -m tuner` commands. Thin: parse flags, call the library, print."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from tuner.errors import SpaceError, TunerError
from tuner.evidence import progress
from tuner.search.proposing.defaults import (
    AUTO_PATIENCE,
    AUTO_SCALE_BUDGET_S,
    AUTO_SEARCH_BUDGET_S,
    DEFAULT_TRIALS,
    DEFAULT_WINDOW_STEPS,
    MAX_TRIALS,
    SCALE_WINDOW_STEPS,
)

# Each command imports what it needs when it runs: importing torch, Optuna and scipy takes 3-7 s
# on a 2-core machine, and `run` prints its first progress line before that (issue 29).
if TYPE_CHECKING:
    from tuner.evidence.recommendation import Recommendation
    from tuner.search.options import RunOptions
    from tuner.service.node import NodeDevices, NodeSummary

app = typer.Typer(
    help="streamtune: measure and tune the concurrency settings of PyTorch training loops.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

CPU_SEARCH_BUDGET_S = 30.0
"""`python -m tuner run`'s search budget on a CPU when no --timeout is given (`_cpu_defaults`)."""
CPU_FINAL_ROUNDS = 1
"""Its final rounds on a CPU when no --final-rounds is given."""

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


@app.callback()
def _root() -> None:
    """streamtune: measure and tune the concurrency settings of PyTorch training loops."""


def flag_error(exc: Exception) -> str | None:
    """A one-line message for a known input error, naming the flag; None for anything else."""
    import trainers  # loaded already when the error came from it

    if isinstance(exc, trainers.ConfigError):
        return f"{FLAGS.get(exc.field, exc.field)}: {exc}"
    if isinstance(exc, trainers.WorkloadError):
        flag = FLAGS.get(exc.field or "", "--workload")
        return f"{flag}: {exc}"
    if isinstance(exc, trainers.UnsupportedOnDevice | trainers.CaptureError):
        return str(exc)
    if isinstance(exc, SpaceError):
        return f"--space/--fix: {exc}"
    if isinstance(exc, TunerError):
        return str(exc)
    return None


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
        "--model-arg", help="A library model's option: key=value (repeatable; see `models`)."
    ),
]
Precision = Annotated[
    str | None,
    typer.Option(
        help="fp32, tf32, bf16-autocast or fp16-autocast (with a gradient scaler). Fixed for a "
        "study, never tuned: it changes the results."
    ),
]
Precisions = Annotated[
    str | None,
    typer.Option(
        help="The precisions the search may choose among, comma-separated (e.g. "
        "bf16-autocast,float8): precision becomes a searched setting of every trial, and a "
        "trial in another than --precision (default: the first listed, the reference the "
        "baselines and the gate run in) is owed equivalence against it. Default: --precision "
        "alone, never searched."
    ),
]
Preset = Annotated[str, typer.Option(help="Workload size: tiny, small, medium, large.")]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:INDEX.")]
MatmulPrecision = Annotated[
    str,
    typer.Option(
        help="float32 matmul precision: highest (PyTorch's default), high (TF32) or medium. "
        "Changes results and speed; not tuned."
    ),
]

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a summary.")]


@app.command()
def train(
    workload: Workload = "transformer",
    preset: Preset = "tiny",
    streams: Annotated[int, typer.Option(help="1-4 CUDA streams (see LoopConfig).")] = 1,
    sync_interval: Annotated[int, typer.Option(help="Host syncs every N steps.")] = 1,
    sync_mode: Annotated[str, typer.Option(help="synchronize, event or query.")] = "synchronize",
    prefetch_depth: Annotated[int, typer.Option(help="Batches copied ahead, 0-4.")] = 0,
    pin_memory: Annotated[bool, typer.Option(help="Page-locked batches.")] = False,
    non_blocking: Annotated[bool, typer.Option(help="Asynchronous H2D copies.")] = False,
    num_workers: Annotated[int, typer.Option(help="DataLoader workers.")] = 0,
    cuda_graph: Annotated[bool, typer.Option(help="Capture the step in a CUDA graph.")] = False,
    steps: Annotated[int, typer.Option(help="Measured steps.")] = 50,
    warmup: Annotated[int, typer.Option(help="Untimed steps first.")] = 10,
    windows: Annotated[int, typer.Option(help="Timed windows the steps are split into.")] = 5,
    device: Device = "auto",
    seed: Annotated[int, typer.Option(help="Seed of the weights and the data.")] = 0,
    matmul_precision: MatmulPrecision = "highest",
    model_arg: ModelArgs = None,
    precision: Precision = None,
    compile_mode: Annotated[
        str,
        typer.Option(
            "--compile",
            help=(
                "torch.compile of the model: none, default, max-autotune-no-cudagraphs or "
                "reduce-overhead."
            ),
        ),
    ] = "none",
    optimizer: Annotated[
        str, typer.Option(help="as-built, foreach, fused or compiled.")
    ] = "as-built",
    as_json: AsJson = False,
) -> None:
    """Run one measured training run and print its RunResult."""
    import trainers
    from tuner.evidence import render

    trainers.check_precisions(precision, matmul_precision)
    trainers.set_matmul_precision(matmul_precision)
    config = trainers.LoopConfig(
        num_streams=streams,
        sync_interval=sync_interval,
        sync_mode=sync_mode,  # type: ignore[arg-type]  # validated by LoopConfig
        prefetch_depth=prefetch_depth,
        pin_memory=pin_memory,
        non_blocking=non_blocking,
        num_workers=num_workers,
        cuda_graph=cuda_graph,
        compile=compile_mode,  # type: ignore[arg-type]  # validated by LoopConfig
        optimizer=optimizer,  # type: ignore[arg-type]  # validated by LoopConfig
    )
    dev = trainers.resolve_device(device)
    built = trainers.load_workload(
        workload, preset, seed=seed, model_args=parse_model_args(model_arg or ())
    )
    result = trainers.run(
        built,
        config,
        steps=steps,
        warmup=warmup,
        windows=windows,
        device=dev,
        precision=precision,  # type: ignore[arg-type]  # run() checks it
    )
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        render.run_summary(Console(), result)


def parse_precisions(text: str | None) -> tuple[str, ...] | None:
    """`--precisions a,b` as a tuple (`RunOptions` checks each value and the rest)."""
    if text is None:
        return None
    return tuple(part.strip() for part in text.split(","))


def parse_model_args(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """`--model-arg key=value` items as a mapping; the adapter checks keys and values."""
    parsed: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TunerError(f"--model-arg: {item!r} is invalid: allowed key=value")
        if key.strip() in parsed:
            raise TunerError(f"--model-arg: {key.strip()!r} is given twice")
        parsed[key.strip()] = value.strip()
    return parsed


@app.command()
def models(as_json: AsJson = False) -> None:
    """List the library-model families, their presets and the --model-arg options each takes."""
    from trainers.workloads import catalog
    from tuner.evidence import render

    families = catalog()
    if as_json:
        typer.echo(
            json.dumps([dataclasses.asdict(family) for family in families], indent=2, default=dict)
        )
    else:
        render.model_table(Console(), families)


Storage = Annotated[
    str | None,
    typer.Option(
        help="Optuna storage URL (default: $TUNER_STORAGE or sqlite:///tuner.db). An SQLite "
        "file's folder must exist: the file and its NAME-artifacts/ folder are created beside "
        "it, never a missing folder on the way to it (create those with mkdir -p)."
    ),
]
StudyName = Annotated[str, typer.Option("--study", help="Study name.")]

# `run`'s options, one alias each, so that the command's signature stays a list of names.
Trials = Annotated[
    int,
    typer.Option(
        min=1,
        max=MAX_TRIALS,
        help=f"Trials to run, 1-{MAX_TRIALS} (added to a resumed study; the API's n_trials).",
    ),
]
Timeout = Annotated[
    float | None,
    typer.Option(
        help="Stop starting trials after this many seconds (default: "
        f"{AUTO_SEARCH_BUDGET_S:.0f} on the default space on a GPU, {AUTO_SCALE_BUDGET_S:.0f} "
        f"there for a model of 250M parameters or more, {CPU_SEARCH_BUDGET_S:.0f} on a CPU, "
        "else none)."
    ),
]
Space = Annotated[
    str,
    typer.Option(
        help="auto (compile on a GPU, full on a CPU), full, streams, compile or a JSON file."
    ),
]
Fix = Annotated[list[str] | None, typer.Option(help="Pin a setting: name=value (repeatable).")]
RunStudy = Annotated[
    str | None, typer.Option(help="Study name (default: workload-preset-hardware).")
]
Objectives = Annotated[
    str, typer.Option(help="throughput, or throughput,memory for a Pareto front.")
]
MaxMemory = Annotated[
    int | None,
    typer.Option(help="Recommend the fastest config under this many bytes of peak memory."),
]
TopK = Annotated[int, typer.Option(help="Configs re-measured in the final round.")]
TieMargin = Annotated[
    float, typer.Option(help="Configs within this fraction of the fastest median also tie.")
]
FinalRounds = Annotated[
    int | None,
    typer.Option(
        help=f"Interleaved final rounds at most (default: 3; {CPU_FINAL_ROUNDS} on a CPU); they "
        "stop once a round leaves the decision as it was."
    ),
]
BaselineEvery = Annotated[
    int, typer.Option(help="Re-measure the baselines every N trials (drift).")
]
ParitySteps = Annotated[int, typer.Option(help="Steps of each parity check.")]
PrecisionParitySteps = Annotated[
    int | None,
    typer.Option(
        help="Steps of the parity check of a config in another precision than --precision "
        "(with --precisions), judged against the reference's seed-to-seed envelope (default: "
        "--parity-steps; the float8 evidence used 200)."
    ),
]
PrecisionTolerance = Annotated[
    float | None,
    typer.Option(
        help="How many times the reference's seed-to-seed envelope a config in another "
        "precision may deviate by (default: 3, the gate's own multiple; shown in its verdict)."
    ),
]
Warmup = Annotated[int, typer.Option(help="Untimed steps per measurement.")]
Windows = Annotated[int, typer.Option(help="Timed windows per measurement.")]
WindowSteps = Annotated[
    int | None,
    typer.Option(
        help=f"Steps per timed window (default: {DEFAULT_WINDOW_STEPS}; {SCALE_WINDOW_STEPS} on "
        "the scale space, models of 250M parameters and more on a GPU, whose steps are long)."
    ),
]
Sampler = Annotated[str, typer.Option(help="tpe or random.")]
Seed = Annotated[int, typer.Option(help="Seed of the sampler, weights and data.")]
TrainSteps = Annotated[
    int | None,
    typer.Option(
        help="Your planned run length: recommend the least total time, setup "
        "(compilation) included, over that many steps."
    ),
]
Patience = Annotated[
    int | None,
    typer.Option(
        help="Stop starting trials after this many complete trials in a row without a "
        f"gain above --tie-margin; 0: off (default: {AUTO_PATIENCE} on the default space on a "
        "GPU, else off)."
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
        help="Profile none, the baselines and the recommended config (baselines), or every "
        "complete trial too (all). Default: baselines; none on a CPU, where a profile has no "
        "GPU figures."
    ),
]
ProfileSteps = Annotated[int, typer.Option(help="Profiled steps per config.")]
Artifacts = Annotated[
    str | None,
    typer.Option(
        help="Directory of the profiler traces (default: beside an SQLite database; "
        "$TUNER_ARTIFACTS)."
    ),
]
Program = Annotated[
    str | None,
    typer.Option(
        help="A registered training program to tune as it is (the registry file in "
        "$TUNER_PROGRAMS; see trainers/program/runner.py): same as --workload program:NAME."
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
        "final round measures every finalist on one GPU. 1: this process alone. On a CPU, "
        "$TUNER_CPU_STANDINS CPU workers may stand in for GPUs (tests)."
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


@app.command("run")
def run_(
    workload: Workload = "transformer",
    preset: Preset = "small",
    trials: Trials = DEFAULT_TRIALS,
    timeout: Timeout = None,
    space: Space = "auto",
    fix: Fix = None,
    storage: Storage = None,
    study: RunStudy = None,
    device: Device = "auto",
    objectives: Objectives = "throughput",
    max_memory: MaxMemory = None,
    top_k: TopK = 3,
    tie_margin: TieMargin = 0.01,
    final_rounds: FinalRounds = None,
    baseline_every: BaselineEvery = 10,
    parity_steps: ParitySteps = 20,
    precision_parity_steps: PrecisionParitySteps = None,
    precision_tolerance: PrecisionTolerance = None,
    warmup: Warmup = 10,
    windows: Windows = 5,
    window_steps: WindowSteps = None,
    sampler: Sampler = "tpe",
    seed: Seed = 0,
    matmul_precision: MatmulPrecision = "highest",
    model_arg: ModelArgs = None,
    precision: Precision = None,
    precisions: Precisions = None,
    train_steps: TrainSteps = None,
    patience: Patience = None,
    screen: Screen = "auto",
    profile: Profile = None,
    profile_steps: ProfileSteps = 10,
    artifacts: Artifacts = None,
    program: Program = None,
    quiet: Quiet = False,
    nproc_per_node: NprocPerNode = 1,
    gpus: Gpus = "1",
    as_json: AsJson = False,
) -> None:
    """Tune: search the settings with short real runs and recommend a config."""
    flags = dict(locals())  # every flag as given, for `_run_options`
    show = progress.for_terminal(quiet=quiet, stdout=sys.stdout, stderr=sys.stderr)
    with show:
        rec, node = _tune(flags, show)
    from tuner.evidence import render

    if as_json:
        shown = rec.to_dict() if node is None else rec.to_dict() | {"node": node.to_dict()}
        typer.echo(json.dumps(shown, indent=2))
    else:
        render.recommendation(Console(), rec)
        if node is not None:
            Console().print(node.line(), soft_wrap=True)


def _tune(flags: dict[str, Any], show: Any) -> tuple[Recommendation, NodeSummary | None]:
    """Check the flags and the storage, apply a CPU's defaults, run the study, end the progress
    on the recommendation's figure. The first line comes before anything slow (importing torch,
    building the workload, opening the study), so a log shows at once that the run started."""
    workload = flags["workload"] if flags["program"] is None else f"program:{flags['program']}"
    show.line(
        f"tuning {workload} / {flags['preset']} on device {flags['device']}: loading PyTorch "
        "and Optuna"
    )
    from tuner.search.study import run_study
    from tuner.store import storage as studies

    options = _run_options(flags, workload)
    url = studies.storage_url(flags["storage"])
    studies.check_sqlite_path(url)
    show.line(f"building the workload, then opening the study in {url}")
    gpus, devices = _gpus(flags)
    options = _cpu_defaults(options, flags, show)
    if devices is not None:
        from tuner.service.node import run_on_node

        rec, node = run_on_node(options, gpus, devices, url, show)
        show.finish(rec)
        show.line(node.line())
        return rec, node
    rec = run_study(options, progress=show)
    show.finish(rec)
    return rec, None


def _gpus(flags: dict[str, Any]) -> tuple[int, NodeDevices | None]:
    """`--gpus` checked against this node (`tuner.service.node.resolve_gpus`); 1: no devices,
    the run stays in this process as it always was."""
    if flags["gpus"].strip() == "1":
        return 1, None
    from tuner.service.node import resolve_gpus

    return resolve_gpus(flags["gpus"], flags["device"])


def _run_options(flags: dict[str, Any], workload: str) -> RunOptions:
    """`run`'s flags as the search's `RunOptions` (which checks them)."""
    from tuner.search.measuring.measure import Protocol
    from tuner.search.options import RunOptions

    return RunOptions(
        workload=workload,
        preset=flags["preset"],
        trials=flags["trials"],
        timeout_s=flags["timeout"],
        space=flags["space"],
        fix=tuple(flags["fix"] or ()),
        storage=flags["storage"],
        study=flags["study"],
        device=flags["device"],
        objectives=tuple(o.strip() for o in flags["objectives"].split(",")),
        max_memory_bytes=flags["max_memory"],
        top_k=flags["top_k"],
        tie_margin=flags["tie_margin"],
        final_rounds=3 if flags["final_rounds"] is None else flags["final_rounds"],
        baseline_every=flags["baseline_every"],
        parity_steps=flags["parity_steps"],
        precision_parity_steps=flags["precision_parity_steps"],
        precision_tolerance=flags["precision_tolerance"],
        sampler=flags["sampler"],
        seed=flags["seed"],
        matmul_precision=flags["matmul_precision"],
        profile=flags["profile"] or "baselines",
        profile_steps=flags["profile_steps"],
        model_args=parse_model_args(flags["model_arg"] or ()),
        train_steps=flags["train_steps"],
        patience=flags["patience"],
        screen=flags["screen"],
        precision=flags["precision"],
        precisions=parse_precisions(flags["precisions"]),
        artifacts=flags["artifacts"],
        protocol=Protocol.given(
            warmup=flags["warmup"],
            windows=flags["windows"],
            window_steps=flags["window_steps"],
            seed=flags["seed"],
        ),
        auto_window_steps=flags["window_steps"] is None,
        nproc_per_node=flags["nproc_per_node"],
    )


def _cpu_defaults(options: RunOptions, flags: dict[str, Any], show: Any) -> RunOptions:
    """On a CPU, where not given: a search budget of CPU_SEARCH_BUDGET_S, CPU_FINAL_ROUNDS final
    round and no profiles. A CPU run answers whether the workload trains under each config and
    passes the gate, not which config is fastest on a GPU (the summary says so), and a CPU
    profile has no GPU figures; so a long job there buys nothing. On this project's 2-core
    machine, under other jobs' load, the README's first command took 239 s with three final
    rounds (128 s) and profiles (31 s). A GPU's defaults are untouched."""
    import trainers

    if trainers.resolve_device(options.device).type != "cpu":
        return options
    changes: dict[str, Any] = {}
    said: list[str] = []
    if flags["timeout"] is None:
        changes["timeout_s"] = CPU_SEARCH_BUDGET_S
        said.append(f"search budget {CPU_SEARCH_BUDGET_S:.0f} s (--timeout)")
    if flags["final_rounds"] is None:
        changes["final_rounds"] = CPU_FINAL_ROUNDS
        said.append(f"{CPU_FINAL_ROUNDS} final round (--final-rounds)")
    if flags["profile"] is None:
        changes["profile"] = "none"
        said.append("no profiles (--profile)")
    if said:
        show.phase(f"on a CPU: {', '.join(said)}; the flags in brackets set others")
    return dataclasses.replace(options, **changes)


@app.command()
def best(study: StudyName, storage: Storage = None, as_json: AsJson = False) -> None:
    """Print a study's recommendation."""
    from tuner.evidence import reader, render
    from tuner.store import storage as studies

    rec = reader.recommendation(studies.storage_url(storage), study)
    if as_json:
        typer.echo(json.dumps(rec.to_dict(), indent=2))
    else:
        render.recommendation(Console(), rec)


@app.command()
def export(
    study: StudyName,
    storage: Storage = None,
    format: Annotated[str, typer.Option("--format", help="json, env or python.")] = "json",
) -> None:
    """Print the recommended config as JSON, environment variables or Python."""
    from tuner.evidence import export as exporting
    from tuner.evidence import reader
    from tuner.store import storage as studies

    rec = reader.recommendation(studies.storage_url(storage), study)
    typer.echo(exporting.export(rec, format))


@app.command("studies")
def studies_(storage: Storage = None, as_json: AsJson = False) -> None:
    """List the studies in the storage with their best throughput."""
    from tuner.evidence import reader, render
    from tuner.store import storage as studies

    rows = reader.list_studies(studies.storage_url(storage))
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
    else:
        render.study_table(Console(), rows)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = 8000,
    workers: Annotated[
        int | None,
        typer.Option(
            help="Worker processes (default: $TUNER_WORKERS, else one per visible GPU, or one on "
            "the CPU).",
            min=0,
        ),
    ] = None,
    no_worker: Annotated[
        bool,
        typer.Option(
            "--no-worker", help="Start no worker (run `python -m tuner worker` elsewhere)."
        ),
    ] = False,
    storage: Storage = None,
) -> None:
    """Serve the tuning API (and its workers): submit jobs, watch them, read recommendations."""
    if no_worker and workers is not None:
        raise TunerError("--workers/--no-worker: give one of them, not both")
    # The service is the `api` package, a layer above `tuner`: run it as its own program (this
    # process becomes it, so signals and the exit status are the service's) instead of importing it.
    args = [sys.executable, "-m", "api", "--host", host, "--port", str(port)]
    if workers is not None:
        args += ["--workers", str(workers)]
    if no_worker:
        args.append("--no-worker")
    if storage is not None:
        args += ["--storage", storage]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, args)


@app.command()
def worker(
    storage: Storage = None,
    gpu: Annotated[
        int | None,
        typer.Option(help="GPU index (default: GPU 0 if there is one, else the CPU).", min=0),
    ] = None,
    job: Annotated[
        str | None,
        typer.Option(help="Run this job only, then exit (what `run --gpus N` starts)."),
    ] = None,
) -> None:
    """Run a worker: claim queued tuning jobs from the storage and run them, until SIGTERM."""
    from tuner.service.worker import main as run_worker

    run_worker(storage=storage, gpu=gpu, job=job)


@app.command()
def report(
    study: StudyName,
    out: Annotated[str, typer.Option("--out", help="The HTML file to write.")] = "report.html",
    storage: Storage = None,
) -> None:
    """Write one self-contained HTML page about a study (plots, recommendation, profiles)."""
    from tuner.evidence.report import write_report
    from tuner.store import storage as studies

    path = write_report(studies.storage_url(storage), study, out)
    typer.echo(str(path))
