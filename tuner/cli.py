"""The `python -m tuner` commands. Thin: parse flags, call the library, print."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from tuner.errors import NoRecommendation, SpaceError, TunerError, users_frame
from tuner.evidence import progress
from tuner.flags import (
    FLAGS,
    RUN_PANELS,
    AsJson,
    CompileMode,
    CudaGraph,
    Device,
    MatmulPrecision,
    ModelArgs,
    NonBlocking,
    NumWorkers,
    Optimizer,
    PinMemory,
    Precision,
    PrefetchDepth,
    Preset,
    RunFlags,
    Steps,
    Storage,
    Streams,
    StudyName,
    SyncInterval,
    SyncMode,
    TrainSeed,
    TrainWarmup,
    TrainWindows,
    Workload,
    command_of,
    parse_model_args,
)
from tuner.repeats import say_overridden
from tuner.search.proposing.defaults import CPU_FINAL_ROUNDS, CPU_SEARCH_BUDGET_S

# Each command imports what it needs when it runs: importing torch, Optuna and scipy takes 3-7 s
# on a 2-core machine, and `run` prints its first progress line before that (issue 29).
if TYPE_CHECKING:
    from tuner.evidence.recommendation import Recommendation
    from tuner.request import JobSpec
    from tuner.search.options import RunOptions
    from tuner.service.node import NodeDevices, NodeSummary

app = typer.Typer(
    help="streamtune: measure and tune the concurrency settings of PyTorch training loops.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """streamtune: measure and tune the concurrency settings of PyTorch training loops."""


def flag_error(exc: Exception) -> str | None:
    """A one-line message for a known input error, naming the flag; None for anything else."""
    import trainers  # loaded already when the error came from it

    if isinstance(exc, trainers.ConfigError):
        return f"{FLAGS.get(exc.field, exc.field)}: {exc}"
    if isinstance(exc, trainers.WorkloadError):
        field = exc.field or ""
        # `model_arg.batch`: a --model-arg value's own error, not the workload's.
        flag = "--model-arg" if field.startswith("model_arg") else FLAGS.get(field, "--workload")
        return f"{flag}: {exc}"
    if isinstance(exc, trainers.UnsupportedOnDevice | trainers.CaptureError):
        # Their messages begin with the setting (`device='cuda': CUDA is not available`):
        # named by its flag, as every other input error is.
        field = str(exc).partition("=")[0]
        return f"{FLAGS[field]}: {exc}" if field in FLAGS else str(exc)
    if isinstance(exc, SpaceError):
        return f"--space/--fix: {exc}"
    if isinstance(exc, TunerError):
        return str(exc)
    return None


def _run_or_one_line(workload: Any, config: Any, args: Any) -> Any:
    """`trainers.run`; the user's code failing there (a loss, a dtype) is one line and where,
    as `run` reports a trial's failure, not a traceback through the loop (exit 1)."""
    import trainers
    from tuner.search.measuring.baselines import double_hint

    try:
        return trainers.run(workload, config, args)
    except Exception as exc:
        if flag_error(exc) is not None:
            raise  # an input error: one line naming its flag (`tuner.__main__`)
        said, where = " ".join(str(exc).split())[:500], users_frame(exc)
        said += double_hint(said)  # a NumPy float64 batch: its fix, as `run` gives it
        typer.echo(f"error: the run failed: {type(exc).__name__}{where}: {said}", err=True)
        raise typer.Exit(1) from exc


@app.command()
def train(
    workload: Workload = "transformer",
    preset: Preset = "tiny",
    streams: Streams = 1,
    sync_interval: SyncInterval = 1,
    sync_mode: SyncMode = "synchronize",
    prefetch_depth: PrefetchDepth = 0,
    pin_memory: PinMemory = False,
    non_blocking: NonBlocking = False,
    num_workers: NumWorkers = 0,
    cuda_graph: CudaGraph = False,
    steps: Steps = 50,
    warmup: TrainWarmup = 10,
    windows: TrainWindows = None,
    device: Device = "auto",
    seed: TrainSeed = 0,
    matmul_precision: MatmulPrecision = "highest",
    model_arg: ModelArgs = None,
    precision: Precision = None,
    compile_mode: CompileMode = "none",
    optimizer: Optimizer = "as-built",
    as_json: AsJson = False,
) -> None:
    """Run one measured training run and print its RunResult."""
    import trainers
    from tuner.evidence import render

    trainers.PrecisionSpec.of(precision, matmul_precision=matmul_precision)
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
    # The user's code prints to stderr under --json, as `run`'s does: stdout is the JSON alone.
    with _stdout_to_stderr() if as_json else contextlib.nullcontext():
        built = trainers.load_workload(
            workload, preset, seed=seed, model_args=parse_model_args(model_arg or ())
        )
        say_overridden()
        args = trainers.RunArgs(
            steps=steps,
            warmup=warmup,
            windows=min(5, steps) if windows is None else windows,  # `--steps 2` alone runs
            device=dev,
            precision=precision,  # type: ignore[arg-type]  # run() checks it
        )
        result = _run_or_one_line(built, config, args)
    if as_json:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        render.run_summary(Console(), result)


