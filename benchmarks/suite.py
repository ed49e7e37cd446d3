"""The benchmark suite: the tuner against an exhaustive grid and the CUDA-graph floor, side by side.

    python benchmarks/suite.py --presets transformer:small,convnet:small \
        --matmul-precision high --out docs/benchmarks

Per preset, in one process on one GPU:
1. the grid (`GRID_LEVELS`, every combination) is measured with a short protocol
   (`--grid-warmup` untimed steps, `--grid-windows` x `--grid-window-steps` timed);
2. a default tuning job (`tuner.search.run_study` with its defaults, profiling the baselines and
   the recommendation; `--search-timeout` caps its search) recommends a config; with
   `--repro` a second job with another seed recommends one too;
3. the seven settings (`pytorch-default`, `seed-baseline`, `seed-event10`, `seed-4streams`,
   `grid-best`, `recommended`, and the second job's `recommended-seed1` when there is one) are
   measured `--rounds` times, interleaved, each run with the tuner's protocol from the same
   initial weights; the `graph-floor` (whole step captured, replayed back to back: the GPU's
   own time for the step) is measured once per round too;
4. tuning cost: TPE, random search and the grid, 3 seeds each, replayed over the grid's
   measurements (`replay_search`): how many GPU-seconds each needs to reach a config within 3 %
   of the grid's best.

Writes `suite-<gpu>-<date>[-<tag>].json` (schema in `to_json`'s docstring) after each preset, and
a Markdown twin. `--readme docs/benchmarks/results.md` rewrites the headline table between that
file's `<!-- suite:begin -->` and `<!-- suite:end -->` markers from that JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna

from benchmarks.interleaved import measure_in_round, windows_ms
from benchmarks.run_meta import run_meta
from benchmarks.suite_grid import (
    GRID_NOTE,
    TARGET_FRACTION,
    grid_best,
    grid_configs,
    job_cost,
    measure_grid,
    tuning_cost,
)
from benchmarks.suite_record import gpu_key, merge, to_json, to_markdown, update_readme
from trainers import LoopConfig, RunArgs, fingerprint, resolve_device
from tuner.search.gating.isolated import ParityProcess
from tuner.search.measuring.measure import PRECISIONS, Measurer, Protocol, set_matmul_precision
from tuner.search.measuring.stats import bootstrap_ci, ratio_ci
from tuner.search.options import RunOptions
from tuner.search.study import run_study

# The parts, by responsibility: the grid and the replayed tuning cost (`suite_grid`), the record
# (`suite_record`); this file is the side-by-side comparison, one preset's run and the command
# line.

PINNED = {"pin_memory": True, "non_blocking": True}
FIXED_SETTINGS: dict[str, LoopConfig] = {
    "pytorch-default": LoopConfig(),
    "seed-baseline": LoopConfig(num_streams=2, **PINNED),
    "seed-event10": LoopConfig(num_streams=2, sync_mode="event", sync_interval=10, **PINNED),
    "seed-4streams": LoopConfig(num_streams=4, sync_mode="event", sync_interval=10, **PINNED),
}


def compare(
    measurer: Measurer,
    settings: Mapping[str, LoopConfig],
    *,
    rounds: int,
    log: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """Every setting `rounds` times, interleaved, plus the graph floor once per round."""
    windows: dict[str, list[float]] = {name: [] for name in settings}
    peaks: dict[str, int | None] = {}
    errors: dict[str, str] = {}
    floors: list[float] = []
    for r in range(rounds):
        for name, config in settings.items():
            outcome = measure_in_round(
                measurer, name, config, round_index=r, log=log, errors=errors
            )
            if outcome is None:
                continue
            windows[name] += windows_ms(measurer, outcome)
            peaks[name] = outcome.peak_memory_bytes
        floor = measurer.floor_ms()
        if floor is not None:
            floors.append(floor)
    out: dict[str, dict[str, Any]] = {}
    seed_windows = windows.get("seed-baseline") or []
    floor_ms = statistics.median(floors) if floors else None
    for name, config in settings.items():
        entry: dict[str, Any] = {"config": config.to_dict()}
        if not windows[name]:
            out[name] = entry | {"error": errors.get(name, "not measured")}
            continue
        median = statistics.median(windows[name])
        entry |= {
            "step_ms_median": median,
            "ci95": list(bootstrap_ci(windows[name])),
            "windows_ms": windows[name],
            "floor_ratio": None if floor_ms is None else floor_ms / median,
            "peak_memory_bytes": peaks.get(name),
        }
        if seed_windows:
            ratio, low, high = ratio_ci(seed_windows, windows[name])
            entry |= {"speedup_vs_seed_baseline": ratio, "speedup_ci95": [low, high]}
        out[name] = entry
    if floors:
        out["graph-floor"] = {
            "config": None,
            "step_ms_median": floor_ms,
            "ci95": list(bootstrap_ci(floors)),
            "repeats_ms": floors,
            "floor_ratio": 1.0,
            "peak_memory_bytes": None,
            "speedup_vs_seed_baseline": (
                statistics.median(seed_windows) / floor_ms if seed_windows and floor_ms else None
            ),
        }
    return out


# --------------------------------------------------------------------------------------------
# one preset
# --------------------------------------------------------------------------------------------


def default_job(
    workload: str,
    preset: str,
    *,
    storage: str,
    seed: int,
    device: str,
    precision: str,
    timeout_s: float | None,
) -> tuple[dict[str, Any], optuna.Study]:
    name = f"suite-{workload}-{preset}-seed{seed}"
    started = time.perf_counter()
    rec = run_study(
        RunOptions(
            workload=workload,
            preset=preset,
            storage=storage,
            study=name,
            seed=seed,
            device=device,
            matmul_precision=precision,
            timeout_s=timeout_s,
            profile="baselines",
        )
    ).to_dict()
    study = optuna.load_study(study_name=name, storage=storage)
    summary = {
        "study": name,
        "seed": seed,
        "config": rec.get("config"),
        "source": rec.get("source"),
        "reason": rec.get("reason"),
        "n_trials": rec.get("trial_counts"),
        "gpu_seconds": rec.get("gpu_seconds"),
        "wall_s": time.perf_counter() - started,
        "search_timeout_s": timeout_s,
        "verdicts": rec.get("verdicts"),
        "explanation": rec.get("explanation"),
    }
    return summary, study


def run_preset(
    spec: str, args: argparse.Namespace, storage: str, log: Callable[[str], None]
) -> dict[str, Any]:
    workload, preset = spec.split(":", 1)
    started = time.perf_counter()
    grid_protocol = Protocol(
        warmup=args.grid_warmup, windows=args.grid_windows, window_steps=args.grid_window_steps
    )
    measurer = Measurer(workload, preset, device=args.device, protocol=grid_protocol)
    entries = measure_grid(measurer, grid_configs(cuda=measurer.device.type == "cuda"), log)
    best = grid_best(entries)
    parity = _best_parity(workload, preset, measurer, best, args.matmul_precision)
    jobs, studies = _default_jobs(spec, args, storage, log)
    settings = dict(FIXED_SETTINGS)
    settings["grid-best"] = LoopConfig.from_dict(best["config"])
    for job, name in zip(jobs, ("recommended", "recommended-seed1"), strict=False):
        if job["config"] is not None:
            settings[name] = LoopConfig.from_dict(job["config"])
    measurer.protocol = Protocol()  # the tuner's own protocol from here on
    compared = compare(measurer, settings, rounds=args.rounds, log=log)
    return {
        "workload": workload,
        "preset": preset,
        "settings": compared,
        "grid": {
            "discretisation": GRID_NOTE,
            "size": len(entries),
            "protocol": grid_protocol.to_dict(),
            "best": best,
            "best_parity": parity,
            "gpu_seconds": sum(e["seconds"] for e in entries),
            "entries": entries,
        },
        "jobs": jobs,
        "tuning_cost": tuning_cost(entries, job=job_cost(studies[0], best["step_ms"])),
        "reproducibility": _reproducibility(compared, jobs),
        "rounds": args.rounds,
        "wall_s": time.perf_counter() - started,
    }


def _best_parity(
    workload: str,
    preset: str,
    measurer: Measurer,
    best: Mapping[str, Any],
    matmul_precision: str,
) -> dict[str, Any] | None:
    """The grid's best config through the parity gate, in its own process (GPUs only)."""
    if measurer.device.type != "cuda":
        return None
    checker = ParityProcess(
        workload,
        preset,
        RunArgs(steps=20, seed=0, device=str(measurer.device)),
        matmul_precision=matmul_precision,
    )
    try:
        return checker.check(LoopConfig.from_dict(best["config"])).to_dict()
    finally:
        checker.close()


