"""One job on N GPUs of a node against the same job on one GPU: wall time, and whether the faster
job recommends as fast a loop.

    STREAMTUNE_COMMIT=$(git rev-parse --short HEAD) python benchmarks/node.py \\
        --presets transformer:medium,hf:causal-lm:llama-1b --precisions bf16-autocast,float8 \\
        --gpus 2 --out docs/benchmarks --tag gpus2

For each preset: the default job (`python -m tuner run ... --json`) with `--gpus N`, then on one
GPU (`entry` says why in that order), each in a fresh SQLite file and a compile cache of its own
(each starts as cold as a user's first job); then both recommendations measured on GPU 0,
interleaved (`--rounds` rounds), and the ratio of the N-GPU job's recommendation to the one-GPU
job's throughput with a 95 % bootstrap CI (`tuner.search.measuring.stats.ratio_ci`). Writes
`node-<gpu>-<date>[-tag].json` (one entry per preset: `preset`, `wall_s_one_gpu`, `wall_s_gpus`,
`gpus`, `ratio_vs_one_gpu`) and its Markdown twin. `--device cpu` with `TUNER_CPU_STANDINS=N` runs
the same logic on CPU worker processes standing in for GPUs (the test of this script; its figures
mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402

import trainers  # noqa: E402
from benchmarks.run_meta import job_parser, provenance, run_meta  # noqa: E402
from trainers import LoopConfig  # noqa: E402
from tuner.search.measuring.measure import Failure, Measurer, Protocol  # noqa: E402
from tuner.search.measuring.stats import ratio_ci  # noqa: E402
from tuner.store import keys  # noqa: E402


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = job_parser(__doc__, presets="transformer:medium", rounds=2)
    parser.add_argument("--gpus", default="2")
    return parser.parse_args(argv)


def job(args: argparse.Namespace, spec: str, gpus: str, scratch: Path) -> dict[str, Any]:
    """One default job in a fresh SQLite file: its wall time (process start to exit, as a user
    waits) and its recommendation (`run --json`)."""
    workload, preset = spec.rsplit(":", 1)
    folder = scratch / f"{preset}-{gpus}"
    folder.mkdir(parents=True)
    command = [
        sys.executable, "-m", "tuner", "run", "--workload", workload, "--preset", preset,
        "--device", args.device, "--storage", f"sqlite:///{folder / 'study.db'}",
        "--gpus", gpus, "--json", *args.job_arg,
    ]  # fmt: skip
    if args.precisions:
        command += ["--precisions", args.precisions]
    # Each job compiles from its own empty cache: neither warms the other's.
    env = {**os.environ, "TUNER_COMPILE_CACHE": str(folder / "compile-cache")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    env.pop("TRITON_CACHE_DIR", None)  # Inductor then keeps Triton's kernels in its own folder
    started = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=args.timeout
    )
    wall = time.perf_counter() - started
    # The job's progress lines, kept beside the record (the scratch folder goes): each trial's
    # GPU and seconds, the budget and patience lines, the phases.
    (args.out / f"node-{preset}-gpus{gpus}.log").write_text(done.stderr)
    keep_workers_logs(done.stderr, args.out / f"node-{preset}-gpus{gpus}-workers")
    if done.returncode != 0:
        raise RuntimeError(
            f"{spec} --gpus {gpus} failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    rec = json.loads(done.stdout)
    # The job's whole answer and its study, kept at once: a machine that goes back before the
    # record is written leaves them (what each phase waited on, which worker took which part).
    (args.out / f"node-{preset}-gpus{gpus}-recommendation.json").write_text(done.stdout)
    shutil.copyfile(folder / "study.db", args.out / f"node-{preset}-gpus{gpus}-study.db")
    sessions = _sessions(f"sqlite:///{folder / 'study.db'}", rec["study"])
    (args.out / f"node-{preset}-gpus{gpus}-sessions.json").write_text(
        json.dumps(sessions, indent=1)
    )
    return {"wall_s": wall, "recommendation": rec}


def keep_workers_logs(stderr: str, to: Path) -> None:
    """The workers' own logs of a `--gpus N` job (the folder its progress names), kept beside the
    record: the 2026-11-28 llama-1b run's finalizer spent 666 s in a stage nothing else timed."""
    found = re.search(r"worker logs in (/\S+?)\)", stderr)
    if found is None or not Path(found.group(1)).is_dir():
        return
    to.mkdir(parents=True, exist_ok=True)
    for log in sorted(Path(found.group(1)).glob("*.log")):
        shutil.copy(log, to / log.name)


def _sessions(storage: str, study: str) -> dict[str, Any]:
    """Each process's phase times on the job's study (`tuner.store.phases`), by session: which
    worker gated, measured and profiled what, and when."""
    attrs = optuna.load_study(study_name=study, storage=storage).user_attrs
    return {k: v for k, v in attrs.items() if k.startswith(keys.TIME_PREFIX)}