@app.command()
def models(as_json: AsJson = False) -> None:
    """List the library-model families, their presets and the --model-arg options each takes."""
    from trainers.workloads import catalog
    from tuner.evidence import render

    families = catalog()
    if as_json:
        # The families' data: a family's `check` and `fill` are code, not listed.
        listed = [
            {k: v for k, v in dataclasses.asdict(family).items() if k not in ("check", "fill")}
            for family in families
        ]
        typer.echo(json.dumps(listed, indent=2, default=dict))
    else:
        render.model_table(Console(), families)


@app.command("run")
@command_of(RunFlags, RUN_PANELS)
def run_(flags: RunFlags) -> None:
    """Tune: search the settings with short real runs and recommend a config."""
    # The job's clock starts here: its time aim counts the imports below as the user waits them.
    started = time.monotonic()
    show = progress.for_terminal(
        quiet=flags.quiet, stdout=sys.stdout, stderr=sys.stderr, started=started
    )
    with show:
        # The first line before anything slow (importing torch and Optuna, building the
        # workload, opening the study), so a log shows at once that the run started.
        show.line(
            f"tuning {flags.workload_name} / {flags.preset} on device {flags.device}: loading "
            "PyTorch and Optuna"
        )
        say_overridden(show.line)
        with _stdout_to_stderr() if flags.as_json else contextlib.nullcontext():
            rec, node = _tune(flags.spec(), flags.settings(), flags.gpus, show, started)
    from tuner.evidence import render

    if flags.as_json:
        shown = rec.to_dict() if node is None else rec.to_dict() | {"node": node.to_dict()}
        typer.echo(json.dumps(shown, indent=2))
    else:
        render.recommendation(Console(), rec, storage=flags.storage)
        if node is not None:
            Console().print(node.line(), soft_wrap=True)
    if rec.config is None:
        # No config to train with: a script or CI step must not read this run as a success.
        raise typer.Exit(1)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """What the job's code prints (a factory, a DataLoader worker, a child process) goes to
    stderr, so that `--json`'s stdout is the JSON alone (a factory's print() had made it
    unreadable): at the descriptor too, which children and forked workers share."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _tune(
    spec: JobSpec, settings: dict[str, Any], gpus: str, show: Any, started: float
) -> tuple[Recommendation, NodeSummary | None]:
    """Check the request and the storage, apply a CPU's defaults, run the study (or, with
    `--gpus` above 1, its job on this node's GPUs), end the progress on the recommendation.
    `settings`: `RunOptions`' other fields from the flags, None where the default depends on the
    device (`_cpu_defaults`); `started`: when the command began, the job's clock's start."""
    from tuner.request import run_options
    from tuner.search.study import run_study
    from tuner.store import storage as studies

    unset = {k for k in ("final_rounds", "profile") if settings[k] is None}
    unset |= {"timeout_s"} if spec.timeout_s is None else set()
    given = {k: v for k, v in settings.items() if k not in unset}
    options = run_options(spec, **given)
    url = studies.storage_url(settings["storage"])
    studies.check_sqlite_path(url)
    studies.check_study_name(settings["study"])
    _check_not_a_jobs(url, settings["study"])
    show.line(f"building the workload, then opening the study in {studies.masked(url)}")
    count, devices = _gpus(gpus, spec.device)
    options = _cpu_defaults(options, unset, show)
    if devices is not None:
        from tuner.service.node import run_on_node

        spec = dataclasses.replace(spec, gpus=count)
        rec, node = run_on_node(spec, options, devices, url, show)
        show.finish(rec)
        show.line(node.line())
        return rec, node
    with _terminated_as_interrupted() as poll:
        rec = run_study(options, progress=show, started=started, should_stop=poll)
    show.finish(rec)
    return rec, None


@contextlib.contextmanager
def _terminated_as_interrupted() -> Iterator[Callable[[], bool]]:
    """SIGTERM (`timeout`, `kill`, `docker stop`) ends `run` as Ctrl-C does: the running trial
    failed as interrupted, the resume command printed, exit 130; it had left that trial RUNNING
    for good. Yields the search's `should_stop`: an interrupt raised inside a callback Python
    ignores (a weakref's: "Exception ignored in ...") was lost, and the run went on to exit 0;
    the poll, between trials and after each window, raises it again (probes, 2026-12-07)."""
    signalled = threading.Event()

    def poll() -> bool:
        if signalled.is_set():
            raise KeyboardInterrupt
        return False

    if threading.current_thread() is not threading.main_thread():
        yield poll  # signal handlers belong to the main thread (a test's, an embedding's)
        return

    def interrupt(signum: int, frame: object) -> None:
        signalled.set()
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield poll
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _check_not_a_jobs(url: str, study: str | None) -> None:
    """TunerError naming --study where a service job made that study: trials the CLI added
    there were the job's, yet its row and its /best kept the job's own recommendation, where
    the study's /best and `best` gave another (a user's probe, 2026-12-06)."""
    from tuner.service.node import OWNER
    from tuner.service.tables import service_job_of

    job = None if study is None else service_job_of(url, study, except_owner=OWNER)
    if job is not None:
        raise TunerError(
            f"--study: study {study!r} is service job {job[0]}'s ({job[1]}): its trials and "
            "recommendation are the job's; tune it again as a new job (POST /v1/jobs), or here "
            "under another --study"
        )


def _gpus(gpus: str, device: str) -> tuple[int, NodeDevices | None]:
    """`--gpus` checked against this node (`resolve_gpus`); 1: no devices, run in this process."""
    if gpus.strip() == "1":
        return 1, None
    from tuner.service.node import resolve_gpus

    return resolve_gpus(gpus, device)


def _cpu_defaults(options: RunOptions, unset: set[str], show: Any) -> RunOptions:
    """On a CPU, where not given (`unset`): a search budget of CPU_SEARCH_BUDGET_S,
    CPU_FINAL_ROUNDS final round and no profiles. A CPU run answers whether the workload trains
    under each config and passes the gate, not which is fastest on a GPU, so a long job there
    buys nothing (on a loaded 2-core machine the README's first command had taken 239 s with
    three final rounds and profiles). A GPU's defaults are untouched."""
    import trainers

    if trainers.resolve_device(options.device).type != "cpu":
        return options
    changes: dict[str, Any] = {}
    said: list[str] = []
    if "timeout_s" in unset:
        changes["timeout_s"] = CPU_SEARCH_BUDGET_S
        said.append(f"search budget {CPU_SEARCH_BUDGET_S:.0f} s (--timeout)")
    if "final_rounds" in unset:
        changes["final_rounds"] = CPU_FINAL_ROUNDS
        said.append(f"{CPU_FINAL_ROUNDS} final round (--final-rounds)")
    if "profile" in unset:
        changes["profile"] = "none"
        said.append("no profiles (--profile)")
    if said:
        show.phase(f"on a CPU: {', '.join(said)}; the flags in brackets set others")
    return dataclasses.replace(options, **changes)