def _default_jobs(
    spec: str, args: argparse.Namespace, storage: str, log: Callable[[str], None]
) -> tuple[list[dict[str, Any]], list[optuna.Study]]:
    """The default tuning job, and with `--repro` a second one of another seed."""
    workload, preset = spec.split(":", 1)
    jobs = []
    studies = []
    for seed in (0, 1) if spec in args.repro else (0,):
        log(f"default tuning job, seed {seed}")
        summary, study = default_job(
            workload,
            preset,
            storage=storage,
            seed=seed,
            device=args.device,
            precision=args.matmul_precision,
            timeout_s=args.search_timeout.get(spec),
        )
        jobs.append(summary)
        studies.append(study)
    return jobs, studies


def _reproducibility(
    compared: Mapping[str, Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """Whether two jobs of different seeds recommend as fast a loop (None with one job)."""
    if "recommended-seed1" not in compared or "step_ms_median" not in compared["recommended-seed1"]:
        return None
    # Throughput of seed 0's recommendation over seed 1's = seed 1's step time over seed 0's.
    ratio, low, high = ratio_ci(
        compared["recommended-seed1"]["windows_ms"], compared["recommended"]["windows_ms"]
    )
    return {
        "jobs": [{"seed": j["seed"], "config": j["config"]} for j in jobs],
        "throughput_ratio": ratio,
        "ci95": [low, high],
        "note": "throughput of seed 0's recommendation over seed 1's",
        "within_3pct": abs(ratio - 1.0) <= TARGET_FRACTION,
    }


def _parse_caps(text: str) -> dict[str, float]:
    caps = {}
    for item in filter(None, text.split(",")):
        spec, _, seconds = item.rpartition("=")
        caps[spec] = float(seconds)
    return caps


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--presets", default="transformer:small,transformer:medium,transformer:large,convnet:small"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--matmul-precision", choices=PRECISIONS, default="highest")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--grid-warmup", type=int, default=10)
    parser.add_argument("--grid-windows", type=int, default=2)
    parser.add_argument("--grid-window-steps", type=int, default=10)
    parser.add_argument(
        "--search-timeout",
        type=_parse_caps,
        default={},
        help="workload:preset=SECONDS,... caps a default job's search",
    )
    parser.add_argument(
        "--repro",
        default="transformer:small",
        help="presets (comma-separated) that get a second, independent job",
    )
    parser.add_argument("--storage-dir", type=Path, default=None)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="skip measuring: regenerate Markdown/README from this JSON",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="skip measuring: merge the presets of these suite JSON files (one "
        "10-minute run each) into --out/suite-<gpu>-<date>.json",
    )
    parser.add_argument("--readme", type=Path, default=None)
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    args.repro = {s for s in args.repro.split(",") if s}
    if not _rewrite(args):
        _measure(args, argv)