def interleaved(
    args: argparse.Namespace,
    workload: str,
    preset: str,
    picks: Mapping[str, Mapping[str, Any]],
    *,
    over: str,
) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Each pick's recommendation (`run --json`) measured on one device, interleaved over
    `args.rounds` rounds (`args.protocol`): each pick's median samples/s, and each other pick's
    throughput over `over`'s with its 95 % CI (no comparison crosses devices)."""
    warmup, windows, steps = (int(x) for x in args.protocol.split(","))
    device = "cuda:0" if args.device == "cuda" else args.device
    # The model the jobs measured: its `--model-arg` options are on each answer (the same).
    model_args = next(iter(picks.values())).get("model_args") or {}
    measurer = Measurer(
        workload,
        preset,
        device=device,
        protocol=Protocol(warmup=warmup, windows=windows, window_steps=steps),
        model_args=dict(model_args),
    )
    samples: dict[str, list[float]] = {name: [] for name in picks}
    for _ in range(args.rounds):
        for name, rec in picks.items():
            config = LoopConfig.from_dict(rec["config"])
            outcome = measurer.measure(config, precision=rec.get("precision"))
            if isinstance(outcome, Failure):
                raise RuntimeError(
                    f"{workload}:{preset}: the {name} config failed: {outcome.reason}"
                )
            samples[name].extend(outcome.throughputs)
    ratios = {}
    for name in picks:
        if name != over:
            ratio, low, high = ratio_ci(samples[name], samples[over])
            ratios[name] = {"ratio": ratio, "ci95": [low, high]}
    return {name: statistics.median(values) for name, values in samples.items()}, ratios


def compare(
    args: argparse.Namespace, spec: str, one: Mapping[str, Any], many: Mapping[str, Any]
) -> dict[str, Any]:
    """Both recommendations on one device, interleaved: the N-GPU job's over the one-GPU job's
    throughput, with its 95 % CI."""
    workload, preset = spec.rsplit(":", 1)
    medians, ratios = interleaved(
        args, workload, preset, {"one_gpu": one, "gpus": many}, over="one_gpu"
    )
    return {"samples_per_s": medians, "ratio_vs_one_gpu": ratios["gpus"]}


_JOB_KEYS = ("time", "search", "trial_counts", "speedup", "reason")


def entry(args: argparse.Namespace, spec: str, scratch: Path) -> dict[str, Any]:
    # The N-GPU job first: a failure on the node shows before the long one-GPU job, and whatever
    # a first job leaves warm on the machine (the driver's JIT cache, the page cache) can only
    # favour the one-GPU job, which the wall ratio then understates.
    many = job(args, spec, args.gpus, scratch)
    one = job(args, spec, "1", scratch)
    node = many["recommendation"].get("node") or {}
    found = compare(args, spec, one["recommendation"], many["recommendation"])
    return {
        "preset": spec,
        "gpus": node.get("gpus"),
        "wall_s_one_gpu": one["wall_s"],
        "wall_s_gpus": many["wall_s"],
        "wall_ratio": many["wall_s"] / one["wall_s"],
        "gpu_seconds": node.get("gpu_seconds"),
        "trials_by_device": node.get("trials_by_device"),
        "final_round_on": node.get("final_round_on"),
        "ratio_vs_one_gpu": found["ratio_vs_one_gpu"],
        "samples_per_s": found["samples_per_s"],
        "recommended": {
            "one_gpu": {k: one["recommendation"].get(k) for k in ("config", "precision")},
            "gpus": {k: many["recommendation"].get(k) for k in ("config", "precision")},
        },
        # Where each job's time went (phases, summed over its workers) and how its search spent
        # its trials: what explains the wall ratio.
        "jobs": {
            name: {k: run["recommendation"].get(k) for k in _JOB_KEYS}
            for name, run in (("one_gpu", one), ("gpus", many))
        },
    }


def markdown(data: Mapping[str, Any]) -> str:
    lines = [
        "# One job on several GPUs of a node against one GPU",
        "",
        provenance(data["meta"]),
        "",
        "| preset | GPUs | wall s, one GPU | wall s, N GPUs | wall ratio | GPU-s | "
        "recommendation's throughput vs the one-GPU job's (95 % CI) |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in data["presets"]:
        r = e["ratio_vs_one_gpu"]
        gpu_s = "-" if e["gpu_seconds"] is None else f"{e['gpu_seconds']:.0f}"
        lines.append(
            f"| {e['preset']} | {e['gpus']} | {e['wall_s_one_gpu']:.0f} | {e['wall_s_gpus']:.0f} "
            f"| {e['wall_ratio']:.2f} | {gpu_s} | {r['ratio']:.3f} "
            f"({r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    meta, stem = run_meta(trainers.resolve_device(args.device), "node.py", argv, args.commit)
    data: dict[str, Any] = {"meta": meta, "presets": []}
    name = f"node-{stem}{f'-{args.tag}' if args.tag else ''}"
    meta["file"] = f"{name}.json"
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="streamtune-node-") as tmp:
        for spec in args.presets.split(","):
            data["presets"].append(entry(args, spec.strip(), Path(tmp)))
            # Written after each preset: a run cut short keeps what it measured.
            (args.out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
            (args.out / f"{name}.md").write_text(markdown(data))
    print(f"wrote {args.out / name}.json")


if __name__ == "__main__":
    main()