@app.command()
def best(study: StudyName, storage: Storage = None, as_json: AsJson = False) -> None:
    """Print a study's recommendation."""
    from tuner.evidence import render
    from tuner.store import storage as studies

    rec = _recommendation(studies.storage_url(storage), study)
    if as_json:
        typer.echo(json.dumps(rec.to_dict(), indent=2))
    else:
        render.recommendation(Console(), rec, storage=storage)
    if rec.config is None:
        raise typer.Exit(1)  # as `run` does: nothing to train with is not a success


@app.command()
def export(
    study: StudyName,
    storage: Storage = None,
    format: Annotated[str, typer.Option("--format", help="json, env or python.")] = "json",
) -> None:
    """Print the recommended config as JSON, environment variables or Python."""
    from tuner.evidence import export as exporting
    from tuner.store import storage as studies

    rec = _recommendation(studies.storage_url(storage), study)
    typer.echo(exporting.export(rec, format))


def _recommendation(url: str, study: str) -> Recommendation:
    """The study's recommendation; for a service job's study without one yet, what its job
    says (`no_recommendation_yet`), not the CLI's advice to run it again, which it refuses."""
    from tuner.evidence import reader
    from tuner.service.node import OWNER
    from tuner.service.tables import no_recommendation_yet, service_job_of

    try:
        return reader.recommendation(url, study)
    except NoRecommendation:
        job = service_job_of(url, study, except_owner=OWNER)
        if job is None:
            raise
        raise NoRecommendation(no_recommendation_yet(study, *job)) from None


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
    say_overridden()
    # The service is the `api` package, a layer above `tuner`: run it as its own program (this
    # process becomes it, so signals and the exit status are the service's) instead of importing it.
    args = [sys.executable, "-m", "api", "--host", host, "--port", str(port)]
    if workers is not None:
        args += ["--workers", str(workers)]
    if no_worker:
        args.append("--no-worker")
    if storage is not None:
        # Through the environment, never the new program's arguments: a process list shows
        # those to every user, and the URL may carry a password.
        os.environ["TUNER_STORAGE"] = storage
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

    say_overridden()
    run_worker(storage=storage, gpu=gpu, job=job)


@app.command()
def report(
    study: StudyName,
    out: Annotated[str, typer.Option("--out", help="The HTML file to write.")] = "report.html",
    storage: Storage = None,
) -> None:
    """Write one self-contained HTML page about a study (plots, recommendation, profiles)."""
    from pathlib import Path

    from tuner.evidence.report import write_report
    from tuner.store import storage as studies

    if not out.strip() or Path(out).is_dir():
        # A folder had raised IsADirectoryError once the report was built; '' was called one.
        what = "a folder" if out.strip() else "an empty path"
        raise TunerError(f"--out: {out!r} is {what}: allowed a file, e.g. --out report.html")
    try:
        path = write_report(studies.storage_url(storage), study, out)
    except OSError as exc:
        raise TunerError(f"--out: cannot write {out!r}: {exc.strerror or exc}") from exc
    typer.echo(str(path))
