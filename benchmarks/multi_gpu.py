"""Two (or more) GPUs on one job: trials per GPU, wall time against one GPU, and whether the GPUs
measure the same config alike.

    STREAMTUNE_COMMIT=$(git rev-parse --short HEAD) \\
        python benchmarks/multi_gpu.py --out docs/benchmarks

(a) One job (`--workload transformer --preset small`, `--trials` 40) submitted straight into the
job table (`JobStore.create`, no API) of an SQLite file in a temporary directory, and one
`python -m tuner worker --gpu i` per GPU; records the wall time from submission to the end of the
job (final round and profiles included), the trials each GPU ran, and the job's outcome.
(b) With `--single-too` (default): the same job on GPU 0 alone, in a fresh database.
(c) The same two configs (seed-baseline, and the whole-step CUDA graph; on `--device cpu` the
PyTorch default instead) measured on every GPU, `--rounds` times each, interleaved: each GPU's
median throughput and its ratio to GPU 0 with a 95 % bootstrap CI (`tuner.stats.ratio_ci`).
"Agree" means the CI overlaps [1 - tol, 1 + tol] (`--tolerance`, 3 %).

Every wait is capped (`--timeout` per job): a job not done by then is cancelled and reported as
such. Writes `<out>/multi-gpu-<gpu>-<date>.json` and its Markdown twin. `--device cpu
--workers 2` runs the same logic on the CPU (for the test of this script; the figures mean
nothing there).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
# Children find this checkout first, and whatever else this process was given (a --target site).
CHILD_PYTHONPATH = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402
import torch  # noqa: E402

import trainers  # noqa: E402
from trainers import LoopConfig  # noqa: E402
from tuner.search.measuring.measure import (  # noqa: E402
    PRECISIONS,
    Failure,
    Measurer,
    Protocol,
    set_matmul_precision,
)
from tuner.search.measuring.stats import ratio_ci  # noqa: E402
from tuner.search.options import BASELINES  # noqa: E402
from tuner.service.jobstore import FINISHED, JobStore  # noqa: E402
from tuner.service.spec import JobSpec  # noqa: E402
from tuner.store.keys import OWNER as OWNER_ATTR  # noqa: E402

procs_handles: list[subprocess.Popen[bytes]] = []  # every worker started, for stop_all()
GRAPH = LoopConfig(
    cuda_graph=True,
    sync_mode="event",
    sync_interval=10,
    num_streams=2,
    pin_memory=True,
    non_blocking=True,
)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="transformer")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--matmul-precision", choices=PRECISIONS, default="high")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="workers (default: one per visible GPU; required with --device cpu)",
    )
    parser.add_argument("--single-too", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--timeout", type=float, default=150.0, help="cap per job, seconds")
    parser.add_argument("--rounds", type=int, default=3, help="measurements per config and GPU")
    parser.add_argument("--tolerance", type=float, default=0.03)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--window-steps", type=int, default=20)
    parser.add_argument("--parity-steps", type=int, default=20)
    parser.add_argument("--final-rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        parser.error("--device cuda needs at least 2 visible GPUs")
    if args.workers is None:
        if args.device == "cpu":
            parser.error("--workers: give a count with --device cpu")
        args.workers = torch.cuda.device_count()
    return args


def worker_env(args: argparse.Namespace) -> dict[str, str]:
    settings = {
        "MEASURE_WARMUP": args.warmup,
        "MEASURE_WINDOWS": args.windows,
        "MEASURE_WINDOW_STEPS": args.window_steps,
        "PARITY_STEPS": args.parity_steps,
        "FINAL_ROUNDS": args.final_rounds,
        "MATMUL_PRECISION": args.matmul_precision,
        "HEARTBEAT_S": 1,
        "POLL_S": 0.5,
        "LEASE_S": 20,
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    tuner = {f"TUNER_{k}": str(v) for k, v in settings.items()}
    return base | tuner | {"PYTHONPATH": CHILD_PYTHONPATH}


def run_job(args: argparse.Namespace, workers: int, directory: Path) -> dict[str, Any]:
    """One job, `workers` worker processes (worker i on GPU i); its outcome and who ran what."""
    storage = f"sqlite:///{directory}/jobs.db"
    store = JobStore(storage)
    spec = JobSpec(
        workload=args.workload,
        preset=args.preset,
        trials=args.trials,
        device=args.device,
        fix={"num_workers": 0} if args.device == "cpu" else {},
    )
    started = time.monotonic()
    job = store.create(spec, owner="multi-gpu")
    procs, logs = _start_workers(args, workers, directory, storage)
    try:
        row = store.get(job.id)
        while row.status not in FINISHED and time.monotonic() - started < args.timeout:
            time.sleep(0.5)
            row = store.get(job.id)
        wall_s = time.monotonic() - started
        timed_out = row.status not in FINISHED
        if timed_out:
            row = store.cancel(job.id)
    finally:
        stop_all()
        for log in logs:
            log.close()
    try:
        trials = optuna.load_study(study_name=row.study, storage=storage).get_trials(deepcopy=False)
    except KeyError:  # no worker got as far as the study: their logs say why
        trials = []
    per_worker: dict[str, int] = {}
    for name in per_owner_name(trials, procs):
        per_worker[name] = per_worker.get(name, 0) + 1
    rec = row.recommendation or {}
    return {
        "status": row.status,
        "error": row.error,
        "wall_s": wall_s,
        "phases": phases(row, trials, per_owner_name(trials, procs)),
        "timed_out": timed_out,
        "n_trials": {
            "complete": row.n_complete,
            "failed": row.n_failed,
            "pruned": row.n_pruned,
            "in_study": len(trials),
        },
        "trials_per_worker": per_worker,
        "recommended": rec.get("config"),
        "speedup": rec.get("speedup"),
        "worker_log_tails": {} if trials else _log_tails(directory, procs),
    }


def _start_workers(
    args: argparse.Namespace, workers: int, directory: Path, storage: str
) -> tuple[dict[int, str], list[IO[bytes]]]:
    """`python -m tuner worker` processes, each logging to `worker-<i>.log`: their labels by pid
    ('cuda:1#1') and the open logs."""
    procs: dict[int, str] = {}
    logs: list[IO[bytes]] = []
    for index in range(workers):
        command = [sys.executable, "-m", "tuner", "worker", "--storage", storage]
        label = "cpu"
        if args.device == "cuda":
            command += ["--gpu", str(index)]
            label = f"cuda:{index}"
        log = (directory / f"worker-{index}.log").open("wb")
        logs.append(log)
        proc = subprocess.Popen(
            command, cwd=ROOT, env=worker_env(args), stdout=log, stderr=subprocess.STDOUT
        )
        procs[proc.pid] = f"{label}#{index}"
        procs_handles.append(proc)
    return procs, logs


def _log_tails(directory: Path, procs: dict[int, str]) -> dict[str, str]:
    """The end of each worker's log, by its label: why no worker got as far as the study."""
    tails = {}
    for i, procs_label in enumerate(procs.values()):
        text = (directory / f"worker-{i}.log").read_text(encoding="utf-8", errors="replace")
        tails[procs_label] = text[-1500:]
    return tails