def _rewrite(args: argparse.Namespace) -> bool:
    """`--merge`, `--from-json`: records rewritten without measuring; False when neither was
    asked for."""
    if args.merge is not None:
        data = merge(
            [json.loads(p.read_text(encoding="utf-8")) for p in args.merge],
            [p.name for p in args.merge],
        )
        path = args.out / data["meta"]["file"]
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        if args.readme is not None:
            update_readme(args.readme, data)
        return True
    if args.from_json is not None:
        data = json.loads(args.from_json.read_text(encoding="utf-8"))
        args.from_json.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        if args.readme is not None:
            update_readme(args.readme, data)
        return True
    return False


def _measure(args: argparse.Namespace, argv: Sequence[str] | None) -> None:
    """Every preset, the record written after each (a run cut short keeps what it measured)."""
    set_matmul_precision(args.matmul_precision)
    storage_dir = args.storage_dir or Path(tempfile.mkdtemp(prefix="streamtune-suite-"))
    storage_dir.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{storage_dir / 'suite.db'}"
    device = resolve_device(args.device)
    meta, _ = run_meta(device, "suite.py", sys.argv[1:] if argv is None else argv, args.commit)
    fp = fingerprint(device)
    stem = f"suite-{gpu_key(fp)}-{meta['date']}" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    meta |= {"fingerprint": fp, "matmul_precision": args.matmul_precision, "file": path.name}

    def log(text: str) -> None:
        print(text, flush=True)

    presets: dict[str, Any] = {}
    for spec in filter(None, args.presets.split(",")):
        presets[spec] = run_preset(spec, args, storage, log)
        data = to_json(meta, presets)
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        log(f"wrote {path} ({spec} done in {presets[spec]['wall_s']:.0f} s)")
    if args.readme is not None:
        update_readme(args.readme, to_json(meta, presets))


if __name__ == "__main__":
    main()