def per_owner_name(trials: list[optuna.trial.FrozenTrial], procs: dict[int, str]) -> list[str]:
    """Each trial's worker as this script labelled it ('cuda:1#1'), by the pid in its owner id."""
    names = []
    for trial in trials:
        owner = str(trial.user_attrs.get(OWNER_ATTR, "-"))
        match = re.search(r"-(\d+)-[0-9a-f]+$", owner)
        names.append(procs.get(int(match.group(1)), owner) if match else owner)
    return names


def phases(
    row: Any,
    trials: list[optuna.trial.FrozenTrial],
    owners: list[str],
) -> dict[str, Any]:
    """Where the job's wall time went, from the job row's and the trials' timestamps.

    until_claimed: submission to a worker claiming the job (worker start-up: imports, CUDA).
    until_first_trial: the claim to the first search trial's start (study, baselines).
    search: first trial start to last trial end; busy_fraction: the trials' summed durations
    over search x workers that ran trials. after_search: the last trial to the job's end (the
    final round, its parity checks and profiles, on one worker).
    """
    timed = [
        (t, o)
        for t, o in zip(trials, owners, strict=True)
        if t.datetime_start is not None and t.datetime_complete is not None
    ]
    if not timed or row.started_at is None or row.finished_at is None:
        return {}

    def utc(local: dt.datetime) -> dt.datetime:  # Optuna stores naive local time
        return local.astimezone(dt.UTC).replace(tzinfo=None)

    first = min(utc(t.datetime_start) for t, _ in timed)
    last = max(utc(t.datetime_complete) for t, _ in timed)
    busy: dict[str, float] = {}
    for trial, owner in timed:
        busy[owner] = (
            busy.get(owner, 0.0) + (trial.datetime_complete - trial.datetime_start).total_seconds()
        )
    search_s = (last - first).total_seconds()
    return {
        "until_claimed_s": (row.started_at - row.created_at).total_seconds(),
        "until_first_trial_s": (first - row.started_at).total_seconds(),
        "search_s": search_s,
        "after_search_s": (row.finished_at - last).total_seconds(),
        "trial_s_per_worker": busy,
        "search_busy_fraction": (
            sum(busy.values()) / (search_s * len(busy)) if search_s > 0 else None
        ),
    }


def stop_all() -> None:
    for proc in procs_handles:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs_handles:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    procs_handles.clear()


def agreement(args: argparse.Namespace, devices: list[str]) -> list[dict[str, Any]]:
    """Each config on every device, interleaved; each device against the first one."""
    set_matmul_precision(args.matmul_precision)
    protocol = Protocol(warmup=args.warmup, windows=args.windows, window_steps=args.window_steps)
    second = GRAPH if args.device == "cuda" else BASELINES["pytorch-default"]
    configs = {
        "seed-baseline": BASELINES["seed-baseline"],
        "graph" if args.device == "cuda" else "pytorch-default": second,
    }
    measurers = [Measurer(args.workload, args.preset, device=d, protocol=protocol) for d in devices]
    samples: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for name, config in configs.items():
            for index, measurer in enumerate(measurers):
                outcome = measurer.measure(config)
                if isinstance(outcome, Failure):
                    raise RuntimeError(f"{name} on {devices[index]} failed: {outcome.reason}")
                samples.setdefault((name, index), []).extend(outcome.throughputs)
    rows = []
    for name in configs:
        reference = samples[(name, 0)]
        for index in range(len(devices)):
            ratio, low, high = ratio_ci(samples[(name, index)], reference)
            rows.append(
                {
                    "config": name,
                    "device": devices[index],
                    "median": statistics.median(samples[(name, index)]),
                    "ratio_to_first": ratio,
                    "ci95": [low, high],
                    "agree": low <= 1 + args.tolerance and high >= 1 - args.tolerance,
                }
            )
    return rows


def markdown(result: dict[str, Any]) -> str:
    hw = result["hardware"]
    lines = [
        f"# {result['workers']} workers on one job: {result['workload']} "
        f"{result['preset']}, {result['trials']} trials",
        "",
        f"{hw['gpu'] or 'cpu'}, driver {hw['driver']}, CUDA {hw['cuda']}, torch "
        f"{hw['torch']}; commit {result['commit']}; {result['date']}; matmul precision "
        f"{result['matmul_precision']}.",
        "",
        "| run | status | wall s | counted (complete/failed/pruned) | trials per worker |",
        "|---|---|---|---|---|",
    ]
    for name in ("shared", "single"):
        run = result.get(name)
        if run is None:
            continue
        n = run["n_trials"]
        per = ", ".join(f"{k}: {v}" for k, v in sorted(run["trials_per_worker"].items()))
        lines.append(
            f"| {name} | {run['status']} | {run['wall_s']:.1f} | {n['complete']}/"
            f"{n['failed']}/{n['pruned']} | {per} |"
        )
    lines += _phase_table(result)
    if result.get("single") and result["shared"]["wall_s"]:
        lines += [
            "",
            f"Wall time, one GPU / shared: "
            f"{result['single']['wall_s'] / result['shared']['wall_s']:.2f}x.",
        ]
    if result.get("agreement_error"):
        lines += ["", f"Agreement between the GPUs not measured: {result['agreement_error']}"]
    lines += [
        "",
        "| config | device | median samples/s | ratio to first (95 % CI) | agree |",
        "|---|---|---|---|---|",
    ]
    for row in result["agreement"]:
        low, high = row["ci95"]
        lines.append(
            f"| {row['config']} | {row['device']} | {row['median']:.1f} | "
            f"{row['ratio_to_first']:.3f} ({low:.3f}-{high:.3f}) | {row['agree']} |"
        )
    return "\n".join(lines) + "\n"


def _phase_table(result: dict[str, Any]) -> list[str]:
    """Where each run's wall time went, from the job row's and the trials' timestamps."""
    lines: list[str] = []
    phase_rows = [
        (name, result[name]["phases"])
        for name in ("shared", "single")
        if result.get(name, {}).get("phases")
    ]
    if phase_rows:
        lines += [
            "",
            "Where the wall time went (s; from the job row's and the trials' timestamps):",
            "",
            "| run | until a worker claimed it | until the first trial | search | "
            "trial-s per worker | search busy | after the search (final round) |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, p in phase_rows:
            per = ", ".join(f"{k}: {v:.1f}" for k, v in sorted(p["trial_s_per_worker"].items()))
            frac = p["search_busy_fraction"]
            lines.append(
                f"| {name} | {p['until_claimed_s']:.1f} | "
                f"{p['until_first_trial_s']:.1f} | {p['search_s']:.1f} | {per} | "
                f"{'-' if frac is None else f'{frac:.0%}'} | "
                f"{p['after_search_s']:.1f} |"
            )
    return lines


def main() -> None:
    args = parse()
    devices = (
        [f"cuda:{i}" for i in range(args.workers)]
        if args.device == "cuda"
        else ["cpu"] * args.workers
    )
    fp = trainers.fingerprint(trainers.resolve_device(devices[0]))
    result: dict[str, Any] = {
        "workload": args.workload,
        "preset": args.preset,
        "trials": args.trials,
        "workers": args.workers,
        "matmul_precision": args.matmul_precision,
        "commit": os.environ.get("STREAMTUNE_COMMIT", "unknown"),
        "date": dt.date.today().isoformat(),
        "hardware": fp,
        "command": " ".join(sys.argv),
    }
    with tempfile.TemporaryDirectory(prefix="multi-gpu-") as tmp:
        for name, count, sub in (
            ("shared", args.workers, "shared"),
            ("single", 1 if args.single_too else 0, "single"),
        ):
            if count:
                directory = Path(tmp, sub)
                directory.mkdir()
                result[name] = run_job(args, count, directory)
                print(json.dumps({name: result[name]}), flush=True)
    try:
        result["agreement"] = agreement(args, devices)
    except RuntimeError as exc:  # the jobs' figures stand; say why there is no comparison
        result["agreement"], result["agreement_error"] = [], str(exc)[:2000]
    key = trainers.fingerprint_key(fp)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"multi-gpu-{key}-{result['date']}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    stem.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    print(f"wrote {stem}.json and {stem}.md")
    if "agreement_error" in result:
        raise SystemExit(f"agreement not measured: {result['agreement_error']}")


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_all()
